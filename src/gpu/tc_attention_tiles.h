// Internal: the tile arithmetic of the tensor-core attention kernels (tc_attention.cu): tile and
// fragment sizes, each kernel's shared-memory layout, which tiles and 16x16 fragments a block
// visits, the lanes of the tensor-core instructions (mma_sm80.cuh), the causal mask and the
// per-element formulas. The kernels call these functions; the host tests
// (tests/gpu/tc_attention_host_test.cpp) walk the same loops with them and check that every
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
inline constexpr int kFrag = 16;  // rows (or keys) of a warp; the k of mma m16n8k16
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

// Row stride of the bf16 (kTile, hs) tiles of q, k, v, dout in shared memory (elements), padded
// so that ldmatrix's eight 16-byte rows fall in distinct banks; every row starts 16-byte aligned.
ZINF_HD int ld_head(int hs) { return hs + 8; }

// Byte offsets of one kernel's shared memory regions (each 128-byte aligned). The products'
// operands and results live in registers (mma_sm80.cuh); shared memory holds only the tiles.
struct SmemLayout {
  std::size_t tile_bytes = 0;  // one bf16 (kTile, ld_head) tile
  // Forward and dQ: k, v in t0, t1 (q and dout are staged there once and then held in
  // registers; t2, t3 unused); dK/dV: k, v, q, dout.
  std::size_t t0 = 0, t1 = 0, t2 = 0, t3 = 0;
  std::size_t lse = 0, dsum = 0;  // dK/dV: kTile floats each (the query tile's lse and D)
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
    s.lse = at;
    at += align128(kTile * 4);
    s.dsum = at;
    at += align128(kTile * 4);
  }
  s.bytes = at;
  return s;
}

// The lanes of mma_sm80.cuh's m16n8k16: element i (0..3) of a lane's accumulator of one 16x8
// tile is at row acc_row, column acc_col; rows g and g + 8 of the lane group g = lane / 4.
ZINF_HD int acc_row(int lane, int i) { return (lane >> 2) + 8 * (i >> 1); }
ZINF_HD int acc_col(int lane, int i) { return 2 * (lane & 3) + (i & 1); }

// The row and column (elements) within a 16x16 block that lane points ldmatrix_x4 at:
//  - ldm_*_a: an A operand (rows m, columns k), or with _trans a B operand of two n8 tiles
//    stored as (k rows, n columns): registers 0, 1 the first n8 tile, 2, 3 the second;
//  - ldm_*_bn: a B operand of two n8 tiles stored as (n rows, k columns), without _trans.
ZINF_HD int ldm_row_a(int lane) { return (lane & 7) + 8 * ((lane >> 3) & 1); }
ZINF_HD int ldm_col_a(int lane) { return 8 * (lane >> 4); }
ZINF_HD int ldm_row_bn(int lane) { return (lane & 7) + 8 * (lane >> 4); }
ZINF_HD int ldm_col_bn(int lane) { return 8 * ((lane >> 3) & 1); }

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
