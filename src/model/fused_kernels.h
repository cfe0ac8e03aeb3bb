// Internal: fused passes over activations. Each kernel does in one pass per row what the models
// did in two or three separate kernels of kernels.h / llama_kernels.h, which stay as the scalar
// references the tests compare against (tests/model/fused_kernels_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace zinf::model::kernels {

// N rows throughout, threads over rows (or columns for the column sums) in chunks that depend
// only on the shape, so the bits do not depend on the thread count. exp is detail::fast_exp
// (vec_math.h, ~1 ulp) where the references call std::exp, and row reductions run over eight
// fixed lanes where the references sum in order: the stated tolerances of the tests come from
// those two differences only. The column sums keep the references' row order exactly.

// Epilogue of the MLP's up-projection. On entry pre (N,OC) holds inp @ weight^T without the bias;
// on exit pre = that + bias (kept: GELU's backward reads it) and out (N,OC) = gelu(pre), GPT-2's
// tanh form. Unfused: matmul_forward with the bias, then gelu_forward.
// out_bf16 (N,OC), when not nullptr: out rounded to bf16 (detail::to_bf16), written row by row
// while the row is in cache, for a bf16 product that reads out (MatmulInput's copy). The same for
// the norms' out_bf16 below.
void bias_gelu_forward(float* pre, float* out, const float* bias, int N, int OC, uint16_t* out_bf16 = nullptr);

// Backward of out = gelu(pre): on entry dpre (N,OC) holds d(out), on exit d(pre);
// dbias (OC) += column sums of d(pre). Unfused: gelu_backward, then matmul_backward's dbias loop.
// dpre_bf16 (N,OC), when not nullptr: d(pre) rounded to bf16, as the forward kernels' copies.
void gelu_backward_bias_grad(float* dpre, float* dbias, const float* pre, int N, int OC,
                             uint16_t* dpre_bf16 = nullptr);

// dbias (OC) += column sums of dout (N,OC), every column summed in row order: bit for bit the
// serial loop `for n: for o: dbias[o] += dout[n][o]`, with columns split over threads.
void bias_grad(float* dbias, const float* dout, int N, int OC);

// The residual stream's add fused into the next norm. When residual != nullptr, x (N,C) +=
// residual first (x then holds the stream, which backward reads); then out (N,C), mean, rstd (N)
// as layernorm_forward. Unfused: residual_add, then layernorm_forward.
void residual_layernorm_forward(float* out, float* mean, float* rstd, float* x, const float* residual,
                                const float* weight, const float* bias, int N, int C, uint16_t* out_bf16 = nullptr);
// The same for Llama: x += residual (when not null), then out, rstd as rmsnorm_forward.
void residual_rmsnorm_forward(float* out, float* rstd, float* x, const float* residual, const float* weight,
                              float eps, int N, int C, uint16_t* out_bf16 = nullptr);

// dst (N,C) = src rounded to bf16 (detail::to_bf16), rows over the pool: the bf16 backend's
// rounding of an input that has no copy, and the models' per-step weight copies.
void round_to_bf16(uint16_t* dst, const float* src, int N, int C);
// The same on the calling thread for a block a producer has just written (rows of ld elements,
// the first cols of each; dst has src's layout): attention's output rows of one head, a chunk of
// SwiGLU's output, a norm's gradient row.
void round_block_to_bf16(uint16_t* dst, const float* src, int rows, int cols, size_t ld);

// RMSNorm's backward when d(out) arrives in parts, one from each product that reads the norm's
// output (Llama: q, k and v after input_layernorm, gate and up after post_attention_layernorm),
// in one pass over the rows. dout = (dout0 + dout1) + dout2 (dout2 may be nullptr), formed
// element by element and never stored; the parts are only read. dinp (N,C) += the input's
// gradient (the residual gradient) with rmsnorm_backward's operations on residual_add's sums, so
// the same bits. dweight (C) += the weight gradient, summed in another order than
// rmsnorm_backward's serial row loop: each chunk of kSummedRmsNormRows rows in row order from
// zero, then the chunks' sums added to dweight in chunk order (the bits do not depend on the
// threads). Unfused: residual_add(dout0, dout1) (and dout2), then rmsnorm_backward, three or four
// passes. dinp and dweight overlap no input. The chunk sums live in a buffer of the calling
// thread, grown to the largest N x C seen and then reused (no allocation in later passes).
inline constexpr int kSummedRmsNormRows = 32;
// dinp_bf16 (N,C), when not nullptr: the finished dinp rounded to bf16 (the gradient the next
// bf16 product reads as its dout), as the forward kernels' copies.
void summed_rmsnorm_backward(float* dinp, float* dweight, const float* dout0, const float* dout1, const float* dout2,
                             const float* inp, const float* weight, const float* rstd, int N, int C,
                             uint16_t* dinp_bf16 = nullptr);

// Training's cross-entropy and its gradient in one pass per row of logits (N,V):
// losses[n] = log-sum-exp(row) - row[target] (the sum of exps in double, as the reference), and
// the row becomes dlogits = (softmax(row) - onehot(target)) * dloss in place. The (N,V) matrix is
// read once and written once; no probability matrix is kept. Unfused: softmax_xent_forward, then
// softmax_xent_backward (two passes over the matrix, with the probabilities in between).
void softmax_xent_fused(float* logits_to_dlogits, float* losses, const int32_t* targets, float dloss, int N,
                        int V);
// Evaluation: the same losses, logits only read.
void softmax_xent_loss(const float* logits, float* losses, const int32_t* targets, int N, int V);

}  // namespace zinf::model::kernels
