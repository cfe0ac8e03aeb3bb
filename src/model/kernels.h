// CPU fp32 kernels of the GPT-2 model and their backwards (the structure of llm.c's
// train_gpt2.c); matrix products go through OpenBLAS sgemm.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/attention_products.h"

namespace zinf::model::kernels {

// N = B*T rows throughout. "+=" in a comment means the kernel accumulates into that output.
// Every reduction runs in a fixed order that does not depend on thread count.

// out (B,T,C) = wte[inp[b,t]] (V,C) + wpe[t] (maxT,C)
void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                     int T, int C);
// dwte += scatter of dout by token, dwpe[t] += sum over b of dout[b,t]
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                      int C);

// out (N,C) = (inp - mean) * rstd * weight + bias; mean, rstd (N) saved for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
// dinp (N,C) +=, dweight (C) +=, dbias (C) +=. dinp_bf16 (N,C), when not nullptr: each finished
// row of dinp rounded to bf16 (detail::to_bf16), for the bf16 product that reads it next (its dout).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C, uint16_t* dinp_bf16 = nullptr);

// out (N,OC) = inp (N,C) @ weight^T, weight (OC,C), + bias (OC) when bias != nullptr
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC);
// dinp (N,C) = dout (N,OC) @ weight (overwritten); dweight (OC,C) += dout^T @ inp;
// dbias (OC) += column sums of dout (skipped when dbias == nullptr)
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC);
// Plain triple loop with the same contract as matmul_forward (the tests' reference).
void matmul_forward_reference(float* out, const float* inp, const float* weight, const float* bias,
                              int N, int C, int OC);

// GPT-2's tanh approximation of GELU, elementwise over n values.
void gelu_forward(float* out, const float* inp, size_t n);
// dinp = gelu'(inp) * dout (overwritten; dinp may alias dout)
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);

// out += inp, n values
void residual_add(float* out, const float* inp, size_t n);

// In place: logits (N,V) become probabilities; losses (N) = -log p[target].
void softmax_xent_forward(float* logits_to_probs, float* losses, const int32_t* targets, int N,
                          int V);
// In place: probs (N,V) become dlogits = (probs - onehot(target)) * dloss.
void softmax_xent_backward(float* probs_to_dlogits, const int32_t* targets, float dloss, int N,
                           int V);

// Causal multi-head self-attention over qkv (B,T,3C) laid out [q | k | v], NH heads of C/NH,
// blocked (attention_core.h): no (T,T) matrix, blocks above the diagonal skipped. out (B,T,C);
// lse (B,NH,T) saves each query row's log-sum-exp so backward rebuilds the probabilities block by
// block from Q and K. scratch: attention_scratch_floats(), a few blocks per thread of
// default_thread_pool(), independent of B and T. The bits do not depend on the thread count.
size_t attention_scratch_floats();
// out_bf16 (B,T,C), when not nullptr: out rounded to bf16 (detail::to_bf16), written by each task
// right after its rows of out, for the bf16 product that reads out. `products`: the arithmetic
// of the block products (attention_products.h; the model picks it with attention_products_for).
void attention_forward(float* out, float* lse, const float* qkv, float* scratch, int B, int T,
                       int C, int NH, uint16_t* out_bf16 = nullptr,
                       AttentionProducts products = AttentionProducts::kFp32);
// dqkv (B,T,3C) overwritten, from dout (B,T,C) and forward's out and lse. dqkv_bf16 (B,T,3C),
// when not nullptr: dqkv rounded to bf16 the same way, each head's columns by its task.
// `products` as forward's (the bf16 products round forward's out and dout to bf16 as well).
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, float* scratch, int B, int T, int C, int NH,
                        uint16_t* dqkv_bf16 = nullptr, AttentionProducts products = AttentionProducts::kFp32);
// Direct loops, llm.c's attention_forward with (B,NH,T,T) probabilities (the tests' reference).
void attention_forward_reference(float* out, const float* qkv, int B, int T, int C, int NH);
// Direct loops for the backward: dqkv (B,T,3C) overwritten (the tests' reference).
void attention_backward_reference(float* dqkv, const float* dout, const float* qkv, int B, int T, int C,
                                  int NH);

// The previous kernels, kept as the benchmark's baseline: per (b, h) the full (T,T) scores by
// one sgemm, masked afterwards (twice the necessary flops), same contracts as above except
// scratch: attention_full_scratch_floats(T), and backward does not read out.
size_t attention_full_scratch_floats(int T);
void attention_forward_full(float* out, float* lse, const float* qkv, float* scratch, int B, int T,
                            int C, int NH);
void attention_backward_full(float* dqkv, const float* dout, const float* qkv, const float* lse,
                             float* scratch, int B, int T, int C, int NH);

}  // namespace zinf::model::kernels
