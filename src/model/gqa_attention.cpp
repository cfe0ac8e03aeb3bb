// Causal grouped-query self-attention, forward and backward: attention_core.cpp's blocked core
// with q, k and v in separate tensors and several query heads per kv head.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "model/attention_core.h"
#include "model/llama_kernels.h"

namespace zinf::model::kernels {

namespace {

// Rows of query head h of batch b. Query rows are NH*hs apart, key/value rows NKV*hs apart.
detail::HeadRows gqa_head(const float* q, const float* k, const float* v, const GqaShape& s, int b, int h) {
  const int qw = s.NH * s.hs, kvw = s.NKV * s.hs;
  const size_t kv_offset = static_cast<size_t>(b) * s.T * kvw + static_cast<size_t>(h / (s.NH / s.NKV)) * s.hs;
  return detail::HeadRows{q + static_cast<size_t>(b) * s.T * qw + static_cast<size_t>(h) * s.hs, k + kv_offset,
                          v + kv_offset, qw, kvw, qw};
}

}  // namespace

namespace detail {

void gqa_attention_forward_on(ThreadPool& pool, float* out, float* lse, const float* q, const float* k,
                              const float* v, float* scratch, const GqaShape& s, uint16_t* out_bf16,
                              AttentionProducts products) {
  count_attention_pass(false, products);
  const int blocks = (s.T + attention_block(s.hs) - 1) / attention_block(s.hs);
  // One task per (b, h, query block), costliest (last) query blocks first.
  const size_t tasks = static_cast<size_t>(s.B) * s.NH * blocks;
  run_lanes(pool, tasks, attention_worth_threads(s.B, s.NH, s.T, s.hs), [&](size_t lane, size_t i) {
    const int bh = static_cast<int>(i / blocks);
    const int qb = blocks - 1 - static_cast<int>(i % blocks);
    const HeadRows hr = gqa_head(q, k, v, s, bh / s.NH, bh % s.NH);
    const size_t oo = static_cast<size_t>(hr.q - q);
    attention_forward_block(hr, out + oo, lse + static_cast<size_t>(bh) * s.T, s.T, s.hs, qb,
                            scratch + lane * kAttnLaneFloats, products);
    if (out_bf16 != nullptr) round_query_block(out_bf16 + oo, out + oo, s.T, s.hs, qb, hr.o_ld);
  });
}

void gqa_attention_backward_on(ThreadPool& pool, float* dq, float* dk, float* dv, const float* dout,
                               const float* q, const float* k, const float* v, const float* out, const float* lse,
                               float* scratch, const GqaShape& s, uint16_t* dv_bf16, AttentionProducts products) {
  count_attention_pass(true, products);
  const int group = s.NH / s.NKV;
  // One task per (b, kv head): it owns that kv head's dk and dv and adds its query heads' parts
  // in head order; each query head's dq is its own.
  run_lanes(pool, static_cast<size_t>(s.B) * s.NKV, attention_worth_threads(s.B, s.NH, s.T, s.hs),
            [&](size_t lane, size_t i) {
              const int b = static_cast<int>(i) / s.NKV, g = static_cast<int>(i) % s.NKV;
              const HeadRows first = gqa_head(q, k, v, s, b, g * group);
              float* dk_g = dk + (first.k - k);
              float* dv_g = dv + (first.v - v);
              for (int t = 0; t < s.T; t++) {
                std::memset(dk_g + static_cast<size_t>(t) * first.kv_ld, 0, s.hs * sizeof(float));
                std::memset(dv_g + static_cast<size_t>(t) * first.kv_ld, 0, s.hs * sizeof(float));
              }
              for (int h = g * group; h < (g + 1) * group; h++) {
                const HeadRows hr = gqa_head(q, k, v, s, b, h);
                const size_t qo = hr.q - q;
                attention_backward_head(hr, out + qo, dout + qo, lse + (static_cast<size_t>(b) * s.NH + h) * s.T,
                                        dq + qo, dk_g, dv_g, s.T, s.hs, scratch + lane * kAttnLaneFloats, products);
              }
              if (dv_bf16 != nullptr) {  // the kv head's dv, all its query heads added
                round_block_to_bf16(dv_bf16 + (dv_g - dv), dv_g, s.T, s.hs, static_cast<size_t>(first.kv_ld));
              }
            });
}

}  // namespace detail

size_t gqa_attention_scratch_floats() { return default_thread_pool().threads() * detail::kAttnLaneFloats; }

void gqa_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, float* scratch,
                           const GqaShape& s, uint16_t* out_bf16, AttentionProducts products) {
  detail::gqa_attention_forward_on(default_thread_pool(), out, lse, q, k, v, scratch, s, out_bf16, products);
}

void gqa_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                            const float* v, const float* out, const float* lse, float* scratch, const GqaShape& s,
                            uint16_t* dv_bf16, AttentionProducts products) {
  detail::gqa_attention_backward_on(default_thread_pool(), dq, dk, dv, dout, q, k, v, out, lse, scratch, s, dv_bf16,
                                    products);
}

void gqa_attention_backward_reference(float* dq, float* dk, float* dv, const float* dout, const float* q,
                                      const float* k, const float* v, const GqaShape& s) {
  const size_t nkv = static_cast<size_t>(s.B) * s.T * s.NKV * s.hs;
  std::fill(dk, dk + nkv, 0.0f);
  std::fill(dv, dv + nkv, 0.0f);
  for (int b = 0; b < s.B; b++) {
    for (int h = 0; h < s.NH; h++) {
      const detail::HeadRows hr = gqa_head(q, k, v, s, b, h);
      detail::attention_backward_head_reference(hr, dout + (hr.q - q), dq + (hr.q - q), dk + (hr.k - k),
                                                dv + (hr.v - v), s.T, s.hs);
    }
  }
}

void gqa_attention_forward_reference(float* out, const float* q, const float* k, const float* v,
                                     const GqaShape& s) {
  const int hs = s.hs;
  const int qw = s.NH * hs;
  const int kvw = s.NKV * hs;
  const int group = s.NH / s.NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  std::vector<float> att(s.T);
  for (int b = 0; b < s.B; b++) {
    for (int t = 0; t < s.T; t++) {
      for (int h = 0; h < s.NH; h++) {
        const int g = h / group;
        const float* qt = q + (static_cast<size_t>(b) * s.T + t) * qw + h * hs;
        float maxv = -INFINITY;
        for (int u = 0; u <= t; u++) {
          const float* ku = k + (static_cast<size_t>(b) * s.T + u) * kvw + g * hs;
          float dot = 0.0f;
          for (int i = 0; i < hs; i++) dot += qt[i] * ku[i];
          att[u] = dot * scale;
          maxv = std::max(maxv, att[u]);
        }
        float sum = 0.0f;
        for (int u = 0; u <= t; u++) {
          att[u] = std::exp(att[u] - maxv);
          sum += att[u];
        }
        float* o = out + (static_cast<size_t>(b) * s.T + t) * qw + h * hs;
        for (int i = 0; i < hs; i++) o[i] = 0.0f;
        for (int u = 0; u <= t; u++) {
          const float* vu = v + (static_cast<size_t>(b) * s.T + u) * kvw + g * hs;
          const float a = att[u] / sum;
          for (int i = 0; i < hs; i++) o[i] += a * vu[i];
        }
      }
    }
  }
}

}  // namespace zinf::model::kernels
