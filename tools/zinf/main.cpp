// zinf: the command-line front end (train, config check, estimate, consolidate).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include <CLI/CLI.hpp>

#include "commands.h"

namespace {

// oneDNN (the bf16 products) runs on libgomp's OpenMP threads, which by default spin for a while
// after every parallel region and so take the cores from zinf's own thread pool (the row kernels,
// attention) between products: OMP_WAIT_POLICY=passive made a GPT `small` bf16 step 1.51 -> 1.23 s
// on 2 cores (docs/benchmarks.md). libgomp reads the variable once, when it loads, before main();
// so when the user has chosen no policy and an OpenMP runtime is in the process, zinf sets passive
// and runs itself again, once (same pid, same arguments). OMP_WAIT_POLICY=active keeps spinning.
void prefer_passive_openmp_waits(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (dlsym(RTLD_DEFAULT, "omp_get_max_threads") == nullptr) return;  // built without oneDNN: no OpenMP
  if (setenv("OMP_WAIT_POLICY", "passive", 0) != 0) return;
  execv("/proc/self/exe", argv);  // returns only when it failed: go on with libgomp's default
}

}  // namespace

int main(int argc, char** argv) {
  prefer_passive_openmp_waits(argv);
  CLI::App app{"zinf: ZeRO-3 / ZeRO-Infinity training with parameters and optimizer state on CPU or NVMe"};
  app.require_subcommand(1);
  int exit_code = 0;
  zinf::cli::add_train_command(app, &exit_code);
  zinf::cli::add_estimate_command(app, &exit_code);
  zinf::cli::add_consolidate_command(app, &exit_code);
  zinf::cli::add_eval_command(app, &exit_code);
  zinf::cli::add_config_command(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    // Usage errors exit 2, like a bad config; --help exits 0.
    return rc == 0 ? 0 : 2;
  }
  return exit_code;
}
