// Which instruction set the optimizer kernels use, and how a call is spread over threads.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

#include "zinf/status.h"

namespace zinf {
class ThreadPool;
}

namespace zinf::optim {

// Every path gives bit-identical results; they differ only in speed.
enum class KernelIsa {
  kScalar,  // plain C++ loops, the reference the vector paths are tested against
  kAvx2,    // AVX2 + F16C (x86-64)
  kAvx512,  // AVX-512 F/BW/VL/DQ (x86-64)
};

std::string_view isa_name(KernelIsa isa);  // "scalar", "avx2", "avx512"
Result<KernelIsa> parse_isa(std::string_view name);

// True when this build has the path and the CPU (and OS) can run it. kScalar is always true.
bool isa_supported(KernelIsa isa);

// The fastest supported path.
KernelIsa best_isa();

// The path used when a call does not choose one: best_isa(), unless the environment variable
// ZINF_OPTIM_ISA=scalar|avx2|avx512 names another supported one (read once; an unknown or
// unsupported name is logged once and ignored).
KernelIsa active_isa();

// How one kernel call runs. The defaults suit training; tests and benchmarks override them.
struct ExecOptions {
  ThreadPool* pool = nullptr;      // nullptr: default_thread_pool()
  std::optional<KernelIsa> isa;    // unset: active_isa(); a set but unsupported one is an error
  // A call is cut into at most pool->threads() pieces of at least this many elements, so
  // arrays shorter than twice this run on the calling thread alone. Results do not depend on it.
  std::size_t min_elements_per_thread = 32768;
};

}  // namespace zinf::optim
