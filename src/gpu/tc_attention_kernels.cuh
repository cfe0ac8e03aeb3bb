// Internal: the tensor-core attention's kernels (tc_attention.h), device code only, included by
// tc_attention.cu. A header so that tests/gpu/tc_attention_emulation_test.cpp can run the same
// source on a host emulation of the CUDA features it uses (ZINF_TC_EMULATION: threads, barriers,
// shuffles, and mma_sm80.cuh's ldmatrix and mma with their exact register layouts, from
// tests/gpu/cuda_emulation.h). Products are mma.sync m16n8k16 bf16 with fp32 accumulators; the
// scores, P and dS stay in the accumulators' registers (tc_attention_tiles.h's acc_row/acc_col
// say which elements a lane holds), where the softmax and the score gradient are computed and from
// which P and dS, packed to bf16, are the next product's A operand. Shared memory holds only the
// q, k, v, dout tiles, read by ldmatrix.
#pragma once

#include <cmath>
#include <cstdint>

#if !defined(ZINF_TC_EMULATION)
#include "gpu/kernel_util.cuh"
#include "gpu/mma_sm80.cuh"
#endif
#include "gpu/tc_attention.h"
#include "gpu/tc_attention_tiles.h"

// The block's dynamic shared memory (the emulation hands each block a buffer instead).
#if !defined(ZINF_TC_EMULATION)
#define ZINF_TC_DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#endif

