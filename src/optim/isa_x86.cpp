// x86-64: the AVX2 and AVX-512 kernel tables, offered when the CPU and the OS support them.
#include <cpuid.h>

#include "optim/kernels.h"
#include "zinf/optim/isa.h"

namespace zinf::optim::detail {

namespace {

// F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports has no "f16c".
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}

// __builtin_cpu_supports also checks that the OS saves the vector registers (XGETBV); F16C
// uses the same registers as AVX.
bool cpu_has_avx2() { return __builtin_cpu_supports("avx2") && cpu_has_f16c(); }

bool cpu_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

}  // namespace

const KernelTable* kernels_for(KernelIsa isa) {
  static const bool avx2 = cpu_has_avx2();
  static const bool avx512 = cpu_has_avx512();
  switch (isa) {
    case KernelIsa::kScalar: return &scalar_kernels();
    case KernelIsa::kAvx2: return avx2 ? &avx2_kernels() : nullptr;
    case KernelIsa::kAvx512: return avx512 ? &avx512_kernels() : nullptr;
  }
  return nullptr;
}

}  // namespace zinf::optim::detail
