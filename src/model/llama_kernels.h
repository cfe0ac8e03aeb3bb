// CPU fp32 kernels of the Llama model (RMSNorm, rotary embeddings, SwiGLU, grouped-query causal
// attention, the token embedding) and their backwards. Matrix products are kernels.h's
// matmul_forward/matmul_backward with bias == nullptr.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "model/attention_products.h"

namespace zinf::model::kernels {

// N = B*T rows throughout. "+=" in a comment means the kernel accumulates into that output.
// Every reduction runs in a fixed order that does not depend on thread count.

// out (N,C) = table[tokens[n]] (V,C)
void embedding_forward(float* out, const int32_t* tokens, const float* table, size_t N, int C);
// dtable += scatter of dout (N,C) by token, in row order
void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, size_t N, int C);

// HF LlamaRMSNorm: out (N,C) = weight * (inp * rstd), rstd (N) = 1 / sqrt(mean(inp^2) + eps),
// saved for backward.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, float eps, int N, int C);
// dinp (N,C) +=, dweight (C) +=. dinp_bf16 (N,C), when not nullptr: each finished row of dinp
// rounded to bf16 (detail::to_bf16), for the bf16 product that reads it next.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C, uint16_t* dinp_bf16 = nullptr);

// cos, sin (max_seq, head_dim/2): angle t * theta^(-2i/head_dim), computed in double and
// rounded once (HF computes the angle in fp32; see docs/model.md for the difference).
void rope_tables(float* cos, float* sin, int max_seq, int head_dim, double theta);
// The same for any frequencies (RoPE scaling: rope_frequencies() in llama.h): angle t * inv_freq[i],
// cos and sin multiplied by attention_factor (YaRN's; 1 otherwise), in double, rounded once.
// The tables are (max_seq, inv_freq.size()).
void rope_tables(float* cos, float* sin, int max_seq, std::span<const double> inv_freq, double attention_factor);
// In place on x (B,T,n_heads*head_dim): HF's rotate_half convention, each head's pair
// (i, i + head_dim/2) at position t rotated by angle[t][i]:
//   x[i] <- x[i] cos - x[i + hd/2] sin,  x[i + hd/2] <- x[i + hd/2] cos + x[i] sin.
void rope_forward(float* x, const float* cos, const float* sin, int B, int T, int n_heads, int head_dim);
// In place on the gradient: the transpose, a rotation by -angle. dx_bf16 (B,T,n_heads*head_dim),
// when not nullptr: the rotated dx rounded to bf16 (detail::to_bf16), row by row, for the bf16
// product that reads it.
void rope_backward(float* dx, const float* cos, const float* sin, int B, int T, int n_heads, int head_dim,
                   uint16_t* dx_bf16 = nullptr);

// out = silu(gate) * up, silu(g) = g * sigmoid(g); n values each. out_bf16 (n), when not nullptr:
// out rounded to bf16 (detail::to_bf16), chunk by chunk while it is in cache.
void swiglu_forward(float* out, const float* gate, const float* up, size_t n, uint16_t* out_bf16 = nullptr);
// dgate, dup (n) overwritten from dout; dgate may alias dout.
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, size_t n);

// Causal grouped-query self-attention. q (B,T,NH*hs), k and v (B,T,NKV*hs); query head h uses
// kv head h / (NH/NKV); scores scaled by 1/sqrt(hs). out (B,T,NH*hs); lse (B,NH,T) keeps each
// query row's log-sum-exp, from which backward rebuilds the probabilities block by block (the
// blocked core of kernels.h's attention, attention_core.h). scratch: gqa_attention_scratch_floats(),
// independent of B and T. The bits do not depend on the thread count.
struct GqaShape {
  int B, T, NH, NKV, hs;
};
size_t gqa_attention_scratch_floats();
// out_bf16 (B,T,NH*hs), when not nullptr: out rounded to bf16, as attention_forward's (kernels.h).
// `products`: the block products' arithmetic, as attention_forward's.
void gqa_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, float* scratch,
                           const GqaShape& s, uint16_t* out_bf16 = nullptr,
                           AttentionProducts products = AttentionProducts::kFp32);
// dq (B,T,NH*hs), dk and dv (B,T,NKV*hs) overwritten from dout (B,T,NH*hs) and forward's out
// and lse; a kv head's gradient sums its query heads in head order. dv_bf16 (B,T,NKV*hs), when
// not nullptr: dv rounded to bf16, each kv head's columns by its task once they are summed (dq
// and dk pass through RoPE before a product reads them: rope_backward writes theirs).
void gqa_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                            const float* v, const float* out, const float* lse, float* scratch, const GqaShape& s,
                            uint16_t* dv_bf16 = nullptr, AttentionProducts products = AttentionProducts::kFp32);
// Direct loops over (b, t, h) with the explicit softmax (the tests' reference).
void gqa_attention_forward_reference(float* out, const float* q, const float* k, const float* v, const GqaShape& s);
// Direct loops for the backward, same contract as gqa_attention_backward (the tests' reference).
void gqa_attention_backward_reference(float* dq, float* dk, float* dv, const float* dout, const float* q,
                                      const float* k, const float* v, const GqaShape& s);

}  // namespace zinf::model::kernels