namespace zinf::gpu {
namespace {

using detail::kFullMask;
using detail::to_f32;
using mma::ldmatrix_x4;
using mma::ldmatrix_x4_trans;
using mma::mma_bf16_16816;
using mma::pack_bf16x2;
using tc::kFrag;
using tc::kTile;
using tc::kTileFrags;
using tc::SmemLayout;

// ldmatrix and mma.sync with bf16 need sm_80; zinf builds sm_80 and sm_90 (meson.build), and the
// host side refuses devices below 8.0 (tc_attention_supports), so below it the kernels are empty.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define ZINF_TC_KERNEL_BODY 1
#else
#define ZINF_TC_KERNEL_BODY 0
#endif

template <typename T>
__device__ __forceinline__ T* region(unsigned char* smem, std::size_t off) {
  return reinterpret_cast<T*>(smem + off);
}

// kTile rows of one head, rows first .. first + kTile - 1 of `src` (its row t = 0, rows `pitch`
// elements apart), into a (kTile, ld_head) bf16 tile; rows at or past T are zero. 16-byte
// vectors: src and pitch are 16-byte aligned (tc_attention_supports). All threads call it.
template <int HS>
__device__ void load_tile(bf16* dst, const bf16* src, std::size_t pitch, int first, int T) {
  constexpr int kVec = 8;
  constexpr int kPerRow = HS / kVec;
  constexpr int kLd = HS + 8;
  for (int i = static_cast<int>(threadIdx.x); i < kTile * kPerRow; i += tc::kThreads) {
    const int r = i / kPerRow;
    const int c = (i % kPerRow) * kVec;
    const int t = first + r;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (t < T) val = *reinterpret_cast<const uint4*>(src + static_cast<std::size_t>(t) * pitch + c);
    *reinterpret_cast<uint4*>(dst + r * kLd + c) = val;
  }
}

// kTile floats of a (B,NH,T) row vector: rows first .. first + kTile - 1 of head row `bh`; 0 past T.
__device__ void load_row_values(float* dst, const float* src, long long bh, int first, int T) {
  for (int i = static_cast<int>(threadIdx.x); i < kTile; i += tc::kThreads) {
    const int t = first + i;
    dst[i] = t < T ? src[static_cast<std::size_t>(bh) * T + t] : 0.0f;
  }
}

// The A operand of the 16 rows at `rows` (a (kTile, HS + 8) tile's row, its first) over head
// columns 16 kk .. 16 kk + 15.
template <int HS>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* rows, int kk, int lane) {
  ldmatrix_x4(a, rows + tc::ldm_row_a(lane) * (HS + 8) + kk * kFrag + tc::ldm_col_a(lane));
}
// B operands of two n8 tiles from 16 rows of a tile holding B transposed ((n, k): k, q or dout
// rows against head columns 16 kk ..): registers 0, 1 the first 8 rows, 2, 3 the next 8.
template <int HS>
__device__ __forceinline__ void load_b_rows(uint32_t (&b)[4], const bf16* rows, int kk, int lane) {
  ldmatrix_x4(b, rows + tc::ldm_row_bn(lane) * (HS + 8) + kk * kFrag + tc::ldm_col_bn(lane));
}
// B operands of two n8 tiles (head columns 16 nn .. 16 nn + 15) from 16 rows of a tile holding B
// as (k, n): v, dout, q or k rows against head columns.
template <int HS>
__device__ __forceinline__ void load_b_cols(uint32_t (&b)[4], const bf16* rows, int nn, int lane) {
  ldmatrix_x4_trans(b, rows + tc::ldm_row_a(lane) * (HS + 8) + nn * kFrag + tc::ldm_col_a(lane));
}

// acc (16 x 16 per warp: two n8 tiles) += A (16 x HS, held) B^T, B the 16 rows at `rows`.
template <int HS>
__device__ __forceinline__ void scores16(float (&acc)[2][4], const uint32_t (&a)[HS / kFrag][4], const bf16* rows,
                                         int lane) {
#pragma unroll
  for (int kk = 0; kk < HS / kFrag; kk++) {
    uint32_t b[4];
    load_b_rows<HS>(b, rows, kk, lane);
    mma_bf16_16816(acc[0], a[kk], b[0], b[1]);
    mma_bf16_16816(acc[1], a[kk], b[2], b[3]);
  }
}

// acc (16 x HS, HS / 8 n8 tiles) += P (16 x 16, bf16 A operand) X, X the 16 rows at `rows`.
template <int HS>
__device__ __forceinline__ void accumulate_rows(float (&acc)[HS / 8][4], const uint32_t (&p)[4], const bf16* rows,
                                                int lane) {
#pragma unroll
  for (int nn = 0; nn < HS / kFrag; nn++) {
    uint32_t b[4];
    load_b_cols<HS>(b, rows, nn, lane);
    mma_bf16_16816(acc[2 * nn], p, b[0], b[1]);
    mma_bf16_16816(acc[2 * nn + 1], p, b[2], b[3]);
  }
}

// Two n8 accumulator tiles (16 x 16) packed to bf16 as an A operand over their 16 columns.
__device__ __forceinline__ void pack_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack_bf16x2(lo[0], lo[1]);
  a[1] = pack_bf16x2(lo[2], lo[3]);
  a[2] = pack_bf16x2(hi[0], hi[1]);
  a[3] = pack_bf16x2(hi[2], hi[3]);
}

// Rows row0 + acc_row < T of `dst` (rows `pitch` apart): acc (16 x HS) * mul[row half] as bf16
// pairs (4-byte stores: dst and pitch are 16-byte aligned).
template <int HS>
__device__ __forceinline__ void store_rows(bf16* dst, std::size_t pitch, const float (&acc)[HS / 8][4],
                                           const float (&mul)[2], int row0, int T, int lane) {
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int t = row0 + tc::acc_row(lane, 2 * half);
    if (t >= T) continue;
    bf16* row = dst + static_cast<std::size_t>(t) * pitch + tc::acc_col(lane, 0);
#pragma unroll
    for (int n = 0; n < HS / 8; n++) {
      *reinterpret_cast<uint32_t*>(row + 8 * n) =
          pack_bf16x2(acc[n][2 * half] * mul[half], acc[n][2 * half + 1] * mul[half]);
    }
  }
}

// The lane group's sum or max over its 4 lanes (every lane ends with the same bits).
__device__ __forceinline__ float group_sum(float v) {
  v += __shfl_xor_sync(kFullMask, v, 1);
  return v + __shfl_xor_sync(kFullMask, v, 2);
}
__device__ __forceinline__ float group_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFullMask, v, 2));
}

