// Causal attention on cuBLASLt tensor-core products: head-major copies, strided-batched GEMMs
// over the kv groups of a chunk, and warp-per-row kernels for the masked softmax and the score
// gradient (the per-row arithmetic is attention_math.h's, shared with the host tests).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "gpu/attention_math.h"
#include "gpu/gemm_attention.h"
#include "gpu/kernel_util.cuh"
#include "gpu/tc_attention.h"

namespace zinf::gpu {
// Kernel parameter types: outside the anonymous namespace (nvcc's host stubs must name them).
namespace gemm_attn {

// What a row kernel launch covers (attention_math.h block_position, block_global_row): `rows`
// rows, block_rows per kv group from g0, of the unit of `heads` query heads from head0, query
// positions [t0, t1) against keys [0, t1); score rows ld_t apart.
struct RowMap {
  long long rows;
  long long block_rows;
  int heads, head0, g0, t0, t1, T, G, ld_t;
};

}  // namespace gemm_attn

namespace {

using detail::kFullMask;
using detail::to_bf16;
using detail::to_f32;
using detail::warp_sum;
using gemm_attn::Batch;
using gemm_attn::keys_gemm;
using gemm_attn::rows_gemm;
using gemm_attn::RowMap;
using gemm_attn::scores_gemm;
using gemm_attn::batch_for;

constexpr int kRowWarps = 8;
constexpr int kRowThreads = kRowWarps * 32;

// Where element (b, t, head h, column d) of a (B,T,H*hs) tensor lives in its head-major copy:
// the heads in units of `hpu`, a unit's rows ordered (t, head): row
// (b*H + h - h % hpu) * T + t * hpu + h % hpu (hpu 1: head-major (b, h, t)).
struct HeadIndex {
  std::size_t src;  // (b*T + t) * ld + h*hs + d
  std::size_t dst;  // row * ld_hs + d
};
__device__ __forceinline__ HeadIndex head_index(std::size_t i, std::size_t ld, int T, int H, int hs, int hpu,
                                                int ld_hs) {
  const std::size_t d = i % static_cast<std::size_t>(hs);
  const std::size_t rest = i / static_cast<std::size_t>(hs);
  const std::size_t h = rest % static_cast<std::size_t>(H);
  const std::size_t bt = rest / static_cast<std::size_t>(H);
  const std::size_t t = bt % static_cast<std::size_t>(T);
  const std::size_t b = bt / static_cast<std::size_t>(T);
  const std::size_t hu = h % static_cast<std::size_t>(hpu);
  const std::size_t row = (b * static_cast<std::size_t>(H) + h - hu) * static_cast<std::size_t>(T) +
                          t * static_cast<std::size_t>(hpu) + hu;
  return HeadIndex{bt * ld + h * static_cast<std::size_t>(hs) + d, row * static_cast<std::size_t>(ld_hs) + d};
}

// The head-major copy of a (B,T,H*hs) tensor with rows src_ld apart.
__global__ void gather_heads_kernel(bf16* dst, const bf16* src, std::size_t src_ld, int T, int H, int hs, int hpu,
                                    int ld_hs, std::size_t total) {
  for (std::size_t i = detail::grid_start(); i < total; i += detail::grid_stride()) {
    const HeadIndex x = head_index(i, src_ld, T, H, hs, hpu, ld_hs);
    dst[x.dst] = src[x.src];
  }
}

// The inverse, rounding to bf16.
template <typename Src>
__global__ void scatter_heads_kernel(bf16* dst, std::size_t dst_ld, const Src* src, int T, int H, int hs, int hpu,
                                     int ld_hs, std::size_t total) {
  for (std::size_t i = detail::grid_start(); i < total; i += detail::grid_stride()) {
    const HeadIndex x = head_index(i, dst_ld, T, H, hs, hpu, ld_hs);
    dst[x.src] = to_bf16(to_f32(src[x.dst]));
  }
}

// dsum[(b*NH + h)*T + t] = dout . out over head h's hs columns (rows o_ld apart); one warp per row.
__global__ void row_dot_kernel(float* dsum, const bf16* dout, const bf16* out, std::size_t o_ld, int T, int NH,
                               int hs, long long rows) {
  const long long idx = static_cast<long long>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (idx >= rows) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const long long bh = idx / T;
  const long long t = idx % T;
  const long long b = bh / NH;
  const long long h = bh % NH;
  const std::size_t base = static_cast<std::size_t>(b * T + t) * o_ld + static_cast<std::size_t>(h * hs);
  float acc = 0.0f;
  for (int d = lane; d < hs; d += 32) acc += to_f32(dout[base + d]) * to_f32(out[base + d]);
  acc = warp_sum(acc);
  if (lane == 0) dsum[idx] = acc;
}

__device__ __forceinline__ long long global_row(const RowMap& m, long long R) {
  return attn::block_global_row(R, m.block_rows, m.heads, m.t0, m.T, m.G, m.g0, m.head0);
}
__device__ __forceinline__ int position(const RowMap& m, long long R) {
  return attn::block_position(R, m.block_rows, m.heads, m.t0);
}

// One warp per stacked row: lse and P = exp(S*scale - lse) (0 where masked), as
// attn::softmax_row_on_host.
__global__ void __launch_bounds__(kRowThreads)
    softmax_rows_kernel(bf16* P, float* lse, const float* S, RowMap m, float scale) {
  const long long R = static_cast<long long>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (R >= m.rows) return;  // the same for the whole warp
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int pos = position(m, R);
  const float* s = S + static_cast<std::size_t>(R) * static_cast<std::size_t>(m.ld_t);
  bf16* p = P + static_cast<std::size_t>(R) * static_cast<std::size_t>(m.ld_t);
  attn::SoftmaxStats st = attn::stats_empty();
  for (int j = lane; j < m.t1 && attn::key_visible(j, pos); j += 32) st = attn::stats_add(st, s[j] * scale);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const attn::SoftmaxStats other{__shfl_xor_sync(kFullMask, st.m, o), __shfl_xor_sync(kFullMask, st.l, o)};
    st = attn::stats_merge(st, other);
  }
  const float row_lse = attn::stats_lse(st);
  for (int j = lane; j < m.t1; j += 32) {
    p[j] = attn::key_visible(j, pos) ? to_bf16(attn::softmax_prob(s[j], scale, row_lse)) : to_bf16(0.0f);
  }
  if (lane == 0) lse[global_row(m, R)] = row_lse;
}

// One warp per stacked row: P recomputed from lse and dS = P * (dP - D), both 0 where masked,
// as attn::score_grad_row_on_host.
__global__ void __launch_bounds__(kRowThreads)
    score_grad_rows_kernel(bf16* P, bf16* dS, const float* S, const float* dP, const float* lse, const float* dsum,
                           RowMap m, float scale) {
  const long long R = static_cast<long long>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (R >= m.rows) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int pos = position(m, R);
  const long long gr = global_row(m, R);
  const float row_lse = lse[gr];
  const float d = dsum[gr];
  const std::size_t at = static_cast<std::size_t>(R) * static_cast<std::size_t>(m.ld_t);
  for (int j = lane; j < m.t1; j += 32) {
    float p = 0.0f;
    float ds = 0.0f;
    if (attn::key_visible(j, pos)) {
      p = attn::softmax_prob(S[at + j], scale, row_lse);
      ds = attn::score_grad(p, dP[at + j], d);
    }
    P[at + j] = to_bf16(p);
    dS[at + j] = to_bf16(ds);
  }
}

// Where one call's tensors live (as flash_attention.cu's AttnTensors): head h of row (b, t) of
// q at (b*T + t) * q_ld + h*hs; kv head g of k, v at (b*T + t) * kv_ld + g*hs; out, dout at
// (b*T + t) * o_ld + h*hs.
struct Views {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  std::size_t q_ld, kv_ld, o_ld;
};

struct Call {
  const GemmAttentionPlan& p;
  char* base;
  const char* name;
  std::initializer_list<Dim> dims;
  cudaStream_t stream;

