// Blocked (flash-style) causal attention on the CPU: products on (64, 64) blocks (block_gemm.h, or
// OpenBLAS sgemm when asked), online softmax in forward, FlashAttention-2 backward from the saved
// log-sum-exp; no (T, T) matrix anywhere.
#include "model/attention_core.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "model/block_gemm.h"
#include "model/vec_math.h"
#include "zinf/log.h"

namespace zinf::model::kernels::detail {

namespace {

constexpr int kLd = kAttnBlock;  // row stride of the lane's blocks

std::atomic<bool>& blas_products() {
  static std::atomic<bool> on{[] {
    const char* e = std::getenv("ZINF_ATTN_BLAS");
    const std::string_view v = e == nullptr ? "" : e;
    if (v != "" && v != "0" && v != "1") {
      log_once(LogLevel::kWarning, "ZINF_ATTN_BLAS",
               fmt::format("ZINF_ATTN_BLAS={}: expected 0 or 1; attention keeps zinf's block products", v));
    }
    return v == "1";
  }()};
  return on;
}

// C (M, N) = alpha op(A) op(B) (+ C when accumulate), row-major: one block product.
void product(AttentionProducts products, bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
             const float* B, int ldb, bool accumulate, float* C, int ldc) {
  const bool blas = blas_products().load(std::memory_order_relaxed);
  if (products == AttentionProducts::kBf16 && !blas) {
    block_gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, accumulate, C, ldc);
  } else if (blas || block_gemm_isa() == BlockGemmIsa::kReference) {
    // Without AVX2 + FMA block_gemm is the scalar reference (std::fma a call each), far slower
    // than OpenBLAS: such CPUs keep OpenBLAS.
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                lda, B, ldb, accumulate ? 1.0f : 0.0f, C, ldc);
  } else {
    block_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, accumulate, C, ldc);
  }
}

// s (rows, kLd) = scale * Q_rows K_cols^T: the block's scores.
void block_scores(AttentionProducts products, float* s, const HeadRows& h, int r0, int br, int c0, int bc, int hs,
                  float scale) {
  product(products, false, true, br, bc, hs, scale, h.q + static_cast<size_t>(r0) * h.q_ld, h.q_ld,
          h.k + static_cast<size_t>(c0) * h.kv_ld, h.kv_ld, false, s, kLd);
}

// Keys of block (qb, kb) that query row r of the block may see: all bc below the diagonal block,
// r + 1 on it.
inline int visible(int qb, int kb, int r, int bc) { return kb == qb ? r + 1 : bc; }

// Attention passes by [backward][products == kBf16] (attention_pass_counts).
std::atomic<uint64_t> pass_counts[2][2];

}  // namespace

void count_attention_pass(bool backward, AttentionProducts products) {
  pass_counts[backward][products == AttentionProducts::kBf16].fetch_add(1, std::memory_order_relaxed);
}

AttentionPassCounts attention_pass_counts() {
  AttentionPassCounts c;
  for (int d = 0; d < 2; d++) {
    for (int p = 0; p < 2; p++) c.passes[d][p] = pass_counts[d][p].load(std::memory_order_relaxed);
  }
  return c;
}

void set_attention_blas(bool on) { blas_products().store(on, std::memory_order_relaxed); }
bool attention_blas() { return blas_products().load(std::memory_order_relaxed); }

void attention_forward_block(const HeadRows& h, float* o, float* lse, int T, int hs, int qb, float* lane,
                             AttentionProducts products) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int block = attention_block(hs);
  const int r0 = qb * block;
  const int br = std::min(block, T - r0);
  float* s = lane;                  // (br, kLd) scores, then unnormalised probabilities
  float* m = lane + 2 * kLd * kLd;  // (br) running row maximum
  float* l = m + kLd;               // (br) running row sum of exp(s - m)
  float* ob = o + static_cast<size_t>(r0) * h.o_ld;  // (br, hs) rows of o
  for (int kb = 0; kb <= qb; kb++) {  // blocks above the diagonal (kb > qb) are all masked
    const int c0 = kb * block;
    const int bc = std::min(block, T - c0);
    block_scores(products, s, h, r0, br, c0, bc, hs, scale);
    for (int r = 0; r < br; r++) {
      float* row = s + static_cast<size_t>(r) * kLd;
      const int n = visible(qb, kb, r, bc);
      const float bmax = lane_max(row, n);
      if (kb == 0) {
        m[r] = bmax;
        l[r] = 0.0f;
      } else if (bmax > m[r]) {  // rescale what earlier blocks added to the new maximum
        const float alpha = fast_exp(m[r] - bmax);
        l[r] *= alpha;
        float* orow = ob + static_cast<size_t>(r) * h.o_ld;
        for (int c = 0; c < hs; c++) orow[c] *= alpha;
        m[r] = bmax;
      }
      const float mr = m[r];
      for (int j = 0; j < n; j++) row[j] = fast_exp(row[j] - mr);
      for (int j = n; j < bc; j++) row[j] = 0.0f;
      l[r] += lane_sum(row, n);
    }
    // o rows (br, hs) (+)= P (br, bc) @ V_kb (bc, hs)
    product(products, false, false, br, hs, bc, 1.0f, s, kLd, h.v + static_cast<size_t>(c0) * h.kv_ld, h.kv_ld,
            kb != 0, ob, h.o_ld);
  }
  for (int r = 0; r < br; r++) {
    float* orow = ob + static_cast<size_t>(r) * h.o_ld;
    for (int c = 0; c < hs; c++) orow[c] /= l[r];
    lse[r0 + r] = m[r] + std::log(l[r]);
  }
}