struct Heads {
  const bf16* q;   // (b, t = 0) of query head h
  const bf16* k;   // of kv head h / group
  const bf16* v;
  std::size_t o0;  // element offset of (b, t = 0, head h) in out, dout
};
__device__ __forceinline__ Heads heads_of(const TcAttentionTensors& a, int b, int h, int hs) {
  const int g = h / (a.NH / a.NKV);
  const std::size_t bT = static_cast<std::size_t>(b) * a.T;
  const std::size_t kv0 = bT * a.kv_ld + static_cast<std::size_t>(g) * hs;
  return Heads{a.q + bT * a.q_ld + static_cast<std::size_t>(h) * hs, a.k + kv0, a.v + kv0,
               bT * a.o_ld + static_cast<std::size_t>(h) * hs};
}

// Forward. Grid (tiles(T), B*NH); block x takes query tile tiles - 1 - x (the longest first).
// Warp w owns rows r0 = q0 + 16 w ..; each lane rows r0 + g and r0 + g + 8 (acc_row), whose
// running max m it keeps (the same in the group's 4 lanes) and a partial sum l of its columns.
template <int HS>
__global__ void __launch_bounds__(tc::kThreads)
    tc_forward_kernel(bf16* out, float* lse, TcAttentionTensors a, float scale) {
#if ZINF_TC_KERNEL_BODY
  constexpr int kLd = HS + 8;
  constexpr int kHeadK = HS / kFrag;
  ZINF_TC_DYNAMIC_SMEM(smem);
  const SmemLayout L = tc::smem_layout(tc::Kernel::kForward, HS);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int T = a.T;
  const int qt = tc::query_tile_of_block(static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x));
  const int q0 = qt * kTile;
  const int bh = static_cast<int>(blockIdx.y);
  const int b = bh / a.NH;
  const int h = bh % a.NH;
  const Heads x = heads_of(a, b, h, HS);
  bf16* ks = region<bf16>(smem, L.t0);  // (kTile, kLd)
  bf16* vs = region<bf16>(smem, L.t1);
  // The query tile, staged in the k tile, into the warp's A operands (kept for every key tile).
  load_tile<HS>(ks, x.q, a.q_ld, q0, T);
  __syncthreads();
  uint32_t qa[kHeadK][4];
#pragma unroll
  for (int kk = 0; kk < kHeadK; kk++) load_a<HS>(qa[kk], ks + warp * kFrag * kLd, kk, lane);

  float o[HS / 8][4];
#pragma unroll
  for (int n = 0; n < HS / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  const int r0 = q0 + warp * kFrag;
  const int rows[2] = {r0 + tc::acc_row(lane, 0), r0 + tc::acc_row(lane, 2)};
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};
  for (int kt = 0; kt < tc::key_tiles_for_query_tile(qt); kt++) {
    const int k0 = kt * kTile;
    __syncthreads();  // the previous tile's (or the staged q's) readers are done
    load_tile<HS>(ks, x.k, a.kv_ld, k0, T);
    load_tile<HS>(vs, x.v, a.kv_ld, k0, T);
    __syncthreads();
    // S = Q_w K^T, 16 keys (two n8 tiles) at a time; chunks past the diagonal are not computed.
    float s[kTileFrags][2][4];
#pragma unroll
    for (int j = 0; j < kTileFrags; j++) {
#pragma unroll
      for (int n = 0; n < 2; n++) s[j][n][0] = s[j][n][1] = s[j][n][2] = s[j][n][3] = 0.0f;
      if (!tc::fragment_masked(r0, k0 + j * kFrag)) scores16<HS>(s[j], qa, ks + j * kFrag * kLd, lane);
    }
    // The online softmax of the lane's two rows over this tile; masked scores become -inf.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kTileFrags; j++) {
#pragma unroll
      for (int n = 0; n < 2; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const int key = k0 + j * kFrag + n * 8 + tc::acc_col(lane, i);
          const float v = tc::visible(rows[i >> 1], key, T) ? s[j][n][i] * scale : -INFINITY;
          s[j][n][i] = v;
          tile_max[i >> 1] = fmaxf(tile_max[i >> 1], v);
        }
      }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const tc::RowUpdate u = tc::row_update(m[r], group_max(tile_max[r]));
      alpha[r] = u.alpha;
      m[r] = u.m;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kTileFrags; j++) {
#pragma unroll
      for (int n = 0; n < 2; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const float v = s[j][n][i];
          const float p = v == -INFINITY ? 0.0f : exp_f(v - m[i >> 1]);
          s[j][n][i] = p;
          sum[i >> 1] += p;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + sum[r];
    // O = O * alpha + P V
#pragma unroll
    for (int n = 0; n < HS / 8; n++) {
#pragma unroll
      for (int i = 0; i < 4; i++) o[n][i] *= alpha[i >> 1];
    }
#pragma unroll
    for (int j = 0; j < kTileFrags; j++) {
      if (tc::fragment_masked(r0, k0 + j * kFrag)) continue;  // P is 0 there
      uint32_t pa[4];
      pack_a(pa, s[j][0], s[j][1]);
      accumulate_rows<HS>(o, pa, vs + j * kFrag * kLd, lane);
    }
  }
  // out = O / l; lse = m + log l. Rows past T (no visible key: l = 0) are not written.
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const float lr = group_sum(l[r]);
    inv[r] = lr > 0.0f ? 1.0f / lr : 0.0f;
    if ((lane & 3) == 0 && rows[r] < T) lse[static_cast<std::size_t>(bh) * T + rows[r]] = m[r] + logf(lr);
  }
  store_rows<HS>(out + x.o0, a.o_ld, o, inv, r0, T, lane);
