// The tolerances of the GPU attention tests whose products round P (and dS) to bf16 (the GEMM
// and the tensor-core paths; docs/gpu-kernels.md "Tolerances"): out within 2^-7 relative plus
// 1e-2 of its largest value and 5e-3 relative L2; dq, dk, dv each within 1e-2 relative L2 and
// every element within 2^-6 relative plus `floor` (1e-2 of the largest gradient).
#pragma once

#include <vector>

#include "kernel_test_util.h"

namespace zinf::gpu::testing {

inline void expect_close_out(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_TRUE(near_all(got, want, 1.0 / 128, 1e-2));
  EXPECT_LT(rel_l2(got, want), 5e-3);
}

inline void expect_close_grad(const std::vector<float>& got, const std::vector<float>& want, double floor) {
  if (max_abs(want) > 0) {
    EXPECT_LT(rel_l2(got, want), 1e-2);
  }
  EXPECT_TRUE(near_all_floor(got, want, 1.0 / 64, floor));
}

}  // namespace zinf::gpu::testing