  template <typename T>
  T* at(std::size_t off) const {
    return reinterpret_cast<T*>(base + off);
  }
};

// hpu: heads_per_unit for the query side, 1 for k, v.
Status gather(const Call& c, bf16* dst, const bf16* src, std::size_t src_ld, int H, int hpu) {
  const std::size_t total = static_cast<std::size_t>(c.p.B) * H * c.p.T * c.p.hs;
  gather_heads_kernel<<<grid_for(total, kThreads), kThreads, 0, c.stream>>>(dst, src, src_ld, c.p.T, H, c.p.hs, hpu,
                                                                            c.p.ld_hs, total);
  return launched((std::string(c.name) + " (head-major copy)").c_str(), c.dims);
}

template <typename Src>
Status scatter(const Call& c, bf16* dst, std::size_t dst_ld, const Src* src, int H, int hpu) {
  const std::size_t total = static_cast<std::size_t>(c.p.B) * H * c.p.T * c.p.hs;
  scatter_heads_kernel<Src><<<grid_for(total, kThreads), kThreads, 0, c.stream>>>(dst, dst_ld, src, c.p.T, H, c.p.hs,
                                                                                  hpu, c.p.ld_hs, total);
  return launched((std::string(c.name) + " (copy back)").c_str(), c.dims);
}

RowMap row_map(const GemmAttentionPlan& p, const Batch& b) {
  const long long rows = gemm_attn::block_rows(b, p);
  return RowMap{b.groups * rows, rows, p.heads_per_unit, b.unit * p.heads_per_unit, b.g0, b.t0, b.t1, p.T, p.G,
                p.ld_t};
}

unsigned row_blocks(long long rows) { return static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps); }