#endif
}

// D = rowsum(dO * O) per (b, h, t) into dsum (B,NH,T); one warp per row.
__global__ void __launch_bounds__(tc::kThreads)
    tc_row_dot_kernel(float* dsum, const bf16* dout, const bf16* out, TcAttentionTensors a, long long rows) {
  const long long idx = static_cast<long long>(blockIdx.x) * tc::kWarps + threadIdx.x / 32;
  if (idx >= rows) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const long long bh = idx / a.T;
  const int t = static_cast<int>(idx % a.T);
  const int b = static_cast<int>(bh / a.NH);
  const int h = static_cast<int>(bh % a.NH);
  const std::size_t base = (static_cast<std::size_t>(b) * a.T + t) * a.o_ld + static_cast<std::size_t>(h) * a.hs;
  float acc = 0.0f;
  for (int d = lane; d < a.hs; d += 32) acc += to_f32(dout[base + d]) * to_f32(out[base + d]);
  acc = detail::warp_sum(acc);
  if (lane == 0) dsum[idx] = acc;
}

// dQ. Grid (tiles(T), B*NH), block x takes query tile tiles - 1 - x. Warp w owns rows
// r0 = q0 + 16 w .. (q and dout held as A operands, each lane's two rows' lse and D in
// registers); per 16 keys: S and dP, dS = P (dP - D) in the registers, then dQ_w += dS K.
// dq = scale * dQ.
template <int HS>
__global__ void __launch_bounds__(tc::kThreads)
    tc_dq_kernel(bf16* dq, const bf16* dout, const float* lse, const float* dsum, TcAttentionTensors a, float scale) {
#if ZINF_TC_KERNEL_BODY
  constexpr int kLd = HS + 8;
  constexpr int kHeadK = HS / kFrag;
  ZINF_TC_DYNAMIC_SMEM(smem);
  const SmemLayout L = tc::smem_layout(tc::Kernel::kDq, HS);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int T = a.T;
  const int qt = tc::query_tile_of_block(static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x));
  const int q0 = qt * kTile;
  const int bh = static_cast<int>(blockIdx.y);
  const int b = bh / a.NH;
  const int h = bh % a.NH;
  const Heads x = heads_of(a, b, h, HS);
  bf16* ks = region<bf16>(smem, L.t0);
  bf16* vs = region<bf16>(smem, L.t1);
  // The query and dout tiles, staged in the k and v tiles, into the warp's A operands.
  load_tile<HS>(ks, x.q, a.q_ld, q0, T);
  load_tile<HS>(vs, dout + x.o0, a.o_ld, q0, T);
  __syncthreads();
  uint32_t qa[kHeadK][4];
  uint32_t doa[kHeadK][4];
