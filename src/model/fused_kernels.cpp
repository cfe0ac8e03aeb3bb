// Fused passes over activations: bias + GELU, GELU' + bias gradient, residual + LayerNorm /
// RMSNorm, RMSNorm's backward of a summed gradient, softmax + cross-entropy + its gradient.
// Built with -fno-trapping-math so that the loops around fast_exp vectorise (see
// src/model/meson.build); plain IEEE operations otherwise.
#include "model/fused_kernels.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "model/bf16.h"
#include "model/parallel.h"
#include "model/vec_math.h"

namespace zinf::model::kernels {

using kernels::detail::fast_exp;
using kernels::detail::lane_dot;
using kernels::detail::lane_max;
using kernels::detail::lane_sum;
using model::detail::parallel_for;
using model::detail::row_grain;

namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;
// Column sums keep at most this many accumulators per pass over the rows (4 KiB, in L1).
constexpr size_t kMaxSlice = 1024;

// The operations of kernels.cpp's gelu_forward / gelu_backward in the same order, with
// fast_exp in the tanh: tanh(u) = 1 - 2 / (e^(2u) + 1).
inline float tanh_fast(float u) { return 1.0f - 2.0f / (fast_exp(2.0f * u) + 1.0f); }

inline float gelu(float x) {
  const float cube = kGeluCubic * x * x * x;
  return 0.5f * x * (1.0f + tanh_fast(kGeluScale * (x + cube)));
}

inline float gelu_grad(float x) {
  const float cube = kGeluCubic * x * x * x;
  const float t = tanh_fast(kGeluScale * (x + cube));
  const float sech2 = 1.0f - t * t;
  return 0.5f * (1.0f + t) + x * 0.5f * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
}

// Sum of exp(x[j] - shift) over eight fixed lanes in double; with kStore each x[j] is replaced by
// its exp (in place: no aliasing check stops the vectoriser). Loss-only and fused training passes
// share it, so their losses agree bit for bit.
template <bool kStore>
inline double exp_sum_double(std::conditional_t<kStore, float*, const float*> x, float shift, int n) {
  double acc[8] = {};
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int u = 0; u < 8; u++) {
      const float v = fast_exp(x[j + u] - shift);
      if constexpr (kStore) x[j + u] = v;
      acc[u] += v;
    }
  }
  for (int u = 0; j < n; j++, u++) {
    const float v = fast_exp(x[j] - shift);
    if constexpr (kStore) x[j] = v;
    acc[u] += v;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Calls fn(col_begin, col_end) over column slices of at most kMaxSlice columns of an (N, OC)
// matrix, one slice per thread (column_slice_grain): fn sums its columns over all rows in row
// order, so the split does not change the bits.
template <typename Fn>
void for_column_slices(int N, int OC, size_t work_per_element, Fn&& fn) {
  const size_t width = std::min(kMaxSlice, model::detail::column_slice_grain(static_cast<size_t>(OC)));
  parallel_for(static_cast<size_t>(OC), width, static_cast<size_t>(N) * work_per_element,
               [&](size_t begin, size_t end) {
                 for (size_t c = begin; c < end; c += kMaxSlice) fn(c, std::min(end, c + kMaxSlice));
               });
}

// The row loops below are compiled for AVX-512, AVX2 and the x86-64 baseline, and one of them is
// picked when the library loads (GCC's target_clones). -ffp-contract=off keeps fused multiply-add
// out of all three and the lanes fix the order of every sum, so the three give the same bits;
// the wider clones are what make the GELU loops fast (figure: docs/benchmarks.md, "Figures
// behind choices in the code").
#if !defined(ZINF_ROW_CLONES) && defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define ZINF_ROW_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef ZINF_ROW_CLONES
#define ZINF_ROW_CLONES
#endif

// A row's bf16 copy, right after the row was written (still in L1). Integer operations only, so
// every clone gives the same bits.
[[gnu::always_inline]] inline void round_row(uint16_t* dst, const float* src, int n) {
  for (int i = 0; i < n; i++) dst[i] = model::detail::to_bf16(src[i]);
}

ZINF_ROW_CLONES void bias_gelu_rows(float* pre, float* out, uint16_t* out_bf16, const float* bias, int OC,
                                    size_t begin, size_t end) {
  for (size_t n = begin; n < end; n++) {
    float* p = pre + n * OC;  // (OC)
    float* o = out + n * OC;  // (OC)
    for (int i = 0; i < OC; i++) {
      const float x = p[i] + bias[i];
      p[i] = x;
      o[i] = gelu(x);
    }
    if (out_bf16 != nullptr) round_row(out_bf16 + n * OC, o, OC);
  }
}

ZINF_ROW_CLONES void round_rows(uint16_t* dst, const float* src, int cols, size_t ld, size_t begin, size_t end) {
  for (size_t n = begin; n < end; n++) round_row(dst + n * ld, src + n * ld, cols);
}

// Columns [c0, c1) (at most kMaxSlice) of all N rows, each column in row order.
ZINF_ROW_CLONES void gelu_grad_bias_columns(float* dpre, uint16_t* dpre_bf16, float* dbias, const float* pre, int N,
                                            int OC, size_t c0, size_t c1) {
  float acc[kMaxSlice];
  const size_t w = c1 - c0;
  for (size_t i = 0; i < w; i++) acc[i] = dbias[c0 + i];
  for (int n = 0; n < N; n++) {
    const size_t at = static_cast<size_t>(n) * OC + c0;
    const float* x = pre + at;
    float* d = dpre + at;
    for (size_t i = 0; i < w; i++) {
      const float g = gelu_grad(x[i]) * d[i];
      d[i] = g;
      acc[i] += g;
    }
    if (dpre_bf16 != nullptr) round_row(dpre_bf16 + at, d, static_cast<int>(w));
  }
  for (size_t i = 0; i < w; i++) dbias[c0 + i] = acc[i];
}

ZINF_ROW_CLONES void residual_layernorm_rows(float* out, uint16_t* out_bf16, float* mean, float* rstd, float* x,
                                             const float* residual, const float* weight, const float* bias, int C,
                                             size_t begin, size_t end) {
  const float eps = 1e-5f;
  const float c = static_cast<float>(C);
  for (size_t n = begin; n < end; n++) {
    float* xn = x + n * C;  // (C)
    if (residual != nullptr) {
      const float* r = residual + n * C;
      for (int i = 0; i < C; i++) xn[i] += r[i];
    }
    const float m = lane_sum(xn, C) / c;
    float* o = out + n * C;  // (C): (x - m) first, then the normalised row
    for (int i = 0; i < C; i++) o[i] = xn[i] - m;
    const float s = 1.0f / std::sqrt(lane_dot(o, o, C) / c + eps);
    for (int i = 0; i < C; i++) o[i] = (s * o[i]) * weight[i] + bias[i];
    if (out_bf16 != nullptr) round_row(out_bf16 + n * C, o, C);
    mean[n] = m;
    rstd[n] = s;
  }
}

ZINF_ROW_CLONES void residual_rmsnorm_rows(float* out, uint16_t* out_bf16, float* rstd, float* x, const float* residual,
                                           const float* weight, float eps, int C, size_t begin, size_t end) {
  for (size_t n = begin; n < end; n++) {
    float* xn = x + n * C;  // (C)
    if (residual != nullptr) {
      const float* r = residual + n * C;
      for (int i = 0; i < C; i++) xn[i] += r[i];
    }
    const float s = 1.0f / std::sqrt(lane_dot(xn, xn, C) / static_cast<float>(C) + eps);
    float* o = out + n * C;
    for (int i = 0; i < C; i++) o[i] = weight[i] * (xn[i] * s);  // HF's order
    if (out_bf16 != nullptr) round_row(out_bf16 + n * C, o, C);
    rstd[n] = s;
  }
}

// Element i of a summed gradient: (d0 + d1) + d2, the order of residual_add applied part by part.
template <bool kThree>
[[gnu::always_inline]] inline float part_sum(const float* d0, const float* d1, const float* d2, size_t i) {
  const float s = d0[i] + d1[i];
  if constexpr (kThree) {
    return s + d2[i];
  } else {
    return s;
  }
}

// llama_kernels.cpp's rmsnorm_backward row loop (the same operations, dot summed in order) with
// dout the sum of its parts, and dweight's terms of these rows summed in row order into dw_part (C).
template <bool kThree>
[[gnu::always_inline]] inline void summed_rmsnorm_rows_of(float* dinp, float* dw_part, const float* d0, const float* d1,
                                                          const float* d2, const float* inp, const float* weight,
                                                          const float* rstd, int C, size_t begin, size_t end) {
  for (int i = 0; i < C; i++) dw_part[i] = 0.0f;
  for (size_t n = begin; n < end; n++) {
    const size_t row = n * C;
    const float* x = inp + row;  // (C)
    float* dx = dinp + row;      // (C)
    const float s = rstd[n];
    float dot = 0.0f;
    for (int i = 0; i < C; i++) dot += (weight[i] * part_sum<kThree>(d0, d1, d2, row + i)) * (x[i] * s);
    dot /= static_cast<float>(C);
    // The outputs overlap no input (the contract); said here because the vectoriser gives up on
    // checking at run time that seven pointers do not alias.
#pragma GCC ivdep
    for (int i = 0; i < C; i++) {
      const float dy = part_sum<kThree>(d0, d1, d2, row + i);
      dx[i] += (weight[i] * dy - (x[i] * s) * dot) * s;
      dw_part[i] += (x[i] * s) * dy;
    }
  }
}

ZINF_ROW_CLONES void summed_rmsnorm_rows(float* dinp, uint16_t* dinp_bf16, float* dw_part, const float* d0,
                                         const float* d1, const float* d2, const float* inp, const float* weight,
                                         const float* rstd, int C, size_t begin, size_t end) {
  if (d2 != nullptr) {
    summed_rmsnorm_rows_of<true>(dinp, dw_part, d0, d1, d2, inp, weight, rstd, C, begin, end);
  } else {
    summed_rmsnorm_rows_of<false>(dinp, dw_part, d0, d1, d2, inp, weight, rstd, C, begin, end);
  }
  if (dinp_bf16 != nullptr) {  // the chunk's finished rows, still in cache
    for (size_t n = begin; n < end; n++) round_row(dinp_bf16 + n * C, dinp + n * C, C);
  }
}

ZINF_ROW_CLONES void softmax_xent_rows(float* logits_to_dlogits, float* losses, const int32_t* targets, float dloss,
                                       int V, size_t begin, size_t end) {
  for (size_t n = begin; n < end; n++) {
    float* row = logits_to_dlogits + n * V;  // (V): logits in, dlogits out
    const int32_t t = targets[n];
    const float maxv = lane_max(row, V);
    const float target_logit = row[t];
    const double sum = exp_sum_double<true>(row, maxv, V);  // row holds exp(x - max)
    const float inv = static_cast<float>(1.0 / sum);
    const float p_target = row[t] * inv;
    for (int v = 0; v < V; v++) row[v] = (row[v] * inv) * dloss;
    row[t] = (p_target - 1.0f) * dloss;
    losses[n] = static_cast<float>(static_cast<double>(maxv) + std::log(sum) - target_logit);
  }
}

ZINF_ROW_CLONES void softmax_xent_loss_rows(const float* logits, float* losses, const int32_t* targets, int V,
                                            size_t begin, size_t end) {
  for (size_t n = begin; n < end; n++) {
    const float* row = logits + n * V;
    const float maxv = lane_max(row, V);
    const double sum = exp_sum_double<false>(row, maxv, V);
    losses[n] = static_cast<float>(static_cast<double>(maxv) + std::log(sum) - row[targets[n]]);
  }
}

}  // namespace

