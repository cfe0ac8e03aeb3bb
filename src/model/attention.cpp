// Causal multi-head self-attention over packed qkv: the blocked core of attention_core.cpp per
// (batch, head), plus the full (T, T) sgemm path it replaced (kept for bench/attention_bench.cpp)
// and the scalar references.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "model/attention_core.h"
#include "model/block_gemm.h"
#include "model/kernels.h"
#include "model/parallel.h"

namespace zinf::model::kernels {

namespace {

// Rows of head h of batch b: q, k, v rows are 3C apart inside qkv, o rows C apart.
detail::HeadRows gpt_head(const float* qkv, int b, int h, int T, int C, int NH) {
  const float* q = qkv + static_cast<size_t>(b) * T * 3 * C + static_cast<size_t>(h) * (C / NH);
  return detail::HeadRows{q, q + C, q + 2 * C, 3 * C, 3 * C, C};
}

size_t o_offset(int b, int h, int T, int C, int NH) {
  return static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * (C / NH);
}

}  // namespace

namespace detail {

void attention_forward_on(ThreadPool& pool, float* out, float* lse, const float* qkv, float* scratch, int B, int T,
                          int C, int NH, uint16_t* out_bf16, AttentionProducts products) {
  count_attention_pass(false, products);
  const int hs = C / NH;
  const int blocks = (T + attention_block(hs) - 1) / attention_block(hs);
  // One task per (b, h, query block), costliest (last) query blocks first.
  const size_t tasks = static_cast<size_t>(B) * NH * blocks;
  run_lanes(pool, tasks, attention_worth_threads(B, NH, T, hs), [&](size_t lane, size_t i) {
    const int bh = static_cast<int>(i / blocks);
    const int qb = blocks - 1 - static_cast<int>(i % blocks);
    const int b = bh / NH, h = bh % NH;
    const size_t oo = o_offset(b, h, T, C, NH);
    attention_forward_block(gpt_head(qkv, b, h, T, C, NH), out + oo, lse + static_cast<size_t>(bh) * T, T, hs, qb,
                            scratch + lane * kAttnLaneFloats, products);
    if (out_bf16 != nullptr) round_query_block(out_bf16 + oo, out + oo, T, hs, qb, C);
  });
}

void attention_backward_on(ThreadPool& pool, float* dqkv, const float* dout, const float* qkv, const float* out,
                           const float* lse, float* scratch, int B, int T, int C, int NH, uint16_t* dqkv_bf16,
                           AttentionProducts products) {
  count_attention_pass(true, products);
  const int hs = C / NH;
  // One task per (b, h): it owns the head's dq, dk and dv columns of dqkv.
  run_lanes(pool, static_cast<size_t>(B) * NH, attention_worth_threads(B, NH, T, hs), [&](size_t lane, size_t i) {
    const int b = static_cast<int>(i) / NH, h = static_cast<int>(i) % NH;
    const HeadRows hr = gpt_head(qkv, b, h, T, C, NH);
    float* dq = dqkv + (hr.q - qkv);
    for (int t = 0; t < T; t++) {
      std::memset(dq + static_cast<size_t>(t) * 3 * C + C, 0, hs * sizeof(float));
      std::memset(dq + static_cast<size_t>(t) * 3 * C + 2 * C, 0, hs * sizeof(float));
    }
    const size_t o_at = o_offset(b, h, T, C, NH);
    attention_backward_head(hr, out + o_at, dout + o_at, lse + i * T, dq, dq + C, dq + 2 * C, T, hs,
                            scratch + lane * kAttnLaneFloats, products);
    if (dqkv_bf16 != nullptr) {  // the head's q, k and v columns, finished
      for (int part = 0; part < 3; part++) {
        const size_t at = static_cast<size_t>(dq - dqkv) + static_cast<size_t>(part) * C;
        round_block_to_bf16(dqkv_bf16 + at, dqkv + at, T, hs, 3 * static_cast<size_t>(C));
      }
    }
  });
}

}  // namespace detail

AttentionProducts attention_products_for(MatmulKind matmul) {
  return matmul == MatmulKind::kBf16 && detail::block_gemm_bf16_supported() ? AttentionProducts::kBf16
                                                                             : AttentionProducts::kFp32;
}

size_t attention_scratch_floats() { return default_thread_pool().threads() * detail::kAttnLaneFloats; }

void attention_forward(float* out, float* lse, const float* qkv, float* scratch, int B, int T, int C, int NH,
                       uint16_t* out_bf16, AttentionProducts products) {
  detail::attention_forward_on(default_thread_pool(), out, lse, qkv, scratch, B, T, C, NH, out_bf16, products);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        float* scratch, int B, int T, int C, int NH, uint16_t* dqkv_bf16, AttentionProducts products) {
  detail::attention_backward_on(default_thread_pool(), dqkv, dout, qkv, out, lse, scratch, B, T, C, NH, dqkv_bf16,
                                products);
}

void attention_backward_reference(float* dqkv, const float* dout, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      float* row = dqkv + (static_cast<size_t>(b) * T + t) * 3 * C;
      std::fill(row + C, row + 3 * C, 0.0f);
    }
    for (int h = 0; h < NH; h++) {
      const detail::HeadRows hr = gpt_head(qkv, b, h, T, C, NH);
      float* dq = dqkv + (hr.q - qkv);
      detail::attention_backward_head_reference(hr, dout + o_offset(b, h, T, C, NH), dq, dq + C, dq + 2 * C, T, hs);
    }
  }
}