Status check_scratch(const GemmAttentionPlan& p, AttentionScratch scratch, const char* name,
                     std::initializer_list<Dim> dims) {
  if (scratch.base == nullptr || reinterpret_cast<std::uintptr_t>(scratch.base) % 256 != 0) {
    return bad_sizes(name, dims, "scratch must be non-null and 256-byte aligned");
  }
  if (scratch.bytes < p.bytes) {
    return bad_sizes(name, dims, ("scratch of " + std::to_string(scratch.bytes) + " bytes holds less than D's " +
                                  std::to_string(p.bytes))
                                     .c_str());
  }
  return Status::ok();
}

Status forward_gemm(Blas& blas, const Call& c, bf16* out, float* lse, const Views& v) {
  const GemmAttentionPlan& p = c.p;
  bf16* qh = c.at<bf16>(p.q_off);
  bf16* kh = c.at<bf16>(p.k_off);
  bf16* vh = c.at<bf16>(p.v_off);
  bf16* oh = c.at<bf16>(p.o_off);
  float* S = c.at<float>(p.s_off);
  bf16* P = c.at<bf16>(p.p_off);
  ZINF_RETURN_IF_ERROR(gather(c, qh, v.q, v.q_ld, p.NH, p.heads_per_unit));
  ZINF_RETURN_IF_ERROR(gather(c, kh, v.k, v.kv_ld, p.NKV, 1));
  ZINF_RETURN_IF_ERROR(gather(c, vh, v.v, v.kv_ld, p.NKV, 1));
  const float scale = gemm_attn::score_scale(p.hs);
  const int groups = p.B * p.NKV;
  const std::string softmax = std::string(c.name) + " (softmax)";
  for (int g0 = 0; g0 < groups; g0 += p.chunk) {
    for (int unit = 0; unit < p.units_per_group; unit++) {
      for (int block = p.time_blocks - 1; block >= 0; block--) {
        const Batch b = batch_for(p, g0, unit, block);
        ZINF_RETURN_IF_ERROR(blas.matmul(scores_gemm(p, b, S, qh, kh, "attention S = Q K^T"), c.stream));
        const RowMap m = row_map(p, b);
        softmax_rows_kernel<<<row_blocks(m.rows), kRowThreads, 0, c.stream>>>(P, lse, S, m, scale);
        ZINF_RETURN_IF_ERROR(launched(softmax.c_str(), c.dims));
        ZINF_RETURN_IF_ERROR(blas.matmul(rows_gemm(p, b, oh, P, vh, 1.0f, "attention O = P V"), c.stream));
      }
    }
  }
  return scatter(c, out, v.o_ld, static_cast<const bf16*>(oh), p.NH, p.heads_per_unit);
}