#pragma unroll
  for (int kk = 0; kk < kHeadK; kk++) {
    load_a<HS>(qa[kk], ks + warp * kFrag * kLd, kk, lane);
    load_a<HS>(doa[kk], vs + warp * kFrag * kLd, kk, lane);
  }
  const int r0 = q0 + warp * kFrag;
  const int rows[2] = {r0 + tc::acc_row(lane, 0), r0 + tc::acc_row(lane, 2)};
  float row_lse[2], row_d[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const bool in = rows[r] < T;
    row_lse[r] = in ? lse[static_cast<std::size_t>(bh) * T + rows[r]] : 0.0f;
    row_d[r] = in ? dsum[static_cast<std::size_t>(bh) * T + rows[r]] : 0.0f;
  }

  float acc[HS / 8][4];
#pragma unroll
  for (int n = 0; n < HS / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  for (int kt = 0; kt < tc::key_tiles_for_query_tile(qt); kt++) {
    const int k0 = kt * kTile;
    __syncthreads();  // the previous tile's (or the staged q's, dout's) readers are done
    load_tile<HS>(ks, x.k, a.kv_ld, k0, T);
    load_tile<HS>(vs, x.v, a.kv_ld, k0, T);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kTileFrags; j++) {
      const int kj = k0 + j * kFrag;
      if (tc::fragment_masked(r0, kj)) continue;  // dS is 0 there
      float s[2][4] = {};
      float dp[2][4] = {};
      scores16<HS>(s, qa, ks + j * kFrag * kLd, lane);
      scores16<HS>(dp, doa, vs + j * kFrag * kLd, lane);
#pragma unroll
      for (int n = 0; n < 2; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const int r = i >> 1;
          float ds = 0.0f;
          if (tc::visible(rows[r], kj + n * 8 + tc::acc_col(lane, i), T)) {
            ds = tc::score_grad(tc::prob(s[n][i], scale, row_lse[r]), dp[n][i], row_d[r]);
          }
          s[n][i] = ds;
        }
      }
      uint32_t da[4];
      pack_a(da, s[0], s[1]);
      accumulate_rows<HS>(acc, da, ks + j * kFrag * kLd, lane);
    }
  }
  const float mul[2] = {scale, scale};
  store_rows<HS>(dq + (x.q - a.q), a.q_ld, acc, mul, r0, T, lane);
#endif
}

