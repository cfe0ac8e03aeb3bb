// Internal: the per-row arithmetic of the GEMM attention's kernels (gemm_attention.cu): which
// stacked score row is which query position, the causal mask, the row softmax with its
// log-sum-exp, and the score gradient. The device kernels call these functions; the *_on_host
// functions run the same calls in the same order (lane-strided partial statistics merged in
// the warp's xor-butterfly order) so that a host test checks the device's formulas against a
// double-precision reference (tests/gpu/kernel_math_test.cpp).
#pragma once

#include <cmath>

#include "gpu/numerics.h"

namespace zinf::gpu::attn {

// A launch covers one time block [t0, t1) of one unit (`heads` query heads starting at head0
// within their kv group) of kv groups g0, g0 + 1, ...: per group (t1 - t0) * heads rows ordered
// (t, head). Launch row R is query position block_position(), and its row of lse and D
// (B,NH,T) is block_global_row() (a group's query heads are g*G .. g*G + G-1).
ZINF_HD int block_position(long long R, long long block_rows, int heads, int t0) {
  return t0 + static_cast<int>((R % block_rows) / heads);
}
ZINF_HD long long block_global_row(long long R, long long block_rows, int heads, int t0, int T, int G, int g0,
                                   int head0) {
  const long long u = R / block_rows;
  const long long r = R % block_rows;
  const long long h = head0 + r % heads;
  const long long t = t0 + r / heads;
  return ((g0 + u) * G + h) * static_cast<long long>(T) + t;
}
// The causal mask: query position `pos` sees keys 0..pos.
ZINF_HD bool key_visible(int key, int pos) { return key <= pos; }

// Running softmax statistics of a set of scaled scores x: m = max x, l = sum exp(x - m).
// Empty: m = -inf, l = 0.
struct SoftmaxStats {
  float m;
  float l;
};
ZINF_HD SoftmaxStats stats_empty() { return SoftmaxStats{-INFINITY, 0.0f}; }
// Adds one finite score.
ZINF_HD SoftmaxStats stats_add(SoftmaxStats s, float x) {
  if (x > s.m) return SoftmaxStats{x, s.l * exp_f(s.m - x) + 1.0f};  // s.l == 0 when empty: exp(-inf) = 0
  return SoftmaxStats{s.m, s.l + exp_f(x - s.m)};
}
// Merges two sets. Symmetric in its arguments bit for bit (max and + commute), so both partners
// of a butterfly step hold the same result.
ZINF_HD SoftmaxStats stats_merge(SoftmaxStats a, SoftmaxStats b) {
  const float m = a.m > b.m ? a.m : b.m;
  if (m == -INFINITY) return stats_empty();
  const float la = a.l > 0.0f ? a.l * exp_f(a.m - m) : 0.0f;
  const float lb = b.l > 0.0f ? b.l * exp_f(b.m - m) : 0.0f;
  return SoftmaxStats{m, la + lb};
}
// log(sum exp x) of a non-empty set.
ZINF_HD float stats_lse(SoftmaxStats s) {
#if defined(__CUDA_ARCH__)
  return s.m + logf(s.l);
#else
  return s.m + std::log(s.l);
#endif
}
// P = exp(S * scale - lse): the forward's probabilities and the backward's recomputation.
ZINF_HD float softmax_prob(float s, float scale, float lse) { return exp_f(s * scale - lse); }
// dS = P * (dP - D), D = rowsum(dO * O) (the 1/sqrt(hs) scale goes into the dQ, dK products).
ZINF_HD float score_grad(float p, float dp, float d) { return p * (dp - d); }

inline constexpr int kWarpLanes = 32;

// ---- host mirrors of the kernels' per-row loops ---------------------------------------------
// One score row s[0..T) (fp32; T here is the block's key count t1) of query position pos:
// lane j of the warp accumulates the visible keys j, j + 32, ...; the lanes' statistics merge in
// the butterfly order of the warp's shuffles (offsets 16, 8, 4, 2, 1). Writes p[0..T) (0 where
// masked) and returns the lse.
inline float softmax_row_on_host(const float* s, int T, int pos, float scale, float* p) {
  SoftmaxStats lane[kWarpLanes];
  for (int l = 0; l < kWarpLanes; l++) {
    lane[l] = stats_empty();
    for (int j = l; j < T; j += kWarpLanes) {
      if (key_visible(j, pos)) lane[l] = stats_add(lane[l], s[j] * scale);
    }
  }
  for (int off = kWarpLanes / 2; off > 0; off /= 2) {
    SoftmaxStats next[kWarpLanes];
    for (int l = 0; l < kWarpLanes; l++) next[l] = stats_merge(lane[l], lane[l ^ off]);
    for (int l = 0; l < kWarpLanes; l++) lane[l] = next[l];
  }
  const float lse = stats_lse(lane[0]);
  for (int j = 0; j < T; j++) p[j] = key_visible(j, pos) ? softmax_prob(s[j], scale, lse) : 0.0f;
  return lse;
}

// The backward's row: P recomputed from lse, dS = P * (dP - D); both 0 where masked.
inline void score_grad_row_on_host(const float* s, const float* dp, int T, int pos, float scale, float lse, float d,
                                   float* p, float* ds) {
  for (int j = 0; j < T; j++) {
    const bool vis = key_visible(j, pos);
    p[j] = vis ? softmax_prob(s[j], scale, lse) : 0.0f;
    ds[j] = vis ? score_grad(p[j], dp[j], d) : 0.0f;
  }
}

}  // namespace zinf::gpu::attn