Status backward_gemm(Blas& blas, const Call& c, bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const Views& v,
                     const bf16* out, const float* lse) {
  const GemmAttentionPlan& p = c.p;
  float* dsum = c.at<float>(p.d_off);
  bf16* qh = c.at<bf16>(p.q_off);
  bf16* kh = c.at<bf16>(p.k_off);
  bf16* vh = c.at<bf16>(p.v_off);
  bf16* doh = c.at<bf16>(p.o_off);
  bf16* dqh = c.at<bf16>(p.dq_off);
  float* dkh = c.at<float>(p.dk_off);
  float* dvh = c.at<float>(p.dv_off);
  float* S = c.at<float>(p.s_off);
  float* dP = c.at<float>(p.dp_off);
  bf16* P = c.at<bf16>(p.p_off);
  bf16* dS = c.at<bf16>(p.ds_off);
  const long long rows = static_cast<long long>(p.B) * p.NH * p.T;
  row_dot_kernel<<<row_blocks(rows), kRowThreads, 0, c.stream>>>(dsum, dout, out, v.o_ld, p.T, p.NH, p.hs, rows);
  ZINF_RETURN_IF_ERROR(launched((std::string(c.name) + " (row sums)").c_str(), c.dims));
  ZINF_RETURN_IF_ERROR(gather(c, qh, v.q, v.q_ld, p.NH, p.heads_per_unit));
  ZINF_RETURN_IF_ERROR(gather(c, kh, v.k, v.kv_ld, p.NKV, 1));
  ZINF_RETURN_IF_ERROR(gather(c, vh, v.v, v.kv_ld, p.NKV, 1));
  ZINF_RETURN_IF_ERROR(gather(c, doh, dout, v.o_ld, p.NH, p.heads_per_unit));
  const float scale = gemm_attn::score_scale(p.hs);
  const int groups = p.B * p.NKV;
  const std::string grad = std::string(c.name) + " (score gradient)";
  for (int g0 = 0; g0 < groups; g0 += p.chunk) {
    for (int unit = 0; unit < p.units_per_group; unit++) {
      for (int block = p.time_blocks - 1; block >= 0; block--) {
        const Batch b = batch_for(p, g0, unit, block);
        ZINF_RETURN_IF_ERROR(blas.matmul(scores_gemm(p, b, S, qh, kh, "attention S = Q K^T"), c.stream));
        ZINF_RETURN_IF_ERROR(blas.matmul(scores_gemm(p, b, dP, doh, vh, "attention dP = dO V^T"), c.stream));
        const RowMap m = row_map(p, b);
        score_grad_rows_kernel<<<row_blocks(m.rows), kRowThreads, 0, c.stream>>>(P, dS, S, dP, lse, dsum, m, scale);
        ZINF_RETURN_IF_ERROR(launched(grad.c_str(), c.dims));
        ZINF_RETURN_IF_ERROR(blas.matmul(rows_gemm(p, b, dqh, dS, kh, scale, "attention dQ = dS K"), c.stream));
        ZINF_RETURN_IF_ERROR(blas.matmul(keys_gemm(p, b, dkh, dS, qh, scale, "attention dK = dS^T Q"), c.stream));
        ZINF_RETURN_IF_ERROR(blas.matmul(keys_gemm(p, b, dvh, P, doh, 1.0f, "attention dV = P^T dO"), c.stream));
      }
    }
  }
  ZINF_RETURN_IF_ERROR(scatter(c, dq, v.q_ld, static_cast<const bf16*>(dqh), p.NH, p.heads_per_unit));
  ZINF_RETURN_IF_ERROR(scatter(c, dk, v.kv_ld, static_cast<const float*>(dkh), p.NKV, 1));
  return scatter(c, dv, v.kv_ld, static_cast<const float*>(dvh), p.NKV, 1);
}

// Which kernels take a call (tc_attention.h attention_path_for): tc_attention_supports() is asked
// only where the tensor-core path may run.
AttentionPath choose_path(const TcAttentionTensors& a, std::initializer_list<const void*> more) {
  const AttentionPath requested = requested_attention_path();
  if (requested == AttentionPath::kGemm || requested == AttentionPath::kFlash) return requested;
  return attention_path_for(requested, tc_attention_supports(a, more));
}

}  // namespace

