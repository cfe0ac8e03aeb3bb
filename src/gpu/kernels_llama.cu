// Llama's kernels on the GPU: RMSNorm forward and backward (one warp per row, the weight
// gradient as deterministic column sums), rotary embeddings and SwiGLU (elementwise).
#include <string>

#include "gpu/kernel_util.cuh"
#include "gpu/llama_kernels.h"

namespace zinf::gpu {
namespace {

using detail::grid_start;
using detail::grid_stride;
using detail::to_bf16;
using detail::to_f32;
using detail::warp_sum;

constexpr int kRmsNormRowsPerBlock = kLayerNormRowsPerBlock;
constexpr int kRmsNormThreads = 32 * kRmsNormRowsPerBlock;

// The warp's row, or -1 past the end (the same for all 32 lanes, so a warp leaves as a whole).
__device__ __forceinline__ int warp_row(int N) {
  const int row = static_cast<int>(blockIdx.x) * kRmsNormRowsPerBlock + static_cast<int>(threadIdx.x / 32);
  return row < N ? row : -1;
}

unsigned row_blocks(int N) { return static_cast<unsigned>((N + kRmsNormRowsPerBlock - 1) / kRmsNormRowsPerBlock); }

__global__ void rmsnorm_forward_kernel(bf16* out, float* rstd, const bf16* inp, const bf16* weight, float eps, int N,
                                       int C) {
  const int row = warp_row(N);
  if (row < 0) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const bf16* x = inp + static_cast<std::size_t>(row) * C;
  float ss = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float v = to_f32(x[c]);
    ss += v * v;
  }
  const float s = div_rn(1.0f, sqrt_rn(div_rn(warp_sum(ss), static_cast<float>(C)) + eps));
  bf16* o = out + static_cast<std::size_t>(row) * C;
  for (int c = lane; c < C; c += 32) o[c] = to_bf16(to_f32(weight[c]) * (to_f32(x[c]) * s));  // HF: weight * normed
  if (lane == 0) rstd[row] = s;
}

// The gradient of the norm's output at element i: dout0 alone, or (dout0 + dout1) + dout2 when
// it arrives in parts (dout1, dout2 may be nullptr), in fp32 as the CPU's summed_rmsnorm_backward.
__device__ __forceinline__ float dout_at(const bf16* dout0, const bf16* dout1, const bf16* dout2, std::size_t i) {
  float d = to_f32(dout0[i]);
  if (dout1 != nullptr) d += to_f32(dout1[i]);
  if (dout2 != nullptr) d += to_f32(dout2[i]);
  return d;
}

// dinp += (dnorm - norm * mean(dnorm * norm)) * rstd with norm = inp * rstd, dnorm = weight * dout.
__global__ void rmsnorm_backward_kernel(float* dinp, const bf16* dout0, const bf16* dout1, const bf16* dout2,
                                        const bf16* inp, const bf16* weight, const float* rstd, int N, int C) {
  const int row = warp_row(N);
  if (row < 0) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const std::size_t base = static_cast<std::size_t>(row) * C;
  const float s = rstd[row];
  float dot = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float dnorm = to_f32(weight[c]) * dout_at(dout0, dout1, dout2, base + c);
    dot += dnorm * (to_f32(inp[base + c]) * s);
  }
  const float dot_mean = warp_sum(dot) / static_cast<float>(C);
  for (int c = lane; c < C; c += 32) {
    const float norm = to_f32(inp[base + c]) * s;
    const float dnorm = to_f32(weight[c]) * dout_at(dout0, dout1, dout2, base + c);
    dinp[base + c] += (dnorm - norm * dot_mean) * s;
  }
}

