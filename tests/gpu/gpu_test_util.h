// GPU tests: skip with the reason when this machine has no usable CUDA device.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>

namespace zinf::gpu::testing {

// Empty when a device is usable; otherwise why not (CUDA's own words).
inline std::string why_no_gpu() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return std::string("no usable CUDA device: ") + cudaGetErrorString(err);
  if (count == 0) return "no CUDA device on this machine";
  return "";
}

}  // namespace zinf::gpu::testing

#define ZINF_REQUIRE_GPU()                                                        \
  do {                                                                            \
    const std::string zinf_why_ = ::zinf::gpu::testing::why_no_gpu();             \
    if (!zinf_why_.empty()) GTEST_SKIP() << zinf_why_;                            \
  } while (0)
