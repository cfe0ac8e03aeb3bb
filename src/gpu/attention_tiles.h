// Internal: the index arithmetic of the flash attention kernels' loops (which query rows and
// keys each block, warp and lane visits), shared with the host tests that walk the same loops
// and check that every causal (row, key) pair is visited exactly once.
#pragma once

#include "gpu/launch_geometry.h"
#include "gpu/numerics.h"

namespace zinf::gpu::attn {

// Forward and dQ: block q0 = blockIdx.x * kAttnQTile; warp w's rows q0 + w*kAttnRowsPerWarp + rr.
ZINF_HD int query_row(int q0, int warp, int rr) { return q0 + warp * kAttnRowsPerWarp + rr; }
// The block's last row: its key tiles k0 = 0, kAttnKTile, ... run while k0 <= last_row.
ZINF_HD int last_row(int q0, int T) { return (q0 + kAttnQTile < T ? q0 + kAttnQTile : T) - 1; }
// Whether the warp works on `row` in key tile k0 (the same for all its lanes).
ZINF_HD bool row_active(int row, int k0, int T) { return row < T && row >= k0; }
// Keys k0 .. k0 + keys_seen - 1 of the tile are visible to an active row (causal mask).
ZINF_HD int keys_seen(int row, int k0) { return row - k0 + 1 < kAttnKTile ? row - k0 + 1 : kAttnKTile; }

// dK/dV: block key0 = blockIdx.x * kAttnKTile; warp w's keys key0 + w*kAttnKeysPerWarp + kk;
// query tiles q0 = key0, key0 + kAttnKTile, ... while q0 < T.
ZINF_HD int dkv_key(int key0, int warp, int kk) { return key0 + warp * kAttnKeysPerWarp + kk; }
// Rows q0 + j of a query tile that see `key`: j in [first_row, rows_here).
ZINF_HD int dkv_first_row(int key, int q0) { return key - q0 > 0 ? key - q0 : 0; }
ZINF_HD int dkv_rows_here(int q0, int T) { return T - q0 < kAttnKTile ? T - q0 : kAttnKTile; }

}  // namespace zinf::gpu::attn
