// Causal grouped-query self-attention, forward and backward, as sgemm calls per (batch, head):
// attention.cpp's approach (keep the log-sum-exp, rebuild probabilities in backward) with q, k
// and v in separate tensors and several query heads per kv head.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/llama_kernels.h"
#include "model/parallel.h"

namespace zinf::model::kernels {

size_t gqa_attention_scratch_floats(int T) { return 2 * static_cast<size_t>(T) * T; }

namespace {

// Offsets of one (b, h) slice. Query rows are NH*hs apart, key/value rows NKV*hs apart.
struct GqaHead {
  size_t q_offset;   // into q, out, dq, dout: (B,T,NH*hs)
  size_t kv_offset;  // into k, v, dk, dv: (B,T,NKV*hs)
  size_t lse_offset; // into lse: (B,NH,T)
  int qw, kvw;       // row strides
  bool first_of_group;  // h is the first query head of its kv head
};

GqaHead gqa_head(const GqaShape& s, int b, int h) {
  const int group = s.NH / s.NKV;
  const int qw = s.NH * s.hs;
  const int kvw = s.NKV * s.hs;
  return GqaHead{static_cast<size_t>(b) * s.T * qw + static_cast<size_t>(h) * s.hs,
                 static_cast<size_t>(b) * s.T * kvw + static_cast<size_t>(h / group) * s.hs,
                 (static_cast<size_t>(b) * s.NH + h) * s.T, qw, kvw, h % group == 0};
}

// scores (T,T) = scale * Q K^T; only j <= i are used.
void scores(float* p, const float* q, const float* k, const GqaHead& hd, int T, int hs, float scale) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q + hd.q_offset, hd.qw, k + hd.kv_offset,
              hd.kvw, 0.0f, p, T);
}

// Row i of the causal softmax from its log-sum-exp: exp(s - lse) for j <= i, 0 after.
void probs_row(float* row, int i, int T, float lse) {
  for (int j = 0; j <= i; j++) row[j] = std::exp(row[j] - lse);
  for (int j = i + 1; j < T; j++) row[j] = 0.0f;
}

}  // namespace

void gqa_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, float* scratch,
                           const GqaShape& s) {
  const int T = s.T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hs));
  float* p = scratch;  // (T,T)
  for (int b = 0; b < s.B; b++) {
    for (int h = 0; h < s.NH; h++) {
      const GqaHead hd = gqa_head(s, b, h);
      float* head_lse = lse + hd.lse_offset;  // (T)
      scores(p, q, k, hd, T, s.hs, scale);
      detail::parallel_for(T, detail::row_grain(20 * T), 20 * T, [&](size_t begin, size_t end) {
        for (int i = static_cast<int>(begin); i < static_cast<int>(end); i++) {
          float* row = p + static_cast<size_t>(i) * T;
          float maxv = row[0];
          for (int j = 1; j <= i; j++) maxv = std::max(maxv, row[j]);
          float sum = 0.0f;
          for (int j = 0; j <= i; j++) sum += std::exp(row[j] - maxv);
          head_lse[i] = maxv + std::log(sum);
          probs_row(row, i, T, head_lse[i]);
        }
      });
      // out (T,hs) = P (T,T) @ V (T,hs)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, s.hs, T, 1.0f, p, T, v + hd.kv_offset, hd.kvw, 0.0f,
                  out + hd.q_offset, hd.qw);
    }
  }
}

void gqa_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                            const float* v, const float* lse, float* scratch, const GqaShape& s) {
  const int T = s.T;
  const int hs = s.hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  float* p = scratch;                                // (T,T) probabilities
  float* dp = scratch + static_cast<size_t>(T) * T;  // (T,T) dP, then dS
  for (int b = 0; b < s.B; b++) {
    for (int h = 0; h < s.NH; h++) {  // in order, so a kv head's query heads add up in head order
      const GqaHead hd = gqa_head(s, b, h);
      const float* head_lse = lse + hd.lse_offset;  // (T)
      const float* dO = dout + hd.q_offset;
      scores(p, q, k, hd, T, hs, scale);
      detail::parallel_for(T, detail::row_grain(10 * T), 10 * T, [&](size_t begin, size_t end) {
        for (int i = static_cast<int>(begin); i < static_cast<int>(end); i++) {
          probs_row(p + static_cast<size_t>(i) * T, i, T, head_lse[i]);
        }
      });
      // dP (T,T) = dO (T,hs) @ V^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dO, hd.qw, v + hd.kv_offset, hd.kvw, 0.0f,
                  dp, T);
      // Softmax backward: dS = P * (dP - rowsum(P * dP)), times the score scale.
      detail::parallel_for(T, detail::row_grain(4 * T), 4 * T, [&](size_t begin, size_t end) {
        for (int i = static_cast<int>(begin); i < static_cast<int>(end); i++) {
          const float* prow = p + static_cast<size_t>(i) * T;
          float* drow = dp + static_cast<size_t>(i) * T;
          float dot = 0.0f;
          for (int j = 0; j <= i; j++) dot += prow[j] * drow[j];
          for (int j = 0; j <= i; j++) drow[j] = prow[j] * (drow[j] - dot) * scale;
          for (int j = i + 1; j < T; j++) drow[j] = 0.0f;
        }
      });
      // dQ (T,hs) = dS @ K ; dK (T,hs) (+)= dS^T @ Q ; dV (T,hs) (+)= P^T @ dO
      const float beta = hd.first_of_group ? 0.0f : 1.0f;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, dp, T, k + hd.kv_offset, hd.kvw, 0.0f,
                  dq + hd.q_offset, hd.qw);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, dp, T, q + hd.q_offset, hd.qw, beta,
                  dk + hd.kv_offset, hd.kvw);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, dO, hd.qw, beta, dv + hd.kv_offset,
                  hd.kvw);
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