void bias_gelu_forward(float* pre, float* out, const float* bias, int N, int OC, uint16_t* out_bf16) {
  const size_t work = 30 * static_cast<size_t>(OC);
  parallel_for(static_cast<size_t>(N), row_grain(work), work,
               [&](size_t begin, size_t end) { bias_gelu_rows(pre, out, out_bf16, bias, OC, begin, end); });
}

void round_to_bf16(uint16_t* dst, const float* src, int N, int C) {
  const size_t work = 2 * static_cast<size_t>(C);
  parallel_for(static_cast<size_t>(N), row_grain(work), work,
               [&](size_t begin, size_t end) { round_rows(dst, src, C, static_cast<size_t>(C), begin, end); });
}

void round_block_to_bf16(uint16_t* dst, const float* src, int rows, int cols, size_t ld) {
  round_rows(dst, src, cols, ld, 0, static_cast<size_t>(rows));
}

void gelu_backward_bias_grad(float* dpre, float* dbias, const float* pre, int N, int OC, uint16_t* dpre_bf16) {
  // Columns split over threads, rows in order within each column: dbias gets the serial loop's
  // bits while both passes (GELU' and the column sums) share one read of dpre.
  for_column_slices(N, OC, 40, [&](size_t c0, size_t c1) {
    gelu_grad_bias_columns(dpre, dpre_bf16, dbias, pre, N, OC, c0, c1);
  });
}

