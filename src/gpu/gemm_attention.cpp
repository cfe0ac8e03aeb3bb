// The GEMM attention's products as Gemm descriptions (host code, shared by gemm_attention.cu
// and the host tests that evaluate them with a scalar reference of cuBLASLt's contract).
// Row-major X (r, c) with row stride ld is column-major X^T (c, r) with the same ld.
#include <algorithm>
#include <atomic>
#include <cmath>

#include "gpu/gemm_attention.h"

#include <string>

#include "zinf/log.h"

namespace zinf::gpu::gemm_attn {

float score_scale(int hs) { return 1.0f / std::sqrt(static_cast<float>(hs)); }  // as the CPU kernels

namespace {
std::atomic<long long> g_fallbacks{0};
}  // namespace

long long flash_fallbacks() { return g_fallbacks.load(); }

void notice_flash_fallback(const Status& why) {
  g_fallbacks++;
  log_once(LogLevel::kNotice, "gpu gemm attention unsupported",
           "gpu: cuBLASLt has no algorithm for a GEMM attention product, the flash attention kernels run instead (" +
               why.message() + ")");
}

Batch batch_for(const GemmAttentionPlan& p, int g0, int unit, int block) {
  const int groups = p.B * p.NKV;
  const int t0 = block * p.time_block;
  const int t1 = std::min(t0 + p.time_block, p.T);
  return Batch{g0, std::min(p.chunk, groups - g0), unit, t0, t1, !(unit == 0 && t1 == p.T)};
}

std::size_t q_rows0(const GemmAttentionPlan& p, int g, int unit, int t0) {
  const std::size_t hpu = static_cast<std::size_t>(p.heads_per_unit);
  const std::size_t row = (static_cast<std::size_t>(g) * p.G + static_cast<std::size_t>(unit) * hpu) *
                              static_cast<std::size_t>(p.T) +
                          static_cast<std::size_t>(t0) * hpu;
  return row * static_cast<std::size_t>(p.ld_hs);
}
std::size_t kv_rows0(const GemmAttentionPlan& p, int g) {
  return static_cast<std::size_t>(g) * static_cast<std::size_t>(p.T) * static_cast<std::size_t>(p.ld_hs);
}
long long q_stride(const GemmAttentionPlan& p) { return static_cast<long long>(p.G) * p.T * p.ld_hs; }
long long kv_stride(const GemmAttentionPlan& p) { return static_cast<long long>(p.T) * p.ld_hs; }
long long block_rows(const Batch& b, const GemmAttentionPlan& p) {
  return static_cast<long long>(b.t1 - b.t0) * p.heads_per_unit;
}
long long score_stride(const Batch& b, const GemmAttentionPlan& p) { return block_rows(b, p) * p.ld_t; }

// Scores^T (t1, rows) column-major = op(Y^T stored (hs, t1)) @ X^T (hs, rows).
Gemm scores_gemm(const GemmAttentionPlan& p, const Batch& b, float* d, const bf16* x, const bf16* y, const char* what) {
  Gemm g;
  g.what = what;
  g.trans_a = true;
  g.m = b.t1;
  g.n = static_cast<int>(block_rows(b, p));
  g.k = p.hs;
  g.a = y + kv_rows0(p, b.g0);
  g.lda = p.ld_hs;
  g.stride_a = kv_stride(p);
  g.b = x + q_rows0(p, b.g0, b.unit, b.t0);
  g.ldb = p.ld_hs;
  g.stride_b = q_stride(p);
  g.d = d;
  g.ldd = p.ld_t;
  g.stride_d = score_stride(b, p);
  g.d_type = GemmOutput::kF32;
  g.batch = b.groups;
  return g;
}

// out^T (hs, rows) = Y^T (hs, t1; Y's rows as stored) @ W^T (t1, rows; W's rows as stored).
Gemm rows_gemm(const GemmAttentionPlan& p, const Batch& b, bf16* out, const bf16* w, const bf16* y, float alpha,
               const char* what) {
  Gemm g;
  g.what = what;
  g.m = p.hs;
  g.n = static_cast<int>(block_rows(b, p));
  g.k = b.t1;
  g.a = y + kv_rows0(p, b.g0);
  g.lda = p.ld_hs;
  g.stride_a = kv_stride(p);
  g.b = w;
  g.ldb = p.ld_t;
  g.stride_b = score_stride(b, p);
  g.d = out + q_rows0(p, b.g0, b.unit, b.t0);
  g.ldd = p.ld_hs;
  g.stride_d = q_stride(p);
  g.d_type = GemmOutput::kBf16;
  g.alpha = alpha;
  g.batch = b.groups;
  return g;
}

// out^T (hs, t1) = X^T (hs, rows) @ W (rows, t1), W stored (t1, rows) column-major (transposed).
Gemm keys_gemm(const GemmAttentionPlan& p, const Batch& b, float* out, const bf16* w, const bf16* x, float alpha,
               const char* what) {
  Gemm g;
  g.what = what;
  g.trans_b = true;
  g.m = p.hs;
  g.n = b.t1;
  g.k = static_cast<int>(block_rows(b, p));
  g.a = x + q_rows0(p, b.g0, b.unit, b.t0);
  g.lda = p.ld_hs;
  g.stride_a = q_stride(p);
  g.b = w;
  g.ldb = p.ld_t;
  g.stride_b = score_stride(b, p);
  float* d = out + kv_rows0(p, b.g0);
  g.d = d;
  g.ldd = p.ld_hs;
  g.stride_d = kv_stride(p);
  g.d_type = GemmOutput::kF32;
  g.alpha = alpha;
  if (b.accumulate) {  // earlier units and blocks are summed in: fp32, in a fixed order
    g.c = d;
    g.ldc = p.ld_hs;
    g.stride_c = kv_stride(p);
    g.beta = 1.0f;
  }
  g.batch = b.groups;
  return g;
}

}  // namespace zinf::gpu::gemm_attn
