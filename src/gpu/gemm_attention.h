// Internal: the attention calls the nets make, for GPT (packed qkv) and Llama (grouped-query).
// Same tensors, layouts, lse contract and limits as flash_attention.h's attention_* and
// gqa_attention_*; the CPU references are model/kernels.h attention_* and model/llama_kernels.h
// gqa_attention_*.
//
// Which kernels run (tc_attention.h attention_path_for(); ZINF_ATTENTION=tc|gemm|flash|auto):
// the fused tensor-core kernels of tc_attention.h where they support the call (head sizes that
// are multiples of 16 up to 128, 16-byte aligned tensors, compute capability 8.0+; they need no
// scratch but the backward's D, B*NH*T floats at its start); otherwise the GEMM path below:
// causal attention on tensor-core products (cuBLASLt strided-batched GEMMs through Blas) with
// the (T, T) scores materialised in a bounded scratch, which itself falls back to the flash
// kernels (see below).
//
// How (plan: gemm_attention_plan(), launch_geometry.h):
//  - q, k, v (and in the backward dout) are copied head-major, so that a kv group's query heads
//    (a unit of them) stack into one matrix whose rows are ordered (t, head), and every product
//    is one strided-batched GEMM over the kv groups of a chunk (bf16 in, fp32 accumulation).
//  - Causal skipping by time blocks (at most 256 positions): block [t0, t1) only meets keys
//    [0, t1), so its products are (t1 - t0) * heads rows against t1 keys; blocks run from the
//    last down. GPT-2 at T = 1024 does 62.5% of the full (T, T) products' work.
//  - forward, per (chunk, unit, block): S = Q K^T (fp32), a warp-per-row kernel (causal mask,
//    scale 1/sqrt(hs), fp32 softmax; writes lse and bf16 P = exp(S*scale - lse)), O = P V.
//  - backward, per (chunk, unit, block): S = Q K^T, dP = dO V^T (fp32), a warp-per-row kernel
//    recomputing P from lse and dS = P * (dP - D) (D = rowsum(dO * O)), then dQ = scale * dS K,
//    dK += scale * dS^T Q, dV += P^T dO (fp32, summed over units and blocks in a fixed order,
//    rounded once at the copy back).
//  With the nets' scratch (gemm_attention_scratch_bytes: a score region of at most 512 MiB) a
//  GPT-2 124M layer at B = 8, T = 1024 runs 4 blocks with all 96 heads in one call each:
//  forward 8 GEMMs + 4 softmax launches, backward 20 GEMMs + 4 score-gradient launches, plus
//  the head-major copies (forward 4 launches, backward 7) and D.
// Numerics: P and dS are rounded to bf16 as the products' inputs (as flash attention 2 does);
// everything else fp32. Deterministic: no atomics; cuBLASLt's algorithm is fixed per shape.
//
// Fallback: when `scratch` cannot hold one row of scores (S, dP fp32, P, dS bf16: 12 bytes per
// key) next to the head-major copies, the flash kernels run instead (they need only D, B*NH*T
// floats, at the start of the scratch). The nets' scratch has room for T up to about 44 million.
// The flash kernels also run (redoing the whole call, with a notice once per process) when
// cuBLASLt has no algorithm for one of the products (unsupported).
// scratch.base must be 256-byte aligned.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "gpu/blas.h"
#include "gpu/flash_attention.h"
#include "gpu/launch_geometry.h"
#include "gpu/numerics.h"
#include "zinf/status.h"

