// Launch geometry and scratch sizes of the GPU kernels (host arithmetic, tested without a GPU).
#include "gpu/launch_geometry.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace zinf::gpu {

unsigned grid_for(std::size_t n, int threads) {
  if (n == 0 || threads <= 0) return 0;
  const std::size_t t = static_cast<std::size_t>(threads);
  const std::size_t blocks = n / t + (n % t != 0 ? 1 : 0);
  return static_cast<unsigned>(std::min<std::size_t>(blocks, kMaxBlocks));
}

int column_chunks(int N) { return N <= 0 ? 0 : (N - 1) / kColumnChunkRows + 1; }

std::size_t column_sum_scratch_floats(int N, int C) {
  if (N <= 0 || C <= 0) return 0;
  return static_cast<std::size_t>(column_chunks(N)) * static_cast<std::size_t>(C);
}

std::size_t layernorm_backward_scratch_floats(int N, int C) { return 2 * column_sum_scratch_floats(N, C); }

std::size_t rmsnorm_backward_scratch_floats(int N, int C) { return column_sum_scratch_floats(N, C); }

Status check_column_sum_shape(int N, int C, std::string_view what) {
  if (N < 1 || C < 1) return Status::invalid_argument(fmt::format("{}: N ({}) and C ({}) must be >= 1", what, N, C));
  if (column_chunks(N) > kMaxColumnChunks) {
    return Status::unsupported(fmt::format("{}: N ({}) rows is more than {} chunks of {}", what, N, kMaxColumnChunks,
                                           kColumnChunkRows));
  }
  return Status::ok();
}

int logits_ld(int V) { return V <= 0 ? 0 : (V + 63) / 64 * 64; }

std::size_t head_weight_pad_elems(int V, int C) {
  if (V <= 0 || C <= 0 || logits_ld(V) == V) return 0;
  return static_cast<std::size_t>(logits_ld(V)) * static_cast<std::size_t>(C);
}

namespace {

// Tiles and shared memory once the sizes are valid (B, T, NH, NKV >= 1, 1 <= hs <= 128).
Result<AttentionGeometry> tile_geometry(int B, int T, int NH, int NKV, int hs, const char* what) {
  const long long heads = static_cast<long long>(B) * NH;
  if (heads > 65535) {
    return Status::unsupported(fmt::format("{}: B * NH = {} heads is above grid.y's 65535", what, heads));
  }
  AttentionGeometry g;
  g.hs = hs;
  g.per_lane = (g.hs + 31) / 32;
  g.q_tiles = static_cast<unsigned>((T + kAttnQTile - 1) / kAttnQTile);
  g.k_tiles = static_cast<unsigned>((T + kAttnKTile - 1) / kAttnKTile);
  g.heads = static_cast<unsigned>(heads);
  g.kv_heads = static_cast<unsigned>(static_cast<long long>(B) * NKV);
  const std::size_t h = static_cast<std::size_t>(g.hs);
  const std::size_t f = sizeof(float);
  g.forward_smem = f * (kAttnQTile * h + kAttnKTile * (h + 1) + kAttnKTile * h);
  g.dq_smem = f * (2 * kAttnQTile * h + 2 * kAttnKTile * (h + 1));
  g.dkv_smem = f * (2 * kAttnKTile * (h + 1) + 2 * kAttnKTile * h + 2 * kAttnKTile);
  return g;
}

}  // namespace

Result<AttentionGeometry> attention_geometry(int B, int T, int C, int NH) {
  if (B < 1 || T < 1 || C < 1 || NH < 1 || C % NH != 0) {
    return Status::invalid_argument(
        fmt::format("attention: B ({}), T ({}), C ({}), NH ({}) must be >= 1 with C divisible by NH", B, T, C, NH));
  }
  const int hs = C / NH;
  if (hs > 32 * kAttnMaxPerLane) {
    return Status::unsupported(fmt::format("attention: head size {} (C {} / NH {}) is above the kernels' {}", hs, C,
                                           NH, 32 * kAttnMaxPerLane));
  }
  return tile_geometry(B, T, NH, NH, hs, "attention");
}

Result<AttentionGeometry> gqa_attention_geometry(int B, int T, int NH, int NKV, int hs) {
  if (B < 1 || T < 1 || NH < 1 || NKV < 1 || hs < 1 || NH % NKV != 0) {
    return Status::invalid_argument(fmt::format(
        "gqa_attention: B ({}), T ({}), NH ({}), NKV ({}), hs ({}) must be >= 1 with NH divisible by NKV", B, T, NH,
        NKV, hs));
  }
  if (hs > 32 * kAttnMaxPerLane) {
    return Status::unsupported(
        fmt::format("gqa_attention: head size {} is above the kernels' {}", hs, 32 * kAttnMaxPerLane));
  }
  return tile_geometry(B, T, NH, NKV, hs, "gqa_attention");
}

std::size_t attention_backward_scratch_floats(int B, int T, int NH) {
  if (B <= 0 || T <= 0 || NH <= 0) return 0;
  return static_cast<std::size_t>(B) * static_cast<std::size_t>(NH) * static_cast<std::size_t>(T);
}

std::uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (a == 0) return 256;
  std::uint32_t align = 1;
  while (align < 256 && (a & align) == 0) align <<= 1;
  return align;
}

Result<EmbeddingBuckets> make_embedding_buckets(std::span<const int32_t> ids, int V) {
  if (ids.size() > static_cast<std::size_t>(std::numeric_limits<int32_t>::max())) {
    return Status::invalid_argument(fmt::format("embedding: {} positions do not fit int32", ids.size()));
  }
  std::vector<int32_t> count(static_cast<std::size_t>(std::max(V, 0)), 0);
  for (std::size_t i = 0; i < ids.size(); i++) {
    const int32_t id = ids[i];
    if (id < 0 || id >= V) {
      return Status::invalid_argument(
          fmt::format("embedding: token id {} at position {} is outside the vocabulary of {}", id, i, V));
    }
    count[static_cast<std::size_t>(id)]++;
  }
  EmbeddingBuckets b;
  b.starts.push_back(0);
  std::vector<int32_t> first(count.size(), 0);  // where each token's positions start
  for (int v = 0; v < V; v++) {
    if (count[static_cast<std::size_t>(v)] == 0) continue;
    first[static_cast<std::size_t>(v)] = b.starts.back();
    b.tokens.push_back(v);
    b.starts.push_back(b.starts.back() + count[static_cast<std::size_t>(v)]);
  }
  b.positions.resize(ids.size());
  for (std::size_t i = 0; i < ids.size(); i++) {
    int32_t& next = first[static_cast<std::size_t>(ids[i])];
    b.positions[static_cast<std::size_t>(next++)] = static_cast<int32_t>(i);
  }
  return b;
}

}  // namespace zinf::gpu