void attention_backward_head(const HeadRows& h, const float* o, const float* dout, const float* lse, float* dq,
                             float* dk, float* dv, int T, int hs, float* lane, AttentionProducts products) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int block = attention_block(hs);
  float* p = lane;                  // (br, kLd) probabilities
  float* ds = lane + kLd * kLd;     // (br, kLd) dP, then dS
  float* dsum = ds + kLd * kLd;     // (br) D = rowsum(dO * O) = rowsum(P * dP)
  const int blocks = (T + block - 1) / block;
  for (int qb = 0; qb < blocks; qb++) {
    const int r0 = qb * block;
    const int br = std::min(block, T - r0);
    const float* q_i = h.q + static_cast<size_t>(r0) * h.q_ld;
    const float* do_i = dout + static_cast<size_t>(r0) * h.o_ld;
    float* dq_i = dq + static_cast<size_t>(r0) * h.q_ld;
    for (int r = 0; r < br; r++) {
      dsum[r] = lane_dot(do_i + static_cast<size_t>(r) * h.o_ld, o + static_cast<size_t>(r0 + r) * h.o_ld, hs);
    }
    for (int kb = 0; kb <= qb; kb++) {
      const int c0 = kb * block;
      const int bc = std::min(block, T - c0);
      const float* k_j = h.k + static_cast<size_t>(c0) * h.kv_ld;
      const float* v_j = h.v + static_cast<size_t>(c0) * h.kv_ld;
      block_scores(products, p, h, r0, br, c0, bc, hs, scale);
      for (int r = 0; r < br; r++) {
        float* row = p + static_cast<size_t>(r) * kLd;
        const int n = visible(qb, kb, r, bc);
        const float lr = lse[r0 + r];
        for (int j = 0; j < n; j++) row[j] = fast_exp(row[j] - lr);
        for (int j = n; j < bc; j++) row[j] = 0.0f;
      }
      // dV_j (bc, hs) += P^T @ dO_i
      product(products, true, false, bc, hs, br, 1.0f, p, kLd, do_i, h.o_ld, true,
              dv + static_cast<size_t>(c0) * h.kv_ld, h.kv_ld);
      // dP (br, bc) = dO_i @ V_j^T, then dS = P * (dP - D) times the score scale
      product(products, false, true, br, bc, hs, 1.0f, do_i, h.o_ld, v_j, h.kv_ld, false, ds, kLd);
      for (int r = 0; r < br; r++) {
        const float* prow = p + static_cast<size_t>(r) * kLd;
        float* srow = ds + static_cast<size_t>(r) * kLd;
        const float d = dsum[r];
        for (int j = 0; j < bc; j++) srow[j] = prow[j] * (srow[j] - d) * scale;
      }
      // dQ_i (br, hs) (+)= dS @ K_j ; dK_j (bc, hs) += dS^T @ Q_i
      product(products, false, false, br, hs, bc, 1.0f, ds, kLd, k_j, h.kv_ld, kb != 0, dq_i, h.q_ld);
      product(products, true, false, bc, hs, br, 1.0f, ds, kLd, q_i, h.q_ld, true,
              dk + static_cast<size_t>(c0) * h.kv_ld, h.kv_ld);
    }
  }
}

void attention_backward_head_reference(const HeadRows& h, const float* dout, float* dq, float* dk, float* dv,
                                       int T, int hs) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  std::vector<float> p(T), dp(T);
  for (int t = 0; t < T; t++) {
    const float* qt = h.q + static_cast<size_t>(t) * h.q_ld;
    const float* dot = dout + static_cast<size_t>(t) * h.o_ld;
    float maxv = -INFINITY;
    for (int u = 0; u <= t; u++) {
      const float* ku = h.k + static_cast<size_t>(u) * h.kv_ld;
      float s = 0.0f;
      for (int i = 0; i < hs; i++) s += qt[i] * ku[i];
      p[u] = s * scale;
      maxv = std::max(maxv, p[u]);
    }
    float sum = 0.0f;
    for (int u = 0; u <= t; u++) sum += (p[u] = std::exp(p[u] - maxv));
    float d = 0.0f;  // rowsum(P * dP)
    for (int u = 0; u <= t; u++) {
      const float* vu = h.v + static_cast<size_t>(u) * h.kv_ld;
      p[u] /= sum;
      float s = 0.0f;
      for (int i = 0; i < hs; i++) s += dot[i] * vu[i];
      dp[u] = s;
      d += p[u] * s;
    }
    float* dqt = dq + static_cast<size_t>(t) * h.q_ld;
    for (int i = 0; i < hs; i++) dqt[i] = 0.0f;
    for (int u = 0; u <= t; u++) {
      const float dsu = p[u] * (dp[u] - d) * scale;
      const float* ku = h.k + static_cast<size_t>(u) * h.kv_ld;
      float* dku = dk + static_cast<size_t>(u) * h.kv_ld;
      float* dvu = dv + static_cast<size_t>(u) * h.kv_ld;
      for (int i = 0; i < hs; i++) {
        dqt[i] += dsu * ku[i];
        dku[i] += dsu * qt[i];
        dvu[i] += p[u] * dot[i];
      }
    }
  }
}

}  // namespace zinf::model::kernels::detail