// partial[chunk, c] = sum of (inp * rstd) * dout over the chunk's rows (blockIdx.y), in row
// order; one column per thread.
__global__ void rmsnorm_weight_partial_kernel(float* partial, const bf16* dout0, const bf16* dout1, const bf16* dout2,
                                              const bf16* inp, const float* rstd, int N, int C) {
  const int c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C) return;
  const int r0 = static_cast<int>(blockIdx.y) * kColumnChunkRows;
  const int r1 = min(N, r0 + kColumnChunkRows);
  float acc = 0.0f;
  for (int r = r0; r < r1; r++) {
    const std::size_t i = static_cast<std::size_t>(r) * C + c;
    acc += (to_f32(inp[i]) * rstd[r]) * dout_at(dout0, dout1, dout2, i);
  }
  partial[static_cast<std::size_t>(blockIdx.y) * C + c] = acc;
}

// dweight[c] += the chunks' partial sums in chunk order.
__global__ void rmsnorm_weight_finish_kernel(float* dweight, const float* partial, int chunks, int C) {
  const int c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C) return;
  float acc = 0.0f;
  for (int k = 0; k < chunks; k++) acc += partial[static_cast<std::size_t>(k) * C + c];
  dweight[c] += acc;
}

// One thread per pair (detail::rope_pair); in place, each pair read and written by one thread.
// sign: 1 forward, -1 backward (the CPU's sign * sin, exact).
__global__ void rope_kernel(bf16* x, const float* cos, const float* sin, int T, int n_heads, int head_dim,
                            std::size_t pairs, float sign) {
  const std::size_t half = static_cast<std::size_t>(head_dim / 2);
  for (std::size_t idx = grid_start(); idx < pairs; idx += grid_stride()) {
    const detail::RopePair p = detail::rope_pair(idx, T, n_heads, head_dim);
    const RotatedPair r = rope_rotate(to_f32(x[p.lo]), to_f32(x[p.lo + half]), cos[p.table], sign * sin[p.table]);
    x[p.lo] = to_bf16(r.lo);
    x[p.lo + half] = to_bf16(r.hi);
  }
}

__global__ void swiglu_forward_kernel(bf16* out, const bf16* gate, const bf16* up, std::size_t n) {
  for (std::size_t i = grid_start(); i < n; i += grid_stride()) {
    out[i] = to_bf16(swiglu(to_f32(gate[i]), to_f32(up[i])));
  }
}

__global__ void swiglu_backward_kernel(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up,
                                       std::size_t n) {
  for (std::size_t i = grid_start(); i < n; i += grid_stride()) {
    const float g = to_f32(gate[i]);
    const float u = to_f32(up[i]);
    const float d = to_f32(dout[i]);
    dup[i] = to_bf16(swiglu_dup(g, d));
    dgate[i] = to_bf16(swiglu_dgate(g, u, d));
  }
}

// `name` is the public function the errors name.
Status rmsnorm_backward_impl(const std::string& name, float* dinp, float* dweight, float* scratch, const bf16* dout0,
                             const bf16* dout1, const bf16* dout2, const bf16* inp, const bf16* weight,
                             const float* rstd, int N, int C, cudaStream_t stream) {
  ZINF_RETURN_IF_ERROR(check_column_sum_shape(N, C, name));
  const auto dims = {Dim{"N", N}, Dim{"C", C}};
  rmsnorm_backward_kernel<<<row_blocks(N), kRmsNormThreads, 0, stream>>>(dinp, dout0, dout1, dout2, inp, weight, rstd,
                                                                          N, C);
  ZINF_RETURN_IF_ERROR(launched((name + " (dinp)").c_str(), dims));
  const int chunks = column_chunks(N);
  const unsigned col_blocks = static_cast<unsigned>((C + kThreads - 1) / kThreads);
  rmsnorm_weight_partial_kernel<<<dim3(col_blocks, static_cast<unsigned>(chunks)), kThreads, 0, stream>>>(
      scratch, dout0, dout1, dout2, inp, rstd, N, C);
  ZINF_RETURN_IF_ERROR(launched((name + " (partial sums)").c_str(), dims));
  rmsnorm_weight_finish_kernel<<<col_blocks, kThreads, 0, stream>>>(dweight, scratch, chunks, C);
  return launched((name + " (dweight)").c_str(), dims);
}