// ---- The full (T, T) path the blocked kernels replaced: scores for every (query, key) pair,
// masked afterwards. Kept as the baseline of bench/attention_bench.cpp.

size_t attention_full_scratch_floats(int T) { return 2 * static_cast<size_t>(T) * T; }

namespace {

// Pointers of one (b, h) slice. q, k, v rows are 3C apart inside qkv; o rows C apart.
struct FullHeadView {
  const float* q;
  const float* k;
  const float* v;
  size_t o_offset;  // into out / dout, (B,T,C)
  size_t qkv_offset;
  size_t lse_offset;  // into lse, (B,NH,T)
};

FullHeadView full_head_view(const float* qkv, int b, int h, int T, int C, int NH) {
  const int hs = C / NH;
  const size_t qkv_offset = static_cast<size_t>(b) * T * 3 * C + static_cast<size_t>(h) * hs;
  const float* q = qkv + qkv_offset;
  return FullHeadView{q,          q + C,
                  q + 2 * C,  static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * hs,
                  qkv_offset, (static_cast<size_t>(b) * NH + h) * T};
}

// scores (T,T) = scale * Q K^T; only j <= i are used.
void full_scores(float* s, const FullHeadView& hv, int T, int C, int hs, float scale) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, hv.q, 3 * C, hv.k, 3 * C,
              0.0f, s, T);
}

// Row i of the causal softmax from scores and its log-sum-exp: p = exp(s - lse) for j <= i, 0
// after. Forward and backward both use this, so backward sees exactly forward's probabilities.
void full_probs_row(float* row, int i, int T, float lse) {
  for (int j = 0; j <= i; j++) row[j] = std::exp(row[j] - lse);
  for (int j = i + 1; j < T; j++) row[j] = 0.0f;
}

}  // namespace

void attention_forward_full(float* out, float* lse, const float* qkv, float* scratch, int B, int T,
                       int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  float* p = scratch;  // (T,T)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      FullHeadView hv = full_head_view(qkv, b, h, T, C, NH);
      float* head_lse = lse + hv.lse_offset;  // (T)
      full_scores(p, hv, T, C, hs, scale);
      model::detail::parallel_for(T, model::detail::row_grain(20 * T), 20 * T, [&](size_t begin, size_t end) {
        for (int i = static_cast<int>(begin); i < static_cast<int>(end); i++) {
          float* row = p + static_cast<size_t>(i) * T;
          float maxv = row[0];
          for (int j = 1; j <= i; j++) maxv = std::max(maxv, row[j]);
          float sum = 0.0f;
          for (int j = 0; j <= i; j++) sum += std::exp(row[j] - maxv);
          head_lse[i] = maxv + std::log(sum);
          full_probs_row(row, i, T, head_lse[i]);
        }
      });
      // out (T,hs) = P (T,T) @ V (T,hs)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, hv.v, 3 * C,
                  0.0f, out + hv.o_offset, C);
    }
  }
}

