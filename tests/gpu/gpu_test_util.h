// GPU tests: skip with the reason when this machine has no usable CUDA device, unless
// ZINF_EXPECT_GPU=1 says one must be there (scripts/gpu-check sets it on a GPU machine, where a
// loader or driver problem must fail every GPU test rather than let it "pass" as skipped).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "common/cuda_last_error.h"

namespace zinf::gpu::testing {

// Empty when a device is usable; otherwise why not (CUDA's own words).
inline std::string why_no_gpu() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    forget_cuda_error(err);  // tolerated: not a later launch's error
    return std::string("no usable CUDA device: ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
  }
  if (count == 0) return "no CUDA device on this machine";
  return "";
}

// ZINF_EXPECT_GPU=1: a GPU must be present; its absence fails the test instead of skipping it.
inline bool gpu_expected() {
  const char* v = std::getenv("ZINF_EXPECT_GPU");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// Sets an environment variable for its lifetime (the fake libcufile's knobs), then unsets it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) { ::setenv(name, value.c_str(), 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

}  // namespace zinf::gpu::testing

// The test needs a GPU: skips naming CUDA's reason without one, or fails under ZINF_EXPECT_GPU=1.
#define ZINF_REQUIRE_GPU()                                                                      \
  do {                                                                                          \
    const std::string zinf_why_ = ::zinf::gpu::testing::why_no_gpu();                           \
    if (!zinf_why_.empty()) {                                                                   \
      if (::zinf::gpu::testing::gpu_expected()) FAIL() << "ZINF_EXPECT_GPU=1, but " << zinf_why_; \
      GTEST_SKIP() << zinf_why_;                                                                \
    }                                                                                           \
  } while (0)

// The test checks behaviour without a GPU: skips where one is present. Such tests live in suites
// named *WithoutGpu, which scripts/gpu-check leaves out on a GPU machine (so that any SKIPPED
// there is a real failure to run).
#define ZINF_REQUIRE_NO_GPU()                                                                   \
  do {                                                                                          \
    if (::zinf::gpu::testing::why_no_gpu().empty())                                             \
      GTEST_SKIP() << "a GPU is present; this test is for machines without one";                \
  } while (0)