Status gemm_attention_forward(Blas& blas, AttentionScratch scratch, bf16* out, float* lse, const bf16* qkv, int B,
                              int T, int C, int NH, cudaStream_t stream) {
  ZINF_RETURN_IF_ERROR(attention_geometry(B, T, C, NH).status());
  const int hs = C / NH;
  ZINF_ASSIGN_OR_RETURN(const GemmAttentionPlan p, gemm_attention_plan(B, T, NH, NH, hs, scratch.bytes));
  const auto dims = {Dim{"B", B}, Dim{"T", T}, Dim{"C", C}, Dim{"NH", NH}};
  const TcAttentionTensors tca = tc_packed_qkv(qkv, B, T, C, NH);
  switch (choose_path(tca, {})) {
    case AttentionPath::kTensorCore:
      ZINF_RETURN_IF_ERROR(check_scratch(p, scratch, "gemm_attention_forward", dims));
      count_tc_attention_call();
      return tc_attention_forward(out, lse, tca, stream);
    case AttentionPath::kFlash: return attention_forward(out, lse, qkv, B, T, C, NH, stream);
    default: break;
  }
  if (p.heads_per_unit == 0) return attention_forward(out, lse, qkv, B, T, C, NH, stream);
  ZINF_RETURN_IF_ERROR(check_scratch(p, scratch, "gemm_attention_forward", dims));
  const std::size_t c = static_cast<std::size_t>(C);
  const Views v{qkv, qkv + c, qkv + 2 * c, 3 * c, 3 * c, c};
  const Call call{p, static_cast<char*>(scratch.base), "gemm_attention_forward", dims, stream};
  const Status st = forward_gemm(blas, call, out, lse, v);
  if (st.code() != ErrorCode::kUnsupported) return st;
  gemm_attn::notice_flash_fallback(st);
  return attention_forward(out, lse, qkv, B, T, C, NH, stream);
}

Status gemm_attention_backward(Blas& blas, AttentionScratch scratch, bf16* dqkv, const bf16* dout, const bf16* qkv,
                               const bf16* out, const float* lse, int B, int T, int C, int NH, cudaStream_t stream) {
  ZINF_RETURN_IF_ERROR(attention_geometry(B, T, C, NH).status());
  const int hs = C / NH;
  ZINF_ASSIGN_OR_RETURN(const GemmAttentionPlan p, gemm_attention_plan(B, T, NH, NH, hs, scratch.bytes));
  const auto dims = {Dim{"B", B}, Dim{"T", T}, Dim{"C", C}, Dim{"NH", NH}};
  ZINF_RETURN_IF_ERROR(check_scratch(p, scratch, "gemm_attention_backward", dims));
  const std::size_t c = static_cast<std::size_t>(C);
  const TcAttentionTensors tca = tc_packed_qkv(qkv, B, T, C, NH);
  switch (choose_path(tca, {dout})) {
    case AttentionPath::kTensorCore:
      count_tc_attention_call();
      return tc_attention_backward(TcAttentionGrads{dqkv, dqkv + c, dqkv + 2 * c}, static_cast<float*>(scratch.base),
                                   dout, out, lse, tca, stream);
    case AttentionPath::kFlash:
      return attention_backward(dqkv, static_cast<float*>(scratch.base), dout, qkv, out, lse, B, T, C, NH, stream);
    default: break;
  }
  if (p.heads_per_unit == 0) {
    return attention_backward(dqkv, static_cast<float*>(scratch.base), dout, qkv, out, lse, B, T, C, NH, stream);
  }
  const Views v{qkv, qkv + c, qkv + 2 * c, 3 * c, 3 * c, c};
  const Call call{p, static_cast<char*>(scratch.base), "gemm_attention_backward", dims, stream};
  const Status st = backward_gemm(blas, call, dqkv, dqkv + c, dqkv + 2 * c, dout, v, out, lse);
  if (st.code() != ErrorCode::kUnsupported) return st;
  gemm_attn::notice_flash_fallback(st);
  return attention_backward(dqkv, static_cast<float*>(scratch.base), dout, qkv, out, lse, B, T, C, NH, stream);
}