namespace zinf::gpu {

// Device memory the calls may overwrite; see gemm_attention_scratch_bytes() (launch_geometry.h).
struct AttentionScratch {
  void* base = nullptr;
  std::size_t bytes = 0;
};

// As attention_forward / attention_backward (flash_attention.h): qkv (B,T,3C), out (B,T,C),
// lse (B,NH,T), dqkv (B,T,3C) overwritten.
Status gemm_attention_forward(Blas& blas, AttentionScratch scratch, bf16* out, float* lse, const bf16* qkv, int B,
                              int T, int C, int NH, cudaStream_t stream);
Status gemm_attention_backward(Blas& blas, AttentionScratch scratch, bf16* dqkv, const bf16* dout, const bf16* qkv,
                               const bf16* out, const float* lse, int B, int T, int C, int NH, cudaStream_t stream);

// As gqa_attention_forward / gqa_attention_backward.
Status gemm_gqa_attention_forward(Blas& blas, AttentionScratch scratch, bf16* out, float* lse, const bf16* q,
                                  const bf16* k, const bf16* v, const GqaShape& s, cudaStream_t stream);
Status gemm_gqa_attention_backward(Blas& blas, AttentionScratch scratch, bf16* dq, bf16* dk, bf16* dv,
                                   const bf16* dout, const bf16* q, const bf16* k, const bf16* v, const bf16* out,
                                   const float* lse, const GqaShape& s, cudaStream_t stream);

// ---- internal: the products, exposed for the host tests (tests/gpu/kernel_math_test.cpp) ------
namespace gemm_attn {

float score_scale(int hs);  // 1/sqrt(hs), as the CPU kernels
// A notice, once per process, that a product had no cuBLASLt algorithm (`why`); counted.
void notice_flash_fallback(const Status& why);
// How many calls fell back that way in this process (the tests require 0).
long long flash_fallbacks();

// One batched product: the `groups` kv groups from g0, unit `unit` of each (its query heads
// unit * heads_per_unit .. + heads_per_unit - 1 within the group), query positions [t0, t1)
// against keys [0, t1). accumulate: dK, dV add to what earlier (unit, block) products left
// (every product but the group's first, which is unit 0's last block: it covers all keys).
struct Batch {
  int g0, groups, unit, t0, t1;
  bool accumulate;
};
// The blocks are walked from the last (t1 = T) down, units in head order.
Batch batch_for(const GemmAttentionPlan& p, int g0, int unit, int block);
// Element offsets of the first row of (group g, unit u, position t0) in the head-major
// query-side copies (q, out / dout, dq), and of group g in the kv-side copies (k, v, dk, dv);
// batch strides.
std::size_t q_rows0(const GemmAttentionPlan& p, int g, int unit, int t0);
std::size_t kv_rows0(const GemmAttentionPlan& p, int g);
long long q_stride(const GemmAttentionPlan& p);
long long kv_stride(const GemmAttentionPlan& p);
long long block_rows(const Batch& b, const GemmAttentionPlan& p);  // (t1 - t0) * heads_per_unit
// Per group: block_rows rows of ld_t, packed, so launch row R of a row kernel is row R.
long long score_stride(const Batch& b, const GemmAttentionPlan& p);

// Row-major scores d (rows, t1) fp32, ld_t, one per group of the batch (from the start of d) =
// X (rows, hs) @ Y (t1, hs)^T: S = Q K^T (x = q copy, y = k copy) and dP = dO V^T.
Gemm scores_gemm(const GemmAttentionPlan& p, const Batch& b, float* d, const bf16* x, const bf16* y, const char* what);
// Query-side rows out (rows, hs) bf16 = alpha * W (rows, t1) @ Y (t1, hs), W bf16 scores from the
// start of w: O = P V and dQ = scale * dS K.
Gemm rows_gemm(const GemmAttentionPlan& p, const Batch& b, bf16* out, const bf16* w, const bf16* y, float alpha,
               const char* what);
// kv-side out (t1, hs) fp32 (+)= alpha * W^T @ X (rows, hs): dK = scale * dS^T Q, dV = P^T dO,
// summed over the group's units and blocks.
Gemm keys_gemm(const GemmAttentionPlan& p, const Batch& b, float* out, const bf16* w, const bf16* x, float alpha,
               const char* what);

}  // namespace gemm_attn
}  // namespace zinf::gpu
