// Internal: launch geometry, tile sizes and scratch sizes of the GPU kernels, computed on the
// host so that the arithmetic is tested on machines without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "zinf/status.h"

namespace zinf::gpu {

// Elementwise kernels: blocks of kThreads threads in grid-stride loops over size_t indices.
inline constexpr int kThreads = 256;
// At most this many blocks per elementwise launch; the grid-stride loops cover the rest.
inline constexpr unsigned kMaxBlocks = 65536;
// Blocks for n elements with `threads` per block: ceil(n / threads), at most kMaxBlocks; 0
// when n == 0 (the launcher then launches nothing).
unsigned grid_for(std::size_t n, int threads);

// Column sums (bias gradients, LayerNorm weight and bias gradients) run in two deterministic
// steps: each chunk of kColumnChunkRows rows writes its per-column sums to scratch, then one pass
// adds the chunks in chunk order. No atomics, so the bits do not depend on scheduling.
inline constexpr int kColumnChunkRows = 64;
// The chunks are grid.y of the first step, at most 65535.
inline constexpr int kMaxColumnChunks = 65535;
int column_chunks(int N);  // ceil(N / kColumnChunkRows)
// Scratch floats of one column sum over (N, C); the LayerNorm backward needs two of them.
std::size_t column_sum_scratch_floats(int N, int C);
std::size_t layernorm_backward_scratch_floats(int N, int C);
Status check_column_sum_shape(int N, int C, std::string_view what);
// RMSNorm's backward: one column sum (the weight gradient).
std::size_t rmsnorm_backward_scratch_floats(int N, int C);

// LayerNorm: one warp per row, kLayerNormRowsPerBlock rows (warps) per block.
inline constexpr int kLayerNormRowsPerBlock = 8;

// The logits' row stride in elements, and the rows of the head's padded weight (gpu_pass.h):
// V rounded up to a multiple of 64, so that every row of the bf16 logits starts 16-byte aligned
// and the head's products see aligned dimensions (for V = 50257 cuBLASLt otherwise picks
// align-1 kernels: 11.5 of GPT-2's 134 ms of kernels a step on an H100, docs/gpu.md).
int logits_ld(int V);
// Elements of the head's padded weight copy for V rows of C: logits_ld(V) * C, or 0 when V is
// already a multiple of 64 (the weight is used in place).
std::size_t head_weight_pad_elems(int V, int C);

// The flash attention kernels (flash_attention.cu). Forward and dQ: a block of kAttnWarps warps
// owns kAttnQTile query rows (kAttnRowsPerWarp per warp) and walks key tiles of kAttnKTile keys
// (one key per lane). dK/dV: a block owns kAttnKTile keys (kAttnKeysPerWarp per warp) and walks
// query tiles of kAttnKTile rows (one row per lane). Each lane holds `per_lane` = ceil(hs / 32)
// elements of a head row, so hs may be at most 32 * kAttnMaxPerLane.
inline constexpr int kAttnWarps = 4;
inline constexpr int kAttnRowsPerWarp = 4;
inline constexpr int kAttnQTile = kAttnWarps * kAttnRowsPerWarp;  // 16
inline constexpr int kAttnKTile = 32;
inline constexpr int kAttnKeysPerWarp = kAttnKTile / kAttnWarps;  // 8
inline constexpr int kAttnMaxPerLane = 4;                         // hs <= 128

struct AttentionGeometry {
  int hs = 0;            // head size C / NH
  int per_lane = 0;      // ceil(hs / 32), 1..kAttnMaxPerLane: which kernel instance runs
  unsigned q_tiles = 0;  // grid.x of the forward and dQ kernels: ceil(T / kAttnQTile)
  unsigned k_tiles = 0;  // grid.x of the dK/dV kernel: ceil(T / kAttnKTile)
  unsigned heads = 0;    // grid.y of the forward and dQ kernels: B * NH
  unsigned kv_heads = 0; // grid.y of the dK/dV kernel: B * NKV (B * NH without grouped queries)
  // Dynamic shared memory in bytes of each kernel (fp32 tiles; rows read one per lane are
  // padded to hs + 1 floats so the 32 lanes hit 32 different banks).
  std::size_t forward_smem = 0;
  std::size_t dq_smem = 0;
  std::size_t dkv_smem = 0;
};
// invalid_argument for bad dimensions (C not divisible by NH, ...); unsupported for hs > 128 or
// B * NH > 65535 (grid.y).
Result<AttentionGeometry> attention_geometry(int B, int T, int C, int NH);
// Grouped-query attention (Llama): NH query heads and NKV kv heads of hs each. invalid_argument
// for a size below 1 or NH not divisible by NKV; unsupported for hs > 128 or B * NH > 65535.
Result<AttentionGeometry> gqa_attention_geometry(int B, int T, int NH, int NKV, int hs);
// Floats of attention_backward's (and gqa_attention_backward's) scratch: D = rowsum(dO * O) per
// (b, h, t) of the NH query heads.
std::size_t attention_backward_scratch_floats(int B, int T, int NH);

// ---- GEMM attention (gemm_attention.h) ------------------------------------------------------
// A kv group's G = NH / NKV query heads are split into units of `heads_per_unit` (a divisor of
// G) heads, and each unit's rows into time blocks of `time_block` query positions: block
// [t0, t1) needs keys 0 .. t1 - 1 only, so its scores are ((t1 - t0) * heads_per_unit, t1)
// (causal skipping at block granularity). One strided-batched product covers one (unit, block)
// of `chunk` consecutive kv groups. The head-major copies order a unit's rows (t, head), so a
// block's rows are contiguous. The score region holds per row ld_t fp32 S, fp32 dP, bf16 P,
// bf16 dS (12 bytes per element; the forward uses S and P). The plan takes the largest block
// (at most kGemmAttnTimeBlock), then unit, then chunk that fit the scratch and balances the calls.
inline constexpr std::size_t kGemmAttnMaxScoreBytes = std::size_t{512} << 20;
inline constexpr int kGemmAttnTimeBlock = 256;
struct GemmAttentionPlan {
  int B = 0, T = 0, NH = 0, NKV = 0, hs = 0;
  int G = 0;               // NH / NKV
  int ld_hs = 0;           // hs rounded up to 8: the row stride of the head-major copies
  int ld_t = 0;            // T rounded up to 8: the row stride of the score matrices
  int time_block = 0;      // query positions per block; 0: no room (the flash kernels run)
  int time_blocks = 0;     // ceil(T / time_block)
  int heads_per_unit = 0;  // 0: no room
  int units_per_group = 0; // G / heads_per_unit
  int chunk = 0;           // kv groups per batched product
  int calls = 0;           // ceil(B*NKV / chunk): batched calls per product, unit and block
  // Byte offsets into the scratch, each 256-aligned. D = rowsum(dO * O) (B*NH*T fp32); the
  // head-major copies (ld_hs elements per row): q, dout (forward: out), dq in bf16 (B*NH*T rows,
  // ordered (b, kv group, unit, t, head in unit)), k, v in bf16 and dk, dv in fp32 (B*NKV*T rows,
  // (b, kv head, t)); then the score region: S, dP fp32 and P, dS bf16, each
  // chunk * heads_per_unit * time_block rows of ld_t.
  std::size_t d_off = 0, q_off = 0, k_off = 0, v_off = 0, o_off = 0, dq_off = 0, dk_off = 0, dv_off = 0;
  std::size_t s_off = 0, dp_off = 0, p_off = 0, ds_off = 0;
  std::size_t bytes = 0;  // the scratch this plan uses
};
// invalid_argument for a size below 1 or NH not divisible by NKV. `scratch_bytes`: what the
// caller has; with too little for one row block of one head, heads_per_unit = 0 and bytes = D's
// B*NH*T floats (what the flash kernels' backward needs).
Result<GemmAttentionPlan> gemm_attention_plan(int B, int T, int NH, int NKV, int hs, std::size_t scratch_bytes);
// The scratch a net carves for any pass of at most max_bt rows with T <= max_T: the head-major
// copies and D for max_bt rows plus a score region of min(kGemmAttnMaxScoreBytes, what all
// heads' blocks of kGemmAttnTimeBlock rows take at once). With it every pass fits one call per
// block and product up to that bound, and the GEMM path runs for any T up to about 44 million
// (one row of 12-byte scores must fit the region). 0 for sizes < 1.
std::size_t gemm_attention_scratch_bytes(int max_bt, int max_T, int NH, int NKV, int hs);

// The largest power of two, at most 256, that divides the address (256 for nullptr). cuBLASLt
// is told this so that its heuristic never picks a kernel needing more alignment than given.
std::uint32_t alignment_of(const void* p);

// The token scatter of the embedding backward without atomics: the distinct token ids of a
// batch in ascending order, and for each the positions (b * T + t, ascending) where it occurs.
// Token tokens[i] occurs at positions[starts[i] .. starts[i + 1]).
struct EmbeddingBuckets {
  std::vector<int32_t> tokens;
  std::vector<int32_t> starts;  // tokens.size() + 1
  std::vector<int32_t> positions;
};
// invalid_argument naming the position and value of an id outside [0, V).
Result<EmbeddingBuckets> make_embedding_buckets(std::span<const int32_t> ids, int V);

}  // namespace zinf::gpu
