// Internal: the tile arithmetic of the tensor-core attention kernels (tc_attention.cu): tile and
// fragment sizes, each kernel's shared-memory layout, which tiles and 16x16 fragments a block
// visits, the causal mask and the per-element formulas. The kernels call these functions; the
// host tests (tests/gpu/kernel_math_test.cpp) walk the same loops with them and check that every
// causal (row, key) pair is computed exactly once and that the layouts fit and are aligned.
#pragma once

#include <cstddef>

#include "gpu/numerics.h"

namespace zinf::gpu::tc {

// A block is kWarps warps. Forward and dQ: a block owns kTile query rows (kFrag per warp) and
// walks key tiles of kTile keys, from key 0 to its diagonal tile. dK/dV: a block owns kTile keys
// (kFrag per warp) and walks, for each query head of its kv head in head order, the query tiles
// from its diagonal tile to the end. Query and key tiles have the same size and start at
// multiples of it, so a block's first (dK/dV) or last (forward, dQ) tile is the diagonal one.
inline constexpr int kFrag = 16;  // WMMA bf16 m16n16k16
inline constexpr int kWarps = 4;
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kTile = kWarps * kFrag;  // 64
inline constexpr int kTileFrags = kTile / kFrag;  // 4
inline constexpr int kMaxHeadSize = 128;
// Dynamic shared memory a block may use (sm_80's 163 KiB and sm_90's 227 KiB both allow it; the
// launcher raises the 48 KiB default with cudaFuncSetAttribute).
inline constexpr std::size_t kMaxSmemBytes = 99 * 1024;

// Head sizes the kernels are instantiated for: multiples of kFrag up to kMaxHeadSize.
ZINF_HD bool head_size_supported(int hs) { return hs >= kFrag && hs <= kMaxHeadSize && hs % kFrag == 0; }

// Row strides in shared memory (elements), padded against bank conflicts; every 16-row fragment
// then starts 256-bit aligned (WMMA's requirement): 16 * ld * element size is a multiple of 32.
ZINF_HD int ld_head(int hs) { return hs + 8; }  // bf16 (kTile, hs) tiles of q, k, v, dout
inline constexpr int kLdScores = kTile + 4;     // fp32 (kFrag, kTile) scores of one warp (forward)
inline constexpr int kLdProbs = kTile + 8;      // bf16 (kFrag, kTile) P, dS of one warp
inline constexpr int kLdChunk = kFrag + 4;      // fp32 (kFrag, kFrag) staging of one warp

// Byte offsets of one kernel's shared memory regions (each 128-byte aligned); per-warp regions
// are `*_warp` bytes apart. Unused regions have size 0.
struct SmemLayout {
  std::size_t tile_bytes = 0;  // one bf16 (kTile, ld_head) tile
  // Tiles: forward and dQ k, v in t0, t1 (q and dout are staged there once and then held in
  // fragments; t2, t3 unused); dK/dV k, v, q, dout.
  std::size_t t0 = 0, t1 = 0, t2 = 0, t3 = 0;
  std::size_t scores = 0, scores_warp = 0;  // forward: fp32 (kFrag, kLdScores) per warp
  std::size_t chunk_s = 0, chunk_dp = 0, chunk_warp = 0;  // backward: fp32 (kFrag, kLdChunk) S, dP per warp
  std::size_t probs = 0, probs_warp = 0;    // bf16 (kFrag, kLdProbs): forward P; dQ dS; dK/dV P^T then dS^T
  std::size_t row_stats = 0;                // forward: kFrag floats per warp (alpha, then 1/l)
  std::size_t lse = 0, dsum = 0;            // backward: kTile floats each (the query tile's lse and D)
  std::size_t bytes = 0;
};

ZINF_HD std::size_t align128(std::size_t x) { return (x + 127) / 128 * 128; }

enum class Kernel { kForward, kDq, kDkv };

ZINF_HD SmemLayout smem_layout(Kernel k, int hs) {
  SmemLayout s;
  s.tile_bytes = align128(static_cast<std::size_t>(kTile) * ld_head(hs) * 2);
  s.t0 = 0;
  s.t1 = s.t0 + s.tile_bytes;
  std::size_t at = s.t1 + s.tile_bytes;
  if (k == Kernel::kDkv) {
    s.t2 = at;
    s.t3 = at + s.tile_bytes;
    at += 2 * s.tile_bytes;
  }
  if (k == Kernel::kForward) {
    s.scores = at;
    s.scores_warp = align128(static_cast<std::size_t>(kFrag) * kLdScores * 4);
    at += kWarps * s.scores_warp;
    s.row_stats = at;
    at += align128(static_cast<std::size_t>(kWarps) * kFrag * 4);
  } else {
    const std::size_t chunk = align128(static_cast<std::size_t>(kFrag) * kLdChunk * 4);
    s.chunk_warp = 2 * chunk;
    s.chunk_s = at;
    s.chunk_dp = at + chunk;
    at += kWarps * s.chunk_warp;
    s.lse = at;
    at += align128(kTile * 4);
    s.dsum = at;
    at += align128(kTile * 4);
  }
  // Forward and dQ: one (kFrag, kTile) bf16 matrix per warp; dK/dV: two (P^T and dS^T).
  const std::size_t probs = align128(static_cast<std::size_t>(kFrag) * kLdProbs * 2);
  s.probs = at;
  s.probs_warp = (k == Kernel::kDkv ? 2 : 1) * probs;
  at += kWarps * s.probs_warp;
  s.bytes = at;
  return s;
}
// dK/dV: the second per-warp matrix (dS^T) follows P^T.
ZINF_HD std::size_t dkv_ds_offset() { return align128(static_cast<std::size_t>(kFrag) * kLdProbs * 2); }

ZINF_HD int tiles(int T) { return (T + kTile - 1) / kTile; }

// Forward and dQ: the block of query tile `qt` walks key tiles 0 .. qt (qt is the diagonal).
ZINF_HD int key_tiles_for_query_tile(int qt) { return qt + 1; }
// dK/dV: the block of key tile `kt` walks query tiles kt .. tiles(T) - 1.
ZINF_HD int first_query_tile(int kt) { return kt; }

// The grids run the longest blocks first: forward and dQ blocks x = 0 take the last query tile.
ZINF_HD int query_tile_of_block(int block_x, int q_tiles) { return q_tiles - 1 - block_x; }

// The causal mask with the tails: query `row` sees `key` when key <= row, both inside [0, T).
ZINF_HD bool visible(int row, int key, int T) { return key <= row && row < T; }

// A (kFrag x kFrag) fragment of rows [r0, r0 + 16) and keys [k0, k0 + 16) has no visible pair
// (the warp skips its products and writes zeros) when its first key is past its last row.
ZINF_HD bool fragment_masked(int r0, int k0) { return k0 > r0 + kFrag - 1; }

// Element-wise passes over a (kFrag x kFrag) fragment staged in shared memory: lane `lane`
// handles elements e = lane + 32 i, i < 8, at (row e / 16, column e % 16).
inline constexpr int kChunkPerLane = kFrag * kFrag / 32;  // 8
ZINF_HD int chunk_row(int lane, int i) { return (lane + 32 * i) / kFrag; }
ZINF_HD int chunk_col(int lane, int i) { return (lane + 32 * i) % kFrag; }

// The forward's row statistics: lanes 2r and 2r + 1 of a warp own row r of its kFrag rows,
// columns [half * kTile / 2, (half + 1) * kTile / 2) of the key tile.
inline constexpr int kHalfTile = kTile / 2;
ZINF_HD int stats_row(int lane) { return lane >> 1; }
ZINF_HD int stats_half(int lane) { return lane & 1; }

// The online softmax update of one row over one key tile: m, l the running max of the scaled
// scores and the sum of exp(x - m); `tile_max` the tile's max (-inf if the row saw no key).
// alpha rescales what was accumulated before: 0 when nothing was (m = -inf).
struct RowUpdate {
  float m;
  float alpha;
};
ZINF_HD RowUpdate row_update(float m, float tile_max) {
  const float m_new = m > tile_max ? m : tile_max;
  if (m_new == -INFINITY) return RowUpdate{m_new, 1.0f};  // nothing seen yet: nothing to rescale
  return RowUpdate{m_new, m == -INFINITY ? 0.0f : exp_f(m - m_new)};
}

// P = exp(S * scale - lse) (the backward's recomputation) and dS = P * (dP - D), as
// attention_math.h (the scale goes into the dQ, dK products).
ZINF_HD float prob(float s, float scale, float lse) { return exp_f(s * scale - lse); }
ZINF_HD float score_grad(float p, float dp, float d) { return p * (dp - d); }

}  // namespace zinf::gpu::tc
