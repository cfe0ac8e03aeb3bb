// Internal: CUDA runtime and cuBLAS errors as zinf Status, naming what was being done (the
// kernel, copy or call, with its sizes) and CUDA's own name and text for the error.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <string_view>

#include "common/cuda_last_error.h"
#include "zinf/status.h"

namespace zinf::gpu {

// OK for cudaSuccess; otherwise kInternal ("<what>: cudaErrorX: text"), or kResourceExhausted
// for cudaErrorMemoryAllocation, or kUnsupported when no usable device or driver is present.
Status cuda_status(cudaError_t err, std::string_view what);
Status cublas_status(cublasStatus_t err, std::string_view what);

// The error of the last kernel launch on this thread (cudaGetLastError), as a Status.
Status last_launch_status(std::string_view kernel);

// After a CUDA failure the caller tolerates: common/cuda_last_error.h's rule.
inline void forget_error(cudaError_t err) { forget_cuda_error(err); }

}  // namespace zinf::gpu

// Returns a Status from the enclosing function when the CUDA call fails. `what` is evaluated
// only on failure, so it may format.
#define ZINF_CUDA_RETURN_IF_ERROR(call, what)                                     \
  do {                                                                            \
    const cudaError_t zinf_cuda_err_ = (call);                                    \
    if (zinf_cuda_err_ != cudaSuccess) return ::zinf::gpu::cuda_status(zinf_cuda_err_, (what)); \
  } while (0)
