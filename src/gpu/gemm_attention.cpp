// The GEMM attention's products as Gemm descriptions (host code, shared by gemm_attention.cu
// and the host tests that evaluate them with a scalar reference of cuBLASLt's contract).
#include <cmath>

#include "gpu/gemm_attention.h"

namespace zinf::gpu::gemm_attn {

float score_scale(int hs) { return 1.0f / std::sqrt(static_cast<float>(hs)); }  // as the CPU kernels

// Element offsets of the first row of (group g, unit u) in the head-major query-side copies
// (q, out/dout, dq) and of group g in the kv-side copies (k, v, dk, dv).
std::size_t q_rows0(const GemmAttentionPlan& p, int g, int unit) {
  return (static_cast<std::size_t>(g) * p.G + static_cast<std::size_t>(unit) * p.heads_per_unit) *
         static_cast<std::size_t>(p.T) * static_cast<std::size_t>(p.ld_hs);
}
std::size_t kv_rows0(const GemmAttentionPlan& p, int g) {
  return static_cast<std::size_t>(g) * static_cast<std::size_t>(p.T) * static_cast<std::size_t>(p.ld_hs);
}
long long q_stride(const GemmAttentionPlan& p) { return static_cast<long long>(p.G) * p.T * p.ld_hs; }
long long kv_stride(const GemmAttentionPlan& p) { return static_cast<long long>(p.T) * p.ld_hs; }
int unit_rows(const GemmAttentionPlan& p) { return p.heads_per_unit * p.T; }
long long score_stride(const GemmAttentionPlan& p) { return static_cast<long long>(unit_rows(p)) * p.ld_t; }

// Row-major scores (M, T) of ld_t, fp32, = X (M, hs) @ Y (T, hs)^T: in cuBLASLt's column-major
// terms D^T (T, M) = op(Y^T stored (hs, T)) @ X^T (hs, M). X is query-side, Y kv-side.
Gemm scores_gemm(const GemmAttentionPlan& p, const Batch& b, float* d, const bf16* x, const bf16* y, const char* what) {
  Gemm g;
  g.what = what;
  g.trans_a = true;
  g.m = p.T;
  g.n = unit_rows(p);
  g.k = p.hs;
  g.a = y + kv_rows0(p, b.g0);
  g.lda = p.ld_hs;
  g.stride_a = kv_stride(p);
  g.b = x + q_rows0(p, b.g0, b.unit);
  g.ldb = p.ld_hs;
  g.stride_b = q_stride(p);
  g.d = d;
  g.ldd = p.ld_t;
  g.stride_d = score_stride(p);
  g.d_type = GemmOutput::kF32;
  g.batch = b.groups;
  return g;
}

// Row-major out (M, hs) bf16 = alpha * W (M, T) bf16 scores @ Y (T, hs): D^T (hs, M) = Y^T (hs, T)
// @ W^T (T, M), Y^T being Y's rows as stored.
Gemm rows_gemm(const GemmAttentionPlan& p, const Batch& b, bf16* out, const bf16* w, const bf16* y, float alpha,
               const char* what) {
  Gemm g;
  g.what = what;
  g.m = p.hs;
  g.n = unit_rows(p);
  g.k = p.T;
  g.a = y + kv_rows0(p, b.g0);
  g.lda = p.ld_hs;
  g.stride_a = kv_stride(p);
  g.b = w;
  g.ldb = p.ld_t;
  g.stride_b = score_stride(p);
  g.d = out + q_rows0(p, b.g0, b.unit);
  g.ldd = p.ld_hs;
  g.stride_d = q_stride(p);
  g.d_type = GemmOutput::kBf16;
  g.alpha = alpha;
  g.batch = b.groups;
  return g;
}

// Row-major kv-side (T, hs) fp32 (+)= alpha * W (M, T)^T @ X (M, hs): D^T (hs, T) = X^T (hs, M)
// @ W (M, T), W being stored (T, M) column-major (transposed).
Gemm keys_gemm(const GemmAttentionPlan& p, const Batch& b, float* out, const bf16* w, const bf16* x, float alpha,
               const char* what) {
  Gemm g;
  g.what = what;
  g.trans_b = true;
  g.m = p.hs;
  g.n = p.T;
  g.k = unit_rows(p);
  g.a = x + q_rows0(p, b.g0, b.unit);
  g.lda = p.ld_hs;
  g.stride_a = q_stride(p);
  g.b = w;
  g.ldb = p.ld_t;
  g.stride_b = score_stride(p);
  float* d = out + kv_rows0(p, b.g0);
  g.d = d;
  g.ldd = p.ld_hs;
  g.stride_d = kv_stride(p);
  g.d_type = GemmOutput::kF32;
  g.alpha = alpha;
  if (b.unit > 0) {  // the group's earlier units are summed in: fp32, in head order
    g.c = d;
    g.ldc = p.ld_hs;
    g.stride_c = kv_stride(p);
    g.beta = 1.0f;
  }
  g.batch = b.groups;
  return g;
}

}  // namespace zinf::gpu::gemm_attn