void attention_backward_full(float* dqkv, const float* dout, const float* qkv, const float* lse,
                        float* scratch, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  float* p = scratch;                                // (T,T) probabilities
  float* dp = scratch + static_cast<size_t>(T) * T;  // (T,T) dP, then dS
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      FullHeadView hv = full_head_view(qkv, b, h, T, C, NH);
      const float* head_lse = lse + hv.lse_offset;  // (T)
      const float* dO = dout + hv.o_offset;
      float* dq = dqkv + hv.qkv_offset;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      full_scores(p, hv, T, C, hs, scale);
      model::detail::parallel_for(T, model::detail::row_grain(10 * T), 10 * T, [&](size_t begin, size_t end) {
        for (int i = static_cast<int>(begin); i < static_cast<int>(end); i++) {
          full_probs_row(p + static_cast<size_t>(i) * T, i, T, head_lse[i]);
        }
      });
      // dP (T,T) = dO (T,hs) @ V^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dO, C, hv.v, 3 * C, 0.0f,
                  dp, T);
      // Softmax backward: dS = P * (dP - rowsum(P * dP)), times the score scale.
      model::detail::parallel_for(T, model::detail::row_grain(4 * T), 4 * T, [&](size_t begin, size_t end) {
        for (int i = static_cast<int>(begin); i < static_cast<int>(end); i++) {
          const float* prow = p + static_cast<size_t>(i) * T;
          float* drow = dp + static_cast<size_t>(i) * T;
          float dot = 0.0f;
          for (int j = 0; j <= i; j++) dot += prow[j] * drow[j];
          for (int j = 0; j <= i; j++) drow[j] = prow[j] * (drow[j] - dot) * scale;
          for (int j = i + 1; j < T; j++) drow[j] = 0.0f;
        }
      });
      // dQ (T,hs) = dS @ K ; dK (T,hs) = dS^T @ Q ; dV (T,hs) = P^T @ dO
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, dp, T, hv.k, 3 * C,
                  0.0f, dq, 3 * C);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, dp, T, hv.q, 3 * C, 0.0f,
                  dk, 3 * C);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, dO, C, 0.0f, dv,
                  3 * C);
    }
  }
}

void attention_forward_reference(float* out, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  std::vector<float> att(T);
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      for (int h = 0; h < NH; h++) {
        const float* q = qkv + (static_cast<size_t>(b) * T + t) * 3 * C + h * hs;
        float maxv = -INFINITY;
        for (int t2 = 0; t2 <= t; t2++) {
          const float* k = qkv + (static_cast<size_t>(b) * T + t2) * 3 * C + C + h * hs;
          float dot = 0.0f;
          for (int i = 0; i < hs; i++) dot += q[i] * k[i];
          att[t2] = dot * scale;
          maxv = std::max(maxv, att[t2]);
        }
        float sum = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
          att[t2] = std::exp(att[t2] - maxv);
          sum += att[t2];
        }
        float* o = out + (static_cast<size_t>(b) * T + t) * C + h * hs;
        for (int i = 0; i < hs; i++) o[i] = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
          const float* v = qkv + (static_cast<size_t>(b) * T + t2) * 3 * C + 2 * C + h * hs;
          const float a = att[t2] / sum;
          for (int i = 0; i < hs; i++) o[i] += a * v[i];
        }
      }
    }
  }
}

}  // namespace zinf::model::kernels