void bias_grad(float* dbias, const float* dout, int N, int OC) {
  for_column_slices(N, OC, 1, [&](size_t c0, size_t c1) {
    float acc[kMaxSlice];
    const size_t w = c1 - c0;
    for (size_t i = 0; i < w; i++) acc[i] = dbias[c0 + i];
    for (int n = 0; n < N; n++) {
      const float* d = dout + static_cast<size_t>(n) * OC + c0;
      for (size_t i = 0; i < w; i++) acc[i] += d[i];
    }
    for (size_t i = 0; i < w; i++) dbias[c0 + i] = acc[i];
  });
}

void residual_layernorm_forward(float* out, float* mean, float* rstd, float* x, const float* residual,
                                const float* weight, const float* bias, int N, int C, uint16_t* out_bf16) {
  const size_t work = 6 * static_cast<size_t>(C);
  parallel_for(static_cast<size_t>(N), row_grain(work), work, [&](size_t begin, size_t end) {
    residual_layernorm_rows(out, out_bf16, mean, rstd, x, residual, weight, bias, C, begin, end);
  });
}

void residual_rmsnorm_forward(float* out, float* rstd, float* x, const float* residual, const float* weight,
                              float eps, int N, int C, uint16_t* out_bf16) {
  const size_t work = 5 * static_cast<size_t>(C);
  parallel_for(static_cast<size_t>(N), row_grain(work), work, [&](size_t begin, size_t end) {
    residual_rmsnorm_rows(out, out_bf16, rstd, x, residual, weight, eps, C, begin, end);
  });
}

