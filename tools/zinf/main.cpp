// zinf: the command-line front end (train, plan, config check, estimate, consolidate, eval).
#include <iostream>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "runtime_env.h"

int main(int argc, char** argv) {
  zinf::cli::tune_runtime_environment(argv);  // may run the process again, once (runtime_env.h)
  CLI::App app{"zinf: ZeRO-3 / ZeRO-Infinity training with parameters and optimizer state on CPU or NVMe"};
  app.require_subcommand(1);
  int exit_code = 0;
  zinf::cli::add_train_command(app, &exit_code);
  zinf::cli::add_estimate_command(app, &exit_code);
  zinf::cli::add_plan_command(app, &exit_code);
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
