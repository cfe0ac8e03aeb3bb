#include "gpu/cuda_error.h"

#include <fmt/format.h>

namespace zinf::gpu {

Status cuda_status(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return Status::ok();
  std::string message = fmt::format("{}: {}: {}", what, cudaGetErrorName(err), cudaGetErrorString(err));
  switch (err) {
    case cudaErrorMemoryAllocation:
      return Status::resource_exhausted(std::move(message));
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNotSupported:
      return Status::unsupported(std::move(message));
    default:
      return Status::internal(std::move(message));
  }
}

Status cublas_status(cublasStatus_t err, std::string_view what) {
  if (err == CUBLAS_STATUS_SUCCESS) return Status::ok();
  std::string message = fmt::format("{}: cuBLAS status {} ({})", what, static_cast<int>(err),
                                    cublasGetStatusString(err));
  if (err == CUBLAS_STATUS_ALLOC_FAILED) return Status::resource_exhausted(std::move(message));
  if (err == CUBLAS_STATUS_NOT_SUPPORTED || err == CUBLAS_STATUS_ARCH_MISMATCH) {
    return Status::unsupported(std::move(message));
  }
  return Status::internal(std::move(message));
}

Status last_launch_status(std::string_view kernel) {
  return cuda_status(cudaGetLastError(), fmt::format("launch of {}", kernel));
}

}  // namespace zinf::gpu