void summed_rmsnorm_backward(float* dinp, float* dweight, const float* dout0, const float* dout1, const float* dout2,
                             const float* inp, const float* weight, const float* rstd, int N, int C,
                             uint16_t* dinp_bf16) {
  // One pass over the rows: each chunk of kSummedRmsNormRows rows sums its dweight terms into its
  // own partial (C); then dweight += the partials in chunk order, columns over threads. The
  // partials live in a buffer of the calling thread that grows to the largest (N, C) seen.
  const size_t rows = kSummedRmsNormRows, chunks = (static_cast<size_t>(N) + rows - 1) / rows;
  static thread_local std::vector<float> partials;
  if (partials.size() < chunks * C) partials.resize(chunks * C);
  float* part = partials.data();
  const size_t row_work = 10 * static_cast<size_t>(C);
  parallel_for(static_cast<size_t>(N), rows, row_work, [&](size_t begin, size_t end) {
    for (size_t b = begin; b < end; b += rows) {
      summed_rmsnorm_rows(dinp, dinp_bf16, part + b / rows * C, dout0, dout1, dout2, inp, weight, rstd, C, b,
                          std::min(end, b + rows));
    }
  });
  const size_t cols = static_cast<size_t>(C);
  parallel_for(cols, model::detail::column_slice_grain(cols), chunks, [&](size_t c0, size_t c1) {
    for (size_t k = 0; k < chunks; k++) {
      const float* p = part + k * C;
      for (size_t i = c0; i < c1; i++) dweight[i] += p[i];
    }
  });
}

void softmax_xent_fused(float* logits_to_dlogits, float* losses, const int32_t* targets, float dloss, int N,
                        int V) {
  const size_t work = 20 * static_cast<size_t>(V);
  parallel_for(static_cast<size_t>(N), row_grain(work), work, [&](size_t begin, size_t end) {
    softmax_xent_rows(logits_to_dlogits, losses, targets, dloss, V, begin, end);
  });
}

void softmax_xent_loss(const float* logits, float* losses, const int32_t* targets, int N, int V) {
  const size_t work = 12 * static_cast<size_t>(V);
  parallel_for(static_cast<size_t>(N), row_grain(work), work,
               [&](size_t begin, size_t end) { softmax_xent_loss_rows(logits, losses, targets, V, begin, end); });
}

}  // namespace zinf::model::kernels
