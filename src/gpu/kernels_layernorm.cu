// LayerNorm forward and backward on the GPU (one warp per row), and the deterministic column
// sums that give the LayerNorm's and the linear layers' parameter gradients.
#include "gpu/kernel_util.cuh"
#include "gpu/kernels.h"

namespace zinf::gpu {
namespace {

using detail::to_bf16;
using detail::to_f32;
using detail::warp_sum;

constexpr float kLayerNormEps = 1e-5f;
constexpr int kLayerNormThreads = 32 * kLayerNormRowsPerBlock;

// The warp's row, or -1 past the end (the same for all 32 lanes, so a warp leaves as a whole).
__device__ __forceinline__ int warp_row(int N) {
  const int row = static_cast<int>(blockIdx.x) * kLayerNormRowsPerBlock + static_cast<int>(threadIdx.x / 32);
  return row < N ? row : -1;
}

__global__ void layernorm_forward_kernel(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight,
                                         const bf16* bias, int N, int C) {
  const int row = warp_row(N);
  if (row < 0) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const bf16* x = inp + static_cast<std::size_t>(row) * C;
  float sum = 0.0f;
  for (int c = lane; c < C; c += 32) sum += to_f32(x[c]);
  const float m = warp_sum(sum) / static_cast<float>(C);
  float var = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float d = to_f32(x[c]) - m;
    var += d * d;
  }
  const float s = 1.0f / sqrtf(warp_sum(var) / static_cast<float>(C) + kLayerNormEps);
  bf16* o = out + static_cast<std::size_t>(row) * C;
  for (int c = lane; c < C; c += 32) {
    o[c] = to_bf16((s * (to_f32(x[c]) - m)) * to_f32(weight[c]) + to_f32(bias[c]));
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dinp += (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd, dnorm = weight * dout.
__global__ void layernorm_backward_kernel(float* dinp, const bf16* dout, const bf16* inp, const bf16* weight,
                                          const float* mean, const float* rstd, int N, int C) {
  const int row = warp_row(N);
  if (row < 0) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const std::size_t base = static_cast<std::size_t>(row) * C;
  const float m = mean[row];
  const float s = rstd[row];
  float dnorm_sum = 0.0f;
  float dnorm_norm_sum = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float norm = (to_f32(inp[base + c]) - m) * s;
    const float dnorm = to_f32(weight[c]) * to_f32(dout[base + c]);
    dnorm_sum += dnorm;
    dnorm_norm_sum += dnorm * norm;
  }
  const float dnorm_mean = warp_sum(dnorm_sum) / static_cast<float>(C);
  const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / static_cast<float>(C);
  for (int c = lane; c < C; c += 32) {
    const float norm = (to_f32(inp[base + c]) - m) * s;
    const float dnorm = to_f32(weight[c]) * to_f32(dout[base + c]);
    dinp[base + c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

// Rows [chunk * kColumnChunkRows, ...) of one chunk (blockIdx.y), one column per thread.
__device__ __forceinline__ void chunk_rows(int N, int* r0, int* r1) {
  *r0 = static_cast<int>(blockIdx.y) * kColumnChunkRows;
  *r1 = min(N, *r0 + kColumnChunkRows);
}

// partial_w[chunk, c] = sum of norm * dout, partial_b[chunk, c] = sum of dout over the chunk.
__global__ void layernorm_param_partial_kernel(float* partial_w, float* partial_b, const bf16* dout, const bf16* inp,
                                               const float* mean, const float* rstd, int N, int C) {
  const int c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C) return;
  int r0, r1;
  chunk_rows(N, &r0, &r1);
  float aw = 0.0f;
  float ab = 0.0f;
  for (int r = r0; r < r1; r++) {
    const std::size_t i = static_cast<std::size_t>(r) * C + c;
    const float dy = to_f32(dout[i]);
    ab += dy;
    aw += ((to_f32(inp[i]) - mean[r]) * rstd[r]) * dy;
  }
  const std::size_t out = static_cast<std::size_t>(blockIdx.y) * C + c;
  partial_w[out] = aw;
  partial_b[out] = ab;
}

template <typename T>
__global__ void column_partial_kernel(float* partial, const T* x, int N, int C, int ld) {
  const int c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C) return;
  int r0, r1;
  chunk_rows(N, &r0, &r1);
  float acc = 0.0f;
  for (int r = r0; r < r1; r++) acc += to_f32(x[static_cast<std::size_t>(r) * ld + c]);
  partial[static_cast<std::size_t>(blockIdx.y) * C + c] = acc;
}

// out[c] += the chunks' partial sums in chunk order.
__global__ void column_finish_kernel(float* out, const float* partial, int chunks, int C) {
  const int c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C) return;
  float acc = 0.0f;
  for (int k = 0; k < chunks; k++) acc += partial[static_cast<std::size_t>(k) * C + c];
  out[c] += acc;
}

unsigned column_blocks(int C) { return static_cast<unsigned>((C + kThreads - 1) / kThreads); }

Status finish_columns(float* out, const float* partial, int chunks, int C, cudaStream_t stream, const char* what,
                      int N) {
  column_finish_kernel<<<column_blocks(C), kThreads, 0, stream>>>(out, partial, chunks, C);
  return launched(what, {Dim{"N", N}, Dim{"C", C}});
}

template <typename T>
Status column_sum_add_impl(float* out, float* scratch, const T* x, int N, int C, int ld, cudaStream_t stream) {
  ZINF_RETURN_IF_ERROR(check_column_sum_shape(N, C, "column_sum_add"));
  const auto dims = {Dim{"N", N}, Dim{"C", C}, Dim{"ld", ld}};
  if (ld < C) return bad_sizes("column_sum_add", dims, "ld must be >= C");
  const int chunks = column_chunks(N);
  const dim3 grid(column_blocks(C), static_cast<unsigned>(chunks));
  column_partial_kernel<T><<<grid, kThreads, 0, stream>>>(scratch, x, N, C, ld);
  ZINF_RETURN_IF_ERROR(launched("column_sum_add (partial sums)", dims));
  return finish_columns(out, scratch, chunks, C, stream, "column_sum_add (chunk sums)", N);
}

}  // namespace

Status layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight, const bf16* bias,
                         int N, int C, cudaStream_t stream) {
  const auto dims = {Dim{"N", N}, Dim{"C", C}};
  if (N < 1 || C < 1) return bad_sizes("layernorm_forward", dims, "N and C must be >= 1");
  const unsigned blocks = static_cast<unsigned>((N + kLayerNormRowsPerBlock - 1) / kLayerNormRowsPerBlock);
  layernorm_forward_kernel<<<blocks, kLayerNormThreads, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
  return launched("layernorm_forward", dims);
}

Status layernorm_backward(float* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout,
                          const bf16* inp, const bf16* weight, const float* mean, const float* rstd, int N, int C,
                          cudaStream_t stream) {
  ZINF_RETURN_IF_ERROR(check_column_sum_shape(N, C, "layernorm_backward"));
  const auto dims = {Dim{"N", N}, Dim{"C", C}};
  const unsigned blocks = static_cast<unsigned>((N + kLayerNormRowsPerBlock - 1) / kLayerNormRowsPerBlock);
  layernorm_backward_kernel<<<blocks, kLayerNormThreads, 0, stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
  ZINF_RETURN_IF_ERROR(launched("layernorm_backward (dinp)", dims));
  const int chunks = column_chunks(N);
  float* partial_w = scratch;
  float* partial_b = scratch + column_sum_scratch_floats(N, C);
  const dim3 grid(column_blocks(C), static_cast<unsigned>(chunks));
  layernorm_param_partial_kernel<<<grid, kThreads, 0, stream>>>(partial_w, partial_b, dout, inp, mean, rstd, N, C);
  ZINF_RETURN_IF_ERROR(launched("layernorm_backward (partial sums)", dims));
  ZINF_RETURN_IF_ERROR(finish_columns(dweight, partial_w, chunks, C, stream, "layernorm_backward (dweight)", N));
  return finish_columns(dbias, partial_b, chunks, C, stream, "layernorm_backward (dbias)", N);
}

Status column_sum_add(float* out, float* scratch, const float* x, int N, int C, int ld, cudaStream_t stream) {
  return column_sum_add_impl(out, scratch, x, N, C, ld, stream);
}

Status column_sum_add(float* out, float* scratch, const bf16* x, int N, int C, int ld, cudaStream_t stream) {
  return column_sum_add_impl(out, scratch, x, N, C, ld, stream);
}

}  // namespace zinf::gpu
