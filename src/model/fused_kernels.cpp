// Fused passes over activations: bias + GELU, GELU' + bias gradient, residual + LayerNorm /
// RMSNorm, softmax + cross-entropy + its gradient. Built with -fno-trapping-math so that the
// loops around fast_exp vectorise (see src/model/meson.build); plain IEEE operations otherwise.
#include "model/fused_kernels.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

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
// Columns per task of the column sums: 64 floats, one 256-byte run of every row.
constexpr size_t kColumnChunk = 64;

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

// Calls fn(col_begin, col_end) over column chunks of at most kColumnChunk columns of an (N, OC)
// matrix, in parallel (parallel_for hands a small problem over whole, so it is cut here again).
template <typename Fn>
void for_column_chunks(int N, int OC, size_t work_per_element, Fn&& fn) {
  parallel_for(static_cast<size_t>(OC), kColumnChunk, static_cast<size_t>(N) * work_per_element,
               [&](size_t begin, size_t end) {
                 for (size_t c = begin; c < end; c += kColumnChunk) fn(c, std::min(end, c + kColumnChunk));
               });
}

}  // namespace

void bias_gelu_forward(float* pre, float* out, const float* bias, int N, int OC) {
  parallel_for(static_cast<size_t>(N), row_grain(30 * static_cast<size_t>(OC)), 30 * static_cast<size_t>(OC),
               [&](size_t begin, size_t end) {
                 for (size_t n = begin; n < end; n++) {
                   float* p = pre + n * OC;  // (OC)
                   float* o = out + n * OC;  // (OC)
                   for (int i = 0; i < OC; i++) {
                     const float x = p[i] + bias[i];
                     p[i] = x;
                     o[i] = gelu(x);
                   }
                 }
               });
}

void gelu_backward_bias_grad(float* dpre, float* dbias, const float* pre, int N, int OC) {
  // Columns split over threads, rows in order within each column: dbias gets the serial loop's
  // bits while both passes (GELU' and the column sums) share one read of dpre.
  for_column_chunks(N, OC, 40, [&](size_t c0, size_t c1) {
    float acc[kColumnChunk];
    const size_t w = c1 - c0;
    for (size_t i = 0; i < w; i++) acc[i] = dbias[c0 + i];
    for (int n = 0; n < N; n++) {
      const float* x = pre + static_cast<size_t>(n) * OC + c0;
      float* d = dpre + static_cast<size_t>(n) * OC + c0;
      for (size_t i = 0; i < w; i++) {
        const float g = gelu_grad(x[i]) * d[i];
        d[i] = g;
        acc[i] += g;
      }
    }
    for (size_t i = 0; i < w; i++) dbias[c0 + i] = acc[i];
  });
}

void bias_grad(float* dbias, const float* dout, int N, int OC) {
  for_column_chunks(N, OC, 1, [&](size_t c0, size_t c1) {
    float acc[kColumnChunk];
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
                                const float* weight, const float* bias, int N, int C) {
  const float eps = 1e-5f;
  const float c = static_cast<float>(C);
  parallel_for(static_cast<size_t>(N), row_grain(6 * static_cast<size_t>(C)), 6 * static_cast<size_t>(C),
               [&](size_t begin, size_t end) {
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
                   mean[n] = m;
                   rstd[n] = s;
                 }
               });
}

void residual_rmsnorm_forward(float* out, float* rstd, float* x, const float* residual, const float* weight,
                              float eps, int N, int C) {
  parallel_for(static_cast<size_t>(N), row_grain(5 * static_cast<size_t>(C)), 5 * static_cast<size_t>(C),
               [&](size_t begin, size_t end) {
                 for (size_t n = begin; n < end; n++) {
                   float* xn = x + n * C;  // (C)
                   if (residual != nullptr) {
                     const float* r = residual + n * C;
                     for (int i = 0; i < C; i++) xn[i] += r[i];
                   }
                   const float s = 1.0f / std::sqrt(lane_dot(xn, xn, C) / static_cast<float>(C) + eps);
                   float* o = out + n * C;
                   for (int i = 0; i < C; i++) o[i] = weight[i] * (xn[i] * s);  // HF's order
                   rstd[n] = s;
                 }
               });
}

void softmax_xent_fused(float* logits_to_dlogits, float* losses, const int32_t* targets, float dloss, int N,
                        int V) {
  parallel_for(static_cast<size_t>(N), row_grain(20 * static_cast<size_t>(V)), 20 * static_cast<size_t>(V),
               [&](size_t begin, size_t end) {
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
               });
}

void softmax_xent_loss(const float* logits, float* losses, const int32_t* targets, int N, int V) {
  parallel_for(static_cast<size_t>(N), row_grain(12 * static_cast<size_t>(V)), 12 * static_cast<size_t>(V),
               [&](size_t begin, size_t end) {
                 for (size_t n = begin; n < end; n++) {
                   const float* row = logits + n * V;
                   const float maxv = lane_max(row, V);
                   const double sum = exp_sum_double<false>(row, maxv, V);
                   losses[n] = static_cast<float>(static_cast<double>(maxv) + std::log(sum) - row[targets[n]]);
                 }
               });
}

}  // namespace zinf::model::kernels
