// Start-up settings of OpenMP and OpenBLAS through the environment, and the one re-run they take.
#include "runtime_env.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <string_view>

#include "zinf/log.h"

namespace zinf::cli {
namespace {

// The marker the re-run process finds: what was set and why, for its notice.
constexpr const char* kMarker = "ZINF_TUNED_ENV";

bool has_env(const char* name) { return std::getenv(name) != nullptr; }

// OpenBLAS's name for its kernel set (DYNAMIC_ARCH builds), or empty without OpenBLAS.
std::string openblas_core() {
  using CoreName = char* (*)();
  auto fn = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  const char* name = fn != nullptr ? fn() : nullptr;
  return name != nullptr ? name : "";
}

// The kernel set to ask OpenBLAS for, or nullptr to leave its choice: only when it chose one of
// the pre-AVX2 cores on a CPU with AVX-512 (SkylakeX's kernels) or AVX2 + FMA (Haswell's).
const char* better_openblas_core(std::string_view core) {
  static constexpr std::string_view kGeneric[] = {"Prescott", "Katmai", "Coppermine", "Northwood", "Banias",
                                                  "Core2",    "Penryn", "Dunnington", "Nehalem",   "Atom",
                                                  "Sandybridge"};
  bool generic = false;
  for (std::string_view g : kGeneric) generic = generic || core == g;
  if (!generic) return nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512cd")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

}  // namespace

void tune_runtime_environment(char** argv) {
  if (const char* done = std::getenv(kMarker); done != nullptr) {
    log(LogLevel::kNotice, std::string("runtime: set by zinf before start-up: ") + done);
    unsetenv(kMarker);  // not inherited by anything this process starts
    return;
  }
  std::string what;
  if (!has_env("OMP_WAIT_POLICY") && !has_env("GOMP_SPINCOUNT") &&
      dlsym(RTLD_DEFAULT, "omp_get_max_threads") != nullptr) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    what += "OMP_WAIT_POLICY=passive (OpenMP threads sleep between products instead of spinning)";
  }
  if (!has_env("OPENBLAS_CORETYPE")) {
    const std::string core = openblas_core();
    if (const char* better = better_openblas_core(core); better != nullptr) {
      setenv("OPENBLAS_CORETYPE", better, 1);
      what += std::string(what.empty() ? "" : "; ") + "OPENBLAS_CORETYPE=" + better + " (OpenBLAS took this CPU for " +
              core + ")";
    }
  }
  // OpenBLAS's own threads wait by sched_yield for 2^28 cycles (~0.1 s) after every threaded
  // product, in the way of the pool's row kernels and attention: 4 (2^4 cycles, its minimum) lets
  // them sleep at once. fp32 GPT `small` step 0.80 -> 0.70 s on 2 cores.
  if (!has_env("OPENBLAS_THREAD_TIMEOUT") && dlsym(RTLD_DEFAULT, "openblas_get_corename") != nullptr) {
    setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1);
    what += std::string(what.empty() ? "" : "; ") + "OPENBLAS_THREAD_TIMEOUT=4 (OpenBLAS threads sleep between products)";
  }
  if (what.empty()) return;
  what += "; set a variable to choose otherwise";
  setenv(kMarker, what.c_str(), 1);
  execv("/proc/self/exe", argv);
  unsetenv(kMarker);  // execv failed: go on with the libraries' defaults, which are already loaded
}

}  // namespace zinf::cli