Status gemm_gqa_attention_forward(Blas& blas, AttentionScratch scratch, bf16* out, float* lse, const bf16* q,
                                  const bf16* k, const bf16* v, const GqaShape& s, cudaStream_t stream) {
  ZINF_RETURN_IF_ERROR(gqa_attention_geometry(s.B, s.T, s.NH, s.NKV, s.hs).status());
  ZINF_ASSIGN_OR_RETURN(const GemmAttentionPlan p, gemm_attention_plan(s.B, s.T, s.NH, s.NKV, s.hs, scratch.bytes));
  const auto dims = {Dim{"B", s.B}, Dim{"T", s.T}, Dim{"NH", s.NH}, Dim{"NKV", s.NKV}, Dim{"hs", s.hs}};
  const TcAttentionTensors tca = tc_separate_qkv(q, k, v, s);
  switch (choose_path(tca, {})) {
    case AttentionPath::kTensorCore:
      ZINF_RETURN_IF_ERROR(check_scratch(p, scratch, "gemm_gqa_attention_forward", dims));
      count_tc_attention_call();
      return tc_attention_forward(out, lse, tca, stream);
    case AttentionPath::kFlash: return gqa_attention_forward(out, lse, q, k, v, s, stream);
    default: break;
  }
  if (p.heads_per_unit == 0) return gqa_attention_forward(out, lse, q, k, v, s, stream);
  ZINF_RETURN_IF_ERROR(check_scratch(p, scratch, "gemm_gqa_attention_forward", dims));
  const std::size_t qw = static_cast<std::size_t>(s.NH) * s.hs;
  const std::size_t kvw = static_cast<std::size_t>(s.NKV) * s.hs;
  const Views views{q, k, v, qw, kvw, qw};
  const Call call{p, static_cast<char*>(scratch.base), "gemm_gqa_attention_forward", dims, stream};
  const Status st = forward_gemm(blas, call, out, lse, views);
  if (st.code() != ErrorCode::kUnsupported) return st;
  gemm_attn::notice_flash_fallback(st);
  return gqa_attention_forward(out, lse, q, k, v, s, stream);
}

Status gemm_gqa_attention_backward(Blas& blas, AttentionScratch scratch, bf16* dq, bf16* dk, bf16* dv,
                                   const bf16* dout, const bf16* q, const bf16* k, const bf16* v, const bf16* out,
                                   const float* lse, const GqaShape& s, cudaStream_t stream) {
  ZINF_RETURN_IF_ERROR(gqa_attention_geometry(s.B, s.T, s.NH, s.NKV, s.hs).status());
  ZINF_ASSIGN_OR_RETURN(const GemmAttentionPlan p, gemm_attention_plan(s.B, s.T, s.NH, s.NKV, s.hs, scratch.bytes));
  const auto dims = {Dim{"B", s.B}, Dim{"T", s.T}, Dim{"NH", s.NH}, Dim{"NKV", s.NKV}, Dim{"hs", s.hs}};
  ZINF_RETURN_IF_ERROR(check_scratch(p, scratch, "gemm_gqa_attention_backward", dims));
  const TcAttentionTensors tca = tc_separate_qkv(q, k, v, s);
  switch (choose_path(tca, {dout})) {
    case AttentionPath::kTensorCore:
      count_tc_attention_call();
      return tc_attention_backward(TcAttentionGrads{dq, dk, dv}, static_cast<float*>(scratch.base), dout, out, lse,
                                   tca, stream);
    case AttentionPath::kFlash:
      return gqa_attention_backward(dq, dk, dv, static_cast<float*>(scratch.base), dout, q, k, v, out, lse, s, stream);
    default: break;
  }
  if (p.heads_per_unit == 0) {
    return gqa_attention_backward(dq, dk, dv, static_cast<float*>(scratch.base), dout, q, k, v, out, lse, s, stream);
  }
  const std::size_t qw = static_cast<std::size_t>(s.NH) * s.hs;
  const std::size_t kvw = static_cast<std::size_t>(s.NKV) * s.hs;
  const Views views{q, k, v, qw, kvw, qw};
  const Call call{p, static_cast<char*>(scratch.base), "gemm_gqa_attention_backward", dims, stream};
  const Status st = backward_gemm(blas, call, dq, dk, dv, dout, views, out, lse);
  if (st.code() != ErrorCode::kUnsupported) return st;
  gemm_attn::notice_flash_fallback(st);
  return gqa_attention_backward(dq, dk, dv, static_cast<float*>(scratch.base), dout, q, k, v, out, lse, s, stream);
}

}  // namespace zinf::gpu
