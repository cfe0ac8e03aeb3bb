// Internal: the launchers of DeviceOps' CUDA kernels (cuda_ops.h): device pointers, enqueued on
// `stream`, Status naming the kernel and sizes (kernels.h's launch contract).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "zinf/optim/dtype.h"
#include "zinf/status.h"

namespace zinf::gpu {

// acc[i] += in[i] (fp32, each add rounded on its own).
Status launch_add(float* acc, const float* in, std::size_t n, cudaStream_t stream);
// fp32 -> bf16/fp16 (round to nearest even, optim/half.h) or bf16/fp16 -> fp32.
Status launch_convert(void* dst, optim::DType dst_dtype, const void* src, optim::DType src_dtype, std::size_t n,
                      cudaStream_t stream);
// The blocks of optim::grad_stats' sum of squares over x[0, n): norm_blocks(n) block sums into
// scratch[0, blocks), each as optim/kernels_scalar.cpp's sq_norm_loop sums it (8192 elements, 16
// lanes in order, no fused multiply-add), then folded in block order into scratch[blocks].
std::size_t norm_blocks(std::size_t n);
Status launch_sq_norm(const float* x, std::size_t n, double* scratch, cudaStream_t stream);

}  // namespace zinf::gpu
