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
