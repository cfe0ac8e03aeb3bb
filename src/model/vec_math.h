// Internal: branch-free exp and fixed-order lane reductions that GCC vectorises, shared by the
// blocked attention core and the fused row kernels.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace zinf::model::kernels::detail {

// exp(x) by Cephes expf's range reduction and degree-6 polynomial (about 1 ulp on [-87, 88]),
// branch-free and without library calls so that GCC vectorises the loops around it (std::exp
// stays a scalar call without -ffast-math, and was most of the old kernels' softmax time). Plain
// IEEE operations: the same bits on every machine. Inputs are clamped to [-87, 88]; softmax only
// passes x <= 0, where exp(-87) ~ 1.6e-38 is invisible next to the row's exp(0) = 1 term.
// Loops calling it vectorise only with -fno-trapping-math (GCC keeps the clamps as branches
// otherwise), so its callers live in the zinf_vector_kernels library (src/model/meson.build).
inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln 2)
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  return y * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

// Sums and maxima over eight interleaved lanes in a fixed order: vectorisable, and the same bits
// for the same n.
inline float lane_sum(const float* x, int n) {
  float acc[8] = {};
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int u = 0; u < 8; u++) acc[u] += x[j + u];
  }
  for (int u = 0; j < n; j++, u++) acc[u] += x[j];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

inline float lane_dot(const float* x, const float* y, int n) {
  float acc[8] = {};
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int u = 0; u < 8; u++) acc[u] += x[j + u] * y[j + u];
  }
  for (int u = 0; j < n; j++, u++) acc[u] += x[j] * y[j];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

inline float lane_max(const float* x, int n) {  // n >= 1
  float acc[8];
  for (float& a : acc) a = x[0];
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int u = 0; u < 8; u++) acc[u] = std::max(acc[u], x[j + u]);
  }
  for (int u = 0; j < n; j++, u++) acc[u] = std::max(acc[u], x[j]);
  return std::max(std::max(std::max(acc[0], acc[1]), std::max(acc[2], acc[3])),
                  std::max(std::max(acc[4], acc[5]), std::max(acc[6], acc[7])));
}

}  // namespace zinf::model::kernels::detail
