// Elementwise GPU kernels: GELU forward and backward, residual add, bf16 <-> fp32 casts.
#include "gpu/kernel_util.cuh"
#include "gpu/kernels.h"

namespace zinf::gpu {
namespace {

using detail::grid_start;
using detail::grid_stride;
using detail::to_bf16;
using detail::to_f32;

__global__ void gelu_forward_kernel(bf16* out, const bf16* inp, std::size_t n) {
  for (std::size_t i = grid_start(); i < n; i += grid_stride()) out[i] = to_bf16(gelu_tanh(to_f32(inp[i])));
}

// dinp may alias dout: each element is read before it is written, by the same thread.
__global__ void gelu_backward_kernel(bf16* dinp, const bf16* inp, const bf16* dout, std::size_t n) {
  for (std::size_t i = grid_start(); i < n; i += grid_stride()) {
    dinp[i] = to_bf16(gelu_tanh_grad(to_f32(inp[i])) * to_f32(dout[i]));
  }
}

__global__ void residual_forward_kernel(bf16* out, const bf16* a, const bf16* b, std::size_t n) {
  for (std::size_t i = grid_start(); i < n; i += grid_stride()) out[i] = to_bf16(to_f32(a[i]) + to_f32(b[i]));
}

__global__ void cast_to_bf16_kernel(bf16* out, const float* in, std::size_t n) {
  for (std::size_t i = grid_start(); i < n; i += grid_stride()) out[i] = to_bf16(in[i]);
}

__global__ void cast_to_f32_kernel(float* out, const bf16* in, std::size_t n) {
  for (std::size_t i = grid_start(); i < n; i += grid_stride()) out[i] = to_f32(in[i]);
}

}  // namespace

// n == 0 launches nothing (a grid of 0 blocks is a launch error).
Status gelu_forward(bf16* out, const bf16* inp, std::size_t n, cudaStream_t stream) {
  if (n == 0) return Status::ok();
  gelu_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(out, inp, n);
  return launched("gelu_forward", {Dim{"n", static_cast<long long>(n)}});
}

Status gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, std::size_t n, cudaStream_t stream) {
  if (n == 0) return Status::ok();
  gelu_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dinp, inp, dout, n);
  return launched("gelu_backward", {Dim{"n", static_cast<long long>(n)}});
}

Status residual_forward(bf16* out, const bf16* a, const bf16* b, std::size_t n, cudaStream_t stream) {
  if (n == 0) return Status::ok();
  residual_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(out, a, b, n);
  return launched("residual_forward", {Dim{"n", static_cast<long long>(n)}});
}

Status cast_to_bf16(bf16* out, const float* in, std::size_t n, cudaStream_t stream) {
  if (n == 0) return Status::ok();
  cast_to_bf16_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(out, in, n);
  return launched("cast_to_bf16", {Dim{"n", static_cast<long long>(n)}});
}

Status cast_to_f32(float* out, const bf16* in, std::size_t n, cudaStream_t stream) {
  if (n == 0) return Status::ok();
  cast_to_f32_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(out, in, n);
  return launched("cast_to_f32", {Dim{"n", static_cast<long long>(n)}});
}

}  // namespace zinf::gpu
