// CUDA errors become Status values that say what was being done; no device needed.
#include "gpu/cuda_error.h"

#include <gtest/gtest.h>

#include "gpu_test_util.h"

namespace zinf::gpu {
namespace {

TEST(CudaError, SuccessIsOk) {
  EXPECT_TRUE(cuda_status(cudaSuccess, "anything").is_ok());
  EXPECT_TRUE(cublas_status(CUBLAS_STATUS_SUCCESS, "anything").is_ok());
}

TEST(CudaError, NamesWhatAndTheCudaError) {
  const Status st = cuda_status(cudaErrorInvalidValue, "H2D copy of 4096 bytes");
  EXPECT_EQ(st.code(), ErrorCode::kInternal);
  EXPECT_NE(st.message().find("H2D copy of 4096 bytes"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("cudaErrorInvalidValue"), std::string::npos) << st.message();
}

TEST(CudaError, OutOfMemoryAndNoDeviceHaveTheirOwnCodes) {
  EXPECT_EQ(cuda_status(cudaErrorMemoryAllocation, "cudaMalloc of 1 GiB").code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(cuda_status(cudaErrorNoDevice, "probe").code(), ErrorCode::kUnsupported);
  EXPECT_EQ(cublas_status(CUBLAS_STATUS_ALLOC_FAILED, "handle").code(), ErrorCode::kResourceExhausted);
  const Status st = cublas_status(CUBLAS_STATUS_INVALID_VALUE, "matmul 64x64x64");
  EXPECT_EQ(st.code(), ErrorCode::kInternal);
  EXPECT_NE(st.message().find("matmul 64x64x64"), std::string::npos) << st.message();
}

TEST(CudaErrorWithoutGpu, ReasonNamesCuda) {
  ZINF_REQUIRE_NO_GPU();
  const std::string why = testing::why_no_gpu();
  EXPECT_NE(why.find("CUDA"), std::string::npos) << why;
}

// A tolerated failure is cleared, and only while it is still the last error. Needs a GPU: without
// a driver every call returns cudaErrorInsufficientDriver, which no call clears.
TEST(CudaError, ForgetErrorClearsOnlyThatError) {
  ZINF_REQUIRE_GPU();
  const cudaError_t err = cudaMemcpy(nullptr, nullptr, 1, static_cast<cudaMemcpyKind>(12345));
  ASSERT_NE(err, cudaSuccess);
  forget_error(cudaErrorInvalidDevice);  // another error: the last one stays
  EXPECT_EQ(cudaPeekAtLastError(), err);
  forget_error(err);
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  EXPECT_TRUE(last_launch_status("the next kernel").is_ok());
}

}  // namespace
}  // namespace zinf::gpu