// dK, dV. Grid (tiles(T), B*NKV): the block of key tile x and kv head g. Warp w owns keys
// c0 = key0 + 16 w ..; for each query head of g in head order and each query tile from the
// diagonal down, per 16 queries: S^T = K_w Q^T and dP^T = V_w dO^T, P^T and dS^T in the
// registers, then dV_w += P^T dO and dK_w += dS^T Q. dk = scale * dK.
template <int HS>
__global__ void __launch_bounds__(tc::kThreads)
    tc_dkv_kernel(TcAttentionGrads grads, const bf16* dout, const float* lse, const float* dsum, TcAttentionTensors a,
                  float scale) {
#if ZINF_TC_KERNEL_BODY
  constexpr int kLd = HS + 8;
  constexpr int kHeadK = HS / kFrag;
  ZINF_TC_DYNAMIC_SMEM(smem);
  const SmemLayout L = tc::smem_layout(tc::Kernel::kDkv, HS);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int T = a.T;
  const int kt = static_cast<int>(blockIdx.x);
  const int key0 = kt * kTile;
  const int bg = static_cast<int>(blockIdx.y);
  const int b = bg / a.NKV;
  const int g = bg % a.NKV;
  const int group = a.NH / a.NKV;
  bf16* ks = region<bf16>(smem, L.t0);
  bf16* vs = region<bf16>(smem, L.t1);
  bf16* qs = region<bf16>(smem, L.t2);
  bf16* dos = region<bf16>(smem, L.t3);
  float* lse_s = region<float>(smem, L.lse);
  float* d_s = region<float>(smem, L.dsum);
  const Heads kv = heads_of(a, b, g * group, HS);  // kv head g
  load_tile<HS>(ks, kv.k, a.kv_ld, key0, T);
  load_tile<HS>(vs, kv.v, a.kv_ld, key0, T);

  float dk[HS / 8][4];
  float dv[HS / 8][4];
#pragma unroll
  for (int n = 0; n < HS / 8; n++) {
    dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f;
    dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
  }
  const int c0 = key0 + warp * kFrag;
  const int keys[2] = {c0 + tc::acc_row(lane, 0), c0 + tc::acc_row(lane, 2)};
  const bf16* k_w = ks + warp * kFrag * kLd;
  const bf16* v_w = vs + warp * kFrag * kLd;
  for (int h = g * group; h < (g + 1) * group; h++) {
    const long long bh = static_cast<long long>(b) * a.NH + h;
    const Heads x = heads_of(a, b, h, HS);
    for (int qt = tc::first_query_tile(kt); qt < tc::tiles(T); qt++) {
      const int q0 = qt * kTile;
      __syncthreads();  // the previous tile's (or head's) readers are done
      load_tile<HS>(qs, x.q, a.q_ld, q0, T);
      load_tile<HS>(dos, dout + x.o0, a.o_ld, q0, T);
      load_row_values(lse_s, lse, bh, q0, T);
      load_row_values(d_s, dsum, bh, q0, T);
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kTileFrags; j++) {
        const int qj = q0 + j * kFrag;
        if (tc::fragment_masked(qj, c0)) continue;  // every query of the chunk is before every key
        float st[2][4] = {};
        float dpt[2][4] = {};
#pragma unroll
        for (int kk = 0; kk < kHeadK; kk++) {
          uint32_t ka[4], va[4], qb[4], dob[4];
          load_a<HS>(ka, k_w, kk, lane);
          load_a<HS>(va, v_w, kk, lane);
          load_b_rows<HS>(qb, qs + j * kFrag * kLd, kk, lane);
          load_b_rows<HS>(dob, dos + j * kFrag * kLd, kk, lane);
          mma_bf16_16816(st[0], ka, qb[0], qb[1]);  // S^T: keys x queries
          mma_bf16_16816(st[1], ka, qb[2], qb[3]);
          mma_bf16_16816(dpt[0], va, dob[0], dob[1]);  // dP^T
          mma_bf16_16816(dpt[1], va, dob[2], dob[3]);
        }
#pragma unroll
        for (int n = 0; n < 2; n++) {
#pragma unroll
          for (int i = 0; i < 4; i++) {
            const int ql = j * kFrag + n * 8 + tc::acc_col(lane, i);  // query q0 + ql
            float p = 0.0f;
            float ds = 0.0f;
            if (tc::visible(q0 + ql, keys[i >> 1], T)) {
              p = tc::prob(st[n][i], scale, lse_s[ql]);
              ds = tc::score_grad(p, dpt[n][i], d_s[ql]);
            }
            st[n][i] = p;
            dpt[n][i] = ds;
          }
        }
        uint32_t pa[4], dsa[4];
        pack_a(pa, st[0], st[1]);
        pack_a(dsa, dpt[0], dpt[1]);
        accumulate_rows<HS>(dv, pa, dos + j * kFrag * kLd, lane);
        accumulate_rows<HS>(dk, dsa, qs + j * kFrag * kLd, lane);
      }
    }
  }
  const std::size_t kv_off = static_cast<std::size_t>(kv.k - a.k);
  const float k_mul[2] = {scale, scale};
  const float v_mul[2] = {1.0f, 1.0f};
  store_rows<HS>(grads.dk + kv_off, a.kv_ld, dk, k_mul, c0, T, lane);
  store_rows<HS>(grads.dv + kv_off, a.kv_ld, dv, v_mul, c0, T, lane);
#endif
}

}  // namespace
}  // namespace zinf::gpu