Status rope_launch(const char* name, bf16* x, const float* cos, const float* sin, int table_rows, int B, int T,
                   int n_heads, int head_dim, float sign, cudaStream_t stream) {
  const auto dims = {Dim{"B", B}, Dim{"T", T}, Dim{"n_heads", n_heads}, Dim{"head_dim", head_dim},
                     Dim{"table_rows", table_rows}};
  if (B < 1 || T < 1 || n_heads < 1 || head_dim < 2) {
    return bad_sizes(name, dims, "B, T and n_heads must be >= 1 and head_dim >= 2");
  }
  if (head_dim % 2 != 0) return bad_sizes(name, dims, "head_dim must be even");
  if (T > table_rows) return bad_sizes(name, dims, "the tables must hold T rows");
  const std::size_t pairs = static_cast<std::size_t>(B) * static_cast<std::size_t>(T) *
                            static_cast<std::size_t>(n_heads) * static_cast<std::size_t>(head_dim / 2);
  rope_kernel<<<grid_for(pairs, kThreads), kThreads, 0, stream>>>(x, cos, sin, T, n_heads, head_dim, pairs, sign);
  return launched(name, dims);
}

}  // namespace

Status rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, const bf16* weight, float eps, int N, int C,
                       cudaStream_t stream) {
  const auto dims = {Dim{"N", N}, Dim{"C", C}};
  if (N < 1 || C < 1) return bad_sizes("rmsnorm_forward", dims, "N and C must be >= 1");
  rmsnorm_forward_kernel<<<row_blocks(N), kRmsNormThreads, 0, stream>>>(out, rstd, inp, weight, eps, N, C);
  return launched("rmsnorm_forward", dims);
}

Status summed_rmsnorm_backward(float* dinp, float* dweight, float* scratch, const bf16* dout0, const bf16* dout1,
                               const bf16* dout2, const bf16* inp, const bf16* weight, const float* rstd, int N, int C,
                               cudaStream_t stream) {
  return rmsnorm_backward_impl("summed_rmsnorm_backward", dinp, dweight, scratch, dout0, dout1, dout2, inp, weight,
                               rstd, N, C, stream);
}

Status rmsnorm_backward(float* dinp, float* dweight, float* scratch, const bf16* dout, const bf16* inp,
                        const bf16* weight, const float* rstd, int N, int C, cudaStream_t stream) {
  return rmsnorm_backward_impl("rmsnorm_backward", dinp, dweight, scratch, dout, nullptr, nullptr, inp, weight, rstd, N,
                               C, stream);
}

Status rope_forward(bf16* x, const float* cos, const float* sin, int table_rows, int B, int T, int n_heads,
                    int head_dim, cudaStream_t stream) {
  return rope_launch("rope_forward", x, cos, sin, table_rows, B, T, n_heads, head_dim, 1.0f, stream);
}

Status rope_backward(bf16* dx, const float* cos, const float* sin, int table_rows, int B, int T, int n_heads,
                     int head_dim, cudaStream_t stream) {
  return rope_launch("rope_backward", dx, cos, sin, table_rows, B, T, n_heads, head_dim, -1.0f, stream);
}

// n == 0 launches nothing (a grid of 0 blocks is a launch error).
Status swiglu_forward(bf16* out, const bf16* gate, const bf16* up, std::size_t n, cudaStream_t stream) {
  if (n == 0) return Status::ok();
  swiglu_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(out, gate, up, n);
  return launched("swiglu_forward", {Dim{"n", static_cast<long long>(n)}});
}

Status swiglu_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, std::size_t n,
                       cudaStream_t stream) {
  if (n == 0) return Status::ok();
  swiglu_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dgate, dup, dout, gate, up, n);
  return launched("swiglu_backward", {Dim{"n", static_cast<long long>(n)}});
}

}  // namespace zinf::gpu
