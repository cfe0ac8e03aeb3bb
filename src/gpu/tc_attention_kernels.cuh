// Internal: the tensor-core attention's kernels (tc_attention.h), device code only, included by
// tc_attention.cu. A header so that tests/gpu/tc_attention_emulation_test.cpp can run the same
// source on a host emulation of the CUDA features it uses (ZINF_TC_EMULATION: threads, barriers,
// shuffles and a WMMA stand-in from tests/gpu/cuda_emulation.h instead of <mma.h>). Products are
// WMMA bf16 16x16x16 with fp32 accumulators, each product's fragment staged in shared memory for
// the softmax and the score gradient, which lanes compute with tc_attention_tiles.h's formulas.
#pragma once

#include <cmath>
#include <cstdint>

#if !defined(ZINF_TC_EMULATION)
#include <mma.h>

#include "gpu/kernel_util.cuh"
#endif
#include "gpu/tc_attention.h"
#include "gpu/tc_attention_tiles.h"

// The block's dynamic shared memory (the emulation hands each block a buffer instead).
#if !defined(ZINF_TC_EMULATION)
#define ZINF_TC_DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#endif

namespace zinf::gpu {
namespace {

namespace wmma = nvcuda::wmma;
using detail::kFullMask;
using detail::to_bf16;
using detail::to_f32;
using tc::kFrag;
using tc::kLdChunk;
using tc::kLdProbs;
using tc::kLdScores;
using tc::kTile;
using tc::kTileFrags;
using tc::SmemLayout;

// The WMMA API with bf16 fragments needs sm_80; zinf builds sm_80 and sm_90 (meson.build), and the
// host side refuses devices below 8.0 (tc_attention_supports), so below it the kernels are empty.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define ZINF_TC_KERNEL_BODY 1
#else
#define ZINF_TC_KERNEL_BODY 0
#endif
#if ZINF_TC_KERNEL_BODY
using FragA = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, __nv_bfloat16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, __nv_bfloat16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, __nv_bfloat16, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;
constexpr int kAccElems = FragAcc::num_elements;
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

#if ZINF_TC_KERNEL_BODY
// rows[i]: the row (0..15) of element i of this lane's accumulator fragments. WMMA leaves the
// element-to-register mapping unspecified but fixed per fragment type, so it is read back by
// loading a matrix whose elements are their row numbers. `staging`: the warp's (16, ld) floats.
__device__ void fragment_rows(int (&rows)[kAccElems], float* staging, int ld, int lane) {
  for (int e = lane; e < kFrag * kFrag; e += 32) staging[(e / kFrag) * ld + e % kFrag] = static_cast<float>(e / kFrag);
  __syncwarp();
  FragAcc f;
  wmma::load_matrix_sync(f, staging, ld, wmma::mem_row_major);
#pragma unroll
  for (int i = 0; i < kAccElems; i++) rows[i] = static_cast<int>(f.x[i]);
  __syncwarp();
}

// acc (16 x 16) * mul into the warp's staging, then rows row0 + r < T of `dst` (rows `pitch`
// apart, columns col0 ..) as bf16.
__device__ void store_rows(bf16* dst, std::size_t pitch, int col0, const FragAcc& acc, float* staging, int row0,
                           int T, int lane) {
  wmma::store_matrix_sync(staging, acc, kLdChunk, wmma::mem_row_major);
  __syncwarp();
#pragma unroll
  for (int i = 0; i < tc::kChunkPerLane; i++) {
    const int r = tc::chunk_row(lane, i);
    const int c = tc::chunk_col(lane, i);
    const int t = row0 + r;
    if (t < T) dst[static_cast<std::size_t>(t) * pitch + col0 + c] = to_bf16(staging[r * kLdChunk + c]);
  }
  __syncwarp();
}

// d (16 x 16) = X (16 x HS; rows of `x`, ld) @ Y^T, Y (16 x HS; rows of `y`, ld): a score fragment.
template <int HS>
__device__ __forceinline__ void scores_fragment(FragAcc& d, const bf16* x, const bf16* y) {
  constexpr int kLd = HS + 8;
  wmma::fill_fragment(d, 0.0f);
#pragma unroll
  for (int kk = 0; kk < HS / kFrag; kk++) {
    FragA xa;
    FragBCol yb;
    wmma::load_matrix_sync(xa, x + kk * kFrag, kLd);
    wmma::load_matrix_sync(yb, y + kk * kFrag, kLd);
    wmma::mma_sync(d, xa, yb, d);
  }
}

// The same with X held in fragments (the forward's and dQ's own rows, loaded once per block).
template <int HS>
__device__ __forceinline__ void scores_fragment(FragAcc& d, const FragA (&x)[HS / kFrag], const bf16* y) {
  constexpr int kLd = HS + 8;
  wmma::fill_fragment(d, 0.0f);
#pragma unroll
  for (int kk = 0; kk < HS / kFrag; kk++) {
    FragBCol yb;
    wmma::load_matrix_sync(yb, y + kk * kFrag, kLd);
    wmma::mma_sync(d, x[kk], yb, d);
  }
}

// The warp's 16 rows of a staged (kTile, HS + 8) tile, `rows` its first, as HS/16 fragments.
template <int HS>
__device__ __forceinline__ void load_row_fragments(FragA (&f)[HS / kFrag], const bf16* rows) {
#pragma unroll
  for (int kk = 0; kk < HS / kFrag; kk++) wmma::load_matrix_sync(f[kk], rows + kk * kFrag, HS + 8);
}
#endif

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
// Warp w owns rows r0 = q0 + 16 w ..; lanes 2r, 2r + 1 keep row r's running max m and sum l.
template <int HS>
__global__ void __launch_bounds__(tc::kThreads)
    tc_forward_kernel(bf16* out, float* lse, TcAttentionTensors a, float scale) {
#if ZINF_TC_KERNEL_BODY
  constexpr int kLd = HS + 8;
  constexpr int kHeadFrags = HS / kFrag;
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
  float* sw = region<float>(smem, L.scores + warp * L.scores_warp);  // (16, kLdScores) this warp's S
  bf16* pw = region<bf16>(smem, L.probs + warp * L.probs_warp);      // (16, kLdProbs) this warp's P
  float* row_stat = region<float>(smem, L.row_stats) + warp * kFrag;  // per row: alpha, then 1 / l
  // The query tile, staged in the k tile, into the warps' fragments (reused for every key tile).
  load_tile<HS>(ks, x.q, a.q_ld, q0, T);
  __syncthreads();
  FragA q_w[kHeadFrags];
  load_row_fragments<HS>(q_w, ks + warp * kFrag * kLd);
  int frow[kAccElems];
  fragment_rows(frow, sw, kLdScores, lane);

  FragAcc o[kHeadFrags];
#pragma unroll
  for (int n = 0; n < kHeadFrags; n++) wmma::fill_fragment(o[n], 0.0f);
  const int r0 = q0 + warp * kFrag;
  const int r = tc::stats_row(lane);
  const int half = tc::stats_half(lane);
  const int row = r0 + r;
  float m = -INFINITY;
  float l = 0.0f;
  for (int kt = 0; kt < tc::key_tiles_for_query_tile(qt); kt++) {
    const int k0 = kt * kTile;
    __syncthreads();  // the previous tile's (or the staged q's) readers are done
    load_tile<HS>(ks, x.k, a.kv_ld, k0, T);
    load_tile<HS>(vs, x.v, a.kv_ld, k0, T);
    __syncthreads();
    // S = Q_w K^T, one 16-key fragment at a time; fragments past the diagonal are not computed
    // (nothing reads them: the mask below is by index).
#pragma unroll
    for (int j = 0; j < kTileFrags; j++) {
      if (tc::fragment_masked(r0, k0 + j * kFrag)) continue;
      FragAcc s;
      scores_fragment<HS>(s, q_w, ks + j * kFrag * kLd);
      wmma::store_matrix_sync(sw + j * kFrag, s, kLdScores, wmma::mem_row_major);
    }
    __syncwarp();
    // The online softmax of row r over this tile: its lane pair's halves, merged by one shuffle.
    const float* srow = sw + r * kLdScores + half * tc::kHalfTile;
    bf16* prow = pw + r * kLdProbs + half * tc::kHalfTile;
    const int key_a = k0 + half * tc::kHalfTile;
    float tile_max = -INFINITY;
    for (int c = 0; c < tc::kHalfTile; c++) {
      if (tc::visible(row, key_a + c, T)) tile_max = fmaxf(tile_max, srow[c] * scale);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
    const tc::RowUpdate u = tc::row_update(m, tile_max);
    float sum = 0.0f;
    for (int c = 0; c < tc::kHalfTile; c++) {
      const float p = tc::visible(row, key_a + c, T) ? exp_f(srow[c] * scale - u.m) : 0.0f;
      prow[c] = to_bf16(p);
      sum += p;
    }
    sum += __shfl_xor_sync(kFullMask, sum, 1);  // a + b in one lane, b + a in the other: equal
    l = l * u.alpha + sum;
    m = u.m;
    if (half == 0) row_stat[r] = u.alpha;
    __syncwarp();
    // O = O * alpha + P V
#pragma unroll
    for (int n = 0; n < kHeadFrags; n++) {
#pragma unroll
      for (int i = 0; i < kAccElems; i++) o[n].x[i] *= row_stat[frow[i]];
    }
#pragma unroll
    for (int kk = 0; kk < kTileFrags; kk++) {
      if (tc::fragment_masked(r0, k0 + kk * kFrag)) continue;  // P is 0 there
      FragA pa;
      wmma::load_matrix_sync(pa, pw + kk * kFrag, kLdProbs);
#pragma unroll
      for (int n = 0; n < kHeadFrags; n++) {
        FragBRow vb;
        wmma::load_matrix_sync(vb, vs + kk * kFrag * kLd + n * kFrag, kLd);
        wmma::mma_sync(o[n], pa, vb, o[n]);
      }
    }
    __syncwarp();  // row_stat and P are rewritten next tile
  }
  // out = O / l; lse = m + log l. Rows past T (no visible key: l = 0) are not written.
  if (half == 0) {
    row_stat[r] = l > 0.0f ? 1.0f / l : 0.0f;
    if (row < T) lse[static_cast<std::size_t>(bh) * T + row] = m + logf(l);
  }
  __syncwarp();
#pragma unroll
  for (int n = 0; n < kHeadFrags; n++) {
#pragma unroll
    for (int i = 0; i < kAccElems; i++) o[n].x[i] *= row_stat[frow[i]];
    store_rows(out + x.o0, a.o_ld, n * kFrag, o[n], sw, r0, T, lane);
  }
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
// r0 = q0 + 16 w ..; per key tile: S, dP fragment by fragment, dS (bf16) into the warp's
// (16, kTile) matrix, then dQ_w += dS K. dq = scale * dQ.
template <int HS>
__global__ void __launch_bounds__(tc::kThreads)
    tc_dq_kernel(bf16* dq, const bf16* dout, const float* lse, const float* dsum, TcAttentionTensors a, float scale) {
#if ZINF_TC_KERNEL_BODY
  constexpr int kLd = HS + 8;
  constexpr int kHeadFrags = HS / kFrag;
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
  float* cs = region<float>(smem, L.chunk_s + warp * L.chunk_warp);    // (16, kLdChunk) S
  float* cdp = region<float>(smem, L.chunk_dp + warp * L.chunk_warp);  // (16, kLdChunk) dP
  bf16* dsw = region<bf16>(smem, L.probs + warp * L.probs_warp);      // (16, kLdProbs) dS
  float* lse_s = region<float>(smem, L.lse);
  float* d_s = region<float>(smem, L.dsum);
  // The query and dout tiles, staged in the k and v tiles, into the warps' fragments.
  load_tile<HS>(ks, x.q, a.q_ld, q0, T);
  load_tile<HS>(vs, dout + x.o0, a.o_ld, q0, T);
  load_row_values(lse_s, lse, bh, q0, T);
  load_row_values(d_s, dsum, bh, q0, T);
  __syncthreads();
  FragA q_w[kHeadFrags];
  FragA do_w[kHeadFrags];
  load_row_fragments<HS>(q_w, ks + warp * kFrag * kLd);
  load_row_fragments<HS>(do_w, vs + warp * kFrag * kLd);

  FragAcc acc[kHeadFrags];
#pragma unroll
  for (int n = 0; n < kHeadFrags; n++) wmma::fill_fragment(acc[n], 0.0f);
  const int r0 = q0 + warp * kFrag;
  for (int kt = 0; kt < tc::key_tiles_for_query_tile(qt); kt++) {
    const int k0 = kt * kTile;
    __syncthreads();  // the previous tile's (or the staged q's, dout's) readers are done
    load_tile<HS>(ks, x.k, a.kv_ld, k0, T);
    load_tile<HS>(vs, x.v, a.kv_ld, k0, T);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kTileFrags; j++) {
      const int kj = k0 + j * kFrag;
      if (tc::fragment_masked(r0, kj)) {
#pragma unroll
        for (int i = 0; i < tc::kChunkPerLane; i++) {
          dsw[tc::chunk_row(lane, i) * kLdProbs + j * kFrag + tc::chunk_col(lane, i)] = to_bf16(0.0f);
        }
        continue;
      }
      FragAcc s;
      FragAcc dp;
      scores_fragment<HS>(s, q_w, ks + j * kFrag * kLd);
      scores_fragment<HS>(dp, do_w, vs + j * kFrag * kLd);
      wmma::store_matrix_sync(cs, s, kLdChunk, wmma::mem_row_major);
      wmma::store_matrix_sync(cdp, dp, kLdChunk, wmma::mem_row_major);
      __syncwarp();
#pragma unroll
      for (int i = 0; i < tc::kChunkPerLane; i++) {
        const int rr = tc::chunk_row(lane, i);
        const int cc = tc::chunk_col(lane, i);
        float ds = 0.0f;
        if (tc::visible(r0 + rr, kj + cc, T)) {
          const int rl = warp * kFrag + rr;
          const float p = tc::prob(cs[rr * kLdChunk + cc], scale, lse_s[rl]);
          ds = tc::score_grad(p, cdp[rr * kLdChunk + cc], d_s[rl]);
        }
        dsw[rr * kLdProbs + j * kFrag + cc] = to_bf16(ds);
      }
      __syncwarp();
    }
#pragma unroll
    for (int kk = 0; kk < kTileFrags; kk++) {
      if (tc::fragment_masked(r0, k0 + kk * kFrag)) continue;  // dS is 0 there
      FragA da;
      wmma::load_matrix_sync(da, dsw + kk * kFrag, kLdProbs);
#pragma unroll
      for (int n = 0; n < kHeadFrags; n++) {
        FragBRow kb;
        wmma::load_matrix_sync(kb, ks + kk * kFrag * kLd + n * kFrag, kLd);
        wmma::mma_sync(acc[n], da, kb, acc[n]);
      }
    }
    __syncwarp();
  }
#pragma unroll
  for (int n = 0; n < kHeadFrags; n++) {
#pragma unroll
    for (int i = 0; i < kAccElems; i++) acc[n].x[i] *= scale;
    store_rows(dq + (x.q - a.q), a.q_ld, n * kFrag, acc[n], cs, r0, T, lane);
  }
#endif
}

// dK, dV. Grid (tiles(T), B*NKV): the block of key tile x and kv head g. Warp w owns keys
// c0 = key0 + 16 w ..; for each query head of g in head order and each query tile from the
// diagonal down: S^T, dP^T fragment by fragment, P^T and dS^T (bf16) into the warp's two
// (16, kTile) matrices, then dV_w += P^T dO, dK_w += dS^T Q. dk = scale * dK.
template <int HS>
__global__ void __launch_bounds__(tc::kThreads)
    tc_dkv_kernel(TcAttentionGrads grads, const bf16* dout, const float* lse, const float* dsum, TcAttentionTensors a,
                  float scale) {
#if ZINF_TC_KERNEL_BODY
  constexpr int kLd = HS + 8;
  constexpr int kHeadFrags = HS / kFrag;
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
  float* cs = region<float>(smem, L.chunk_s + warp * L.chunk_warp);
  float* cdp = region<float>(smem, L.chunk_dp + warp * L.chunk_warp);
  bf16* ptw = region<bf16>(smem, L.probs + warp * L.probs_warp);                          // (16, kLdProbs) P^T
  bf16* dstw = region<bf16>(smem, L.probs + warp * L.probs_warp + tc::dkv_ds_offset());  // dS^T
  float* lse_s = region<float>(smem, L.lse);
  float* d_s = region<float>(smem, L.dsum);
  const Heads kv = heads_of(a, b, g * group, HS);  // kv head g
  load_tile<HS>(ks, kv.k, a.kv_ld, key0, T);
  load_tile<HS>(vs, kv.v, a.kv_ld, key0, T);

  FragAcc dk[kHeadFrags];
  FragAcc dv[kHeadFrags];
#pragma unroll
  for (int n = 0; n < kHeadFrags; n++) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  const int c0 = key0 + warp * kFrag;
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
        if (tc::fragment_masked(qj, c0)) {  // every query of the fragment is before every key
#pragma unroll
          for (int i = 0; i < tc::kChunkPerLane; i++) {
            const int at = tc::chunk_row(lane, i) * kLdProbs + j * kFrag + tc::chunk_col(lane, i);
            ptw[at] = to_bf16(0.0f);
            dstw[at] = to_bf16(0.0f);
          }
          continue;
        }
        FragAcc st;
        FragAcc dpt;
        scores_fragment<HS>(st, k_w, qs + j * kFrag * kLd);    // S^T: keys x queries
        scores_fragment<HS>(dpt, v_w, dos + j * kFrag * kLd);  // dP^T
        wmma::store_matrix_sync(cs, st, kLdChunk, wmma::mem_row_major);
        wmma::store_matrix_sync(cdp, dpt, kLdChunk, wmma::mem_row_major);
        __syncwarp();
#pragma unroll
        for (int i = 0; i < tc::kChunkPerLane; i++) {
          const int rr = tc::chunk_row(lane, i);  // key c0 + rr
          const int cc = tc::chunk_col(lane, i);  // query qj + cc
          float p = 0.0f;
          float ds = 0.0f;
          if (tc::visible(qj + cc, c0 + rr, T)) {
            const int ql = j * kFrag + cc;
            p = tc::prob(cs[rr * kLdChunk + cc], scale, lse_s[ql]);
            ds = tc::score_grad(p, cdp[rr * kLdChunk + cc], d_s[ql]);
          }
          ptw[rr * kLdProbs + j * kFrag + cc] = to_bf16(p);
          dstw[rr * kLdProbs + j * kFrag + cc] = to_bf16(ds);
        }
        __syncwarp();
      }
#pragma unroll
      for (int kk = 0; kk < kTileFrags; kk++) {
        if (tc::fragment_masked(q0 + kk * kFrag, c0)) continue;  // P^T, dS^T are 0 there
        FragA pa;
        FragA dsa;
        wmma::load_matrix_sync(pa, ptw + kk * kFrag, kLdProbs);
        wmma::load_matrix_sync(dsa, dstw + kk * kFrag, kLdProbs);
#pragma unroll
        for (int n = 0; n < kHeadFrags; n++) {
          FragBRow dob;
          wmma::load_matrix_sync(dob, dos + kk * kFrag * kLd + n * kFrag, kLd);
          wmma::mma_sync(dv[n], pa, dob, dv[n]);
          FragBRow qb;
          wmma::load_matrix_sync(qb, qs + kk * kFrag * kLd + n * kFrag, kLd);
          wmma::mma_sync(dk[n], dsa, qb, dk[n]);
        }
      }
      __syncwarp();
    }
  }
  const std::size_t kv_off = static_cast<std::size_t>(kv.k - a.k);
#pragma unroll
  for (int n = 0; n < kHeadFrags; n++) {
#pragma unroll
    for (int i = 0; i < kAccElems; i++) dk[n].x[i] *= scale;
    store_rows(grads.dk + kv_off, a.kv_ld, n * kFrag, dk[n], cs, c0, T, lane);
    store_rows(grads.dv + kv_off, a.kv_ld, n * kFrag, dv[n], cs, c0, T, lane);
  }
#endif
}

}  // namespace
}  // namespace zinf::gpu
