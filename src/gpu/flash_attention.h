// Internal: fused causal multi-head self-attention on the GPU that never materialises the
// (T, T) scores (flash-style: online softmax in forward, recomputation from the saved
// log-sum-exp in backward), for GPT (multi-head, packed qkv) and Llama (grouped-query). The CPU
// references are model/kernels.h attention_* and model/llama_kernels.h gqa_attention_*.
// The nets run gemm_attention.h's tensor-core path; these kernels are its fallback where the
// scratch cannot hold one head's (T, T) scores, and its tests' second opinion.
//
// Layout as the CPU kernels: qkv (B,T,3C) is [q | k | v] with NH heads of hs = C/NH, head h at
// columns h*hs of each third; out (B,T,C); lse (B,NH,T) fp32. hs <= 128 (every GPT preset), and
// B * NH <= 65535 (attention_geometry() says why otherwise).
//
// Numerics: bf16 in and out, fp32 scores, softmax and accumulation, expf/logf at full
// precision. Deterministic: no atomics; every sum runs in an order fixed by the shapes.
// Launch contract as kernels.h (device pointers, enqueued on `stream`, Status naming sizes).
#pragma once

#include <cuda_runtime_api.h>

#include "gpu/numerics.h"
#include "zinf/status.h"

namespace zinf::gpu {

// out (B,T,C) bf16, lse (B,NH,T) fp32 (each query row's log-sum-exp of its scaled scores).
Status attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, cudaStream_t stream);

// dqkv (B,T,3C) bf16, overwritten, from dout (B,T,C) and forward's out and lse. scratch:
// attention_backward_scratch_floats(B, T, NH) floats (launch_geometry.h). Three kernels: the
// row sums D = rowsum(dO * O), dK and dV (one block per key tile, walking the query tiles at or
// below the diagonal), and dQ (one block per query tile, walking the key tiles).
Status attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out,
                          const float* lse, int B, int T, int C, int NH, cudaStream_t stream);

// Llama's causal grouped-query attention, as model::kernels::gqa_attention_*: q, out, dq, dout
// (B,T,NH*hs), k, v, dk, dv (B,T,NKV*hs), all dense; query head h reads kv head h / (NH/NKV);
// scores scaled by 1/sqrt(hs); lse (B,NH,T) fp32. NH divisible by NKV, hs <= 128, B * NH <= 65535
// (gqa_attention_geometry() in launch_geometry.h says why otherwise). NKV == NH is multi-head
// attention on separate q, k, v.
struct GqaShape {
  int B, T, NH, NKV, hs;
};
Status gqa_attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const GqaShape& s,
                             cudaStream_t stream);
// dq, dk, dv overwritten from dout and forward's out and lse. A kv head's dk, dv sum its query
// heads in head order, in fp32, and are rounded once. scratch:
// attention_backward_scratch_floats(B, T, NH) floats.
Status gqa_attention_backward(bf16* dq, bf16* dk, bf16* dv, float* scratch, const bf16* dout, const bf16* q,
                              const bf16* k, const bf16* v, const bf16* out, const float* lse, const GqaShape& s,
                              cudaStream_t stream);

}  // namespace zinf::gpu
