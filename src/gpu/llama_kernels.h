// Internal: the Llama kernels on the GPU (RMSNorm, rotary embeddings, SwiGLU): bf16 storage,
// fp32 arithmetic. Each has a CPU reference in src/model/llama_kernels.h that tests/gpu
// compares it with. Grouped-query attention is gqa_attention_* in flash_attention.h.
//
// The launch contract is kernels.h's: device pointers, enqueued on `stream`; invalid_argument
// naming the kernel and the bad size before anything is launched; the launch error naming the
// kernel otherwise; every reduction in a fixed order (no atomics), so the same inputs give the
// same bits; bf16 outputs are the fp32 result rounded to nearest even. N = B*T rows; "(N,C)" is
// row-major with C contiguous; "+=" marks an output the kernel adds to.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "gpu/numerics.h"
#include "zinf/status.h"

namespace zinf::gpu {

// HF LlamaRMSNorm: out (N,C) bf16 = weight * (inp * rstd); rstd (N) fp32 = 1 / sqrt(mean(inp^2)
// + eps), saved for backward. One warp per row.
Status rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, const bf16* weight, float eps, int N, int C,
                       cudaStream_t stream);
// dinp (N,C) fp32 +=; dweight (C) fp32 += the column sums of (inp * rstd) * dout, in fp32 in
// row order within chunks of kColumnChunkRows rows, then in chunk order. dout (N,C) bf16.
// scratch: rmsnorm_backward_scratch_floats(N, C) (launch_geometry.h).
Status rmsnorm_backward(float* dinp, float* dweight, float* scratch, const bf16* dout, const bf16* inp,
                        const bf16* weight, const float* rstd, int N, int C, cudaStream_t stream);
// The same when d(out) arrives in parts, one from each product that reads the norm's output
// (Llama: q, k, v after input_layernorm; gate, up after post_attention_layernorm), as
// model::kernels::summed_rmsnorm_backward: dout = (dout0 + dout1) + dout2 element by element in
// fp32, never stored; dout1 and dout2 may be nullptr (then rmsnorm_backward).
Status summed_rmsnorm_backward(float* dinp, float* dweight, float* scratch, const bf16* dout0, const bf16* dout1,
                               const bf16* dout2, const bf16* inp, const bf16* weight, const float* rstd, int N, int C,
                               cudaStream_t stream);

// Rotary embeddings in place on x (B,T,n_heads*head_dim) bf16, HF's rotate_half convention as
// model::kernels::rope_forward: each head's pair (i, i + head_dim/2) at position t is rotated by
// angle[t][i]. cos, sin (table_rows, head_dim/2) fp32 are model::kernels::rope_tables' tables
// (computed on the host and uploaded; table_rows >= T). head_dim even.
Status rope_forward(bf16* x, const float* cos, const float* sin, int table_rows, int B, int T, int n_heads,
                    int head_dim, cudaStream_t stream);
// In place on the gradient: the transpose, a rotation by -angle.
Status rope_backward(bf16* dx, const float* cos, const float* sin, int table_rows, int B, int T, int n_heads,
                     int head_dim, cudaStream_t stream);

// out = silu(gate) * up, n values (numerics.h swiglu).
Status swiglu_forward(bf16* out, const bf16* gate, const bf16* up, std::size_t n, cudaStream_t stream);
// dgate = dout * up * silu'(gate), dup = dout * silu(gate), n values; dgate may alias dout (each
// element is read before it is written, by the same thread); dup aliases nothing.
Status swiglu_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, std::size_t n,
                       cudaStream_t stream);

namespace detail {

// The RoPE kernels' thread-to-element map, shared with a host test: pair `idx` of the
// B*T*n_heads*(head_dim/2) pairs (i fastest, then head, then row) rotates x[lo] and
// x[lo + head_dim/2] by table entry `table` (row t, column i).
struct RopePair {
  std::size_t lo;
  std::size_t table;
};
ZINF_HD RopePair rope_pair(std::size_t idx, int T, int n_heads, int head_dim) {
  const std::size_t half = static_cast<std::size_t>(head_dim / 2);
  const std::size_t i = idx % half;
  const std::size_t r = idx / half;
  const std::size_t h = r % static_cast<std::size_t>(n_heads);
  const std::size_t bt = r / static_cast<std::size_t>(n_heads);
  const std::size_t t = bt % static_cast<std::size_t>(T);
  return RopePair{(bt * static_cast<std::size_t>(n_heads) + h) * static_cast<std::size_t>(head_dim) + i, t * half + i};
}

}  // namespace detail

}  // namespace zinf::gpu
