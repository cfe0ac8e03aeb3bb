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

namespace {
constexpr std::size_t kRegionAlign = 256;
std::size_t align_up(std::size_t n) { return (n + kRegionAlign - 1) / kRegionAlign * kRegionAlign; }
int round8(int n) { return (n + 7) / 8 * 8; }

// Lays out D and the head-major copies from offset 0; returns the end.
std::size_t fixed_regions(GemmAttentionPlan* p) {
  const std::size_t q_rows = static_cast<std::size_t>(p->B) * p->NH * p->T;
  const std::size_t kv_rows = static_cast<std::size_t>(p->B) * p->NKV * p->T;
  const std::size_t ld = static_cast<std::size_t>(p->ld_hs);
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t here = at;
    at += align_up(bytes);
    return here;
  };
  p->d_off = take(q_rows * sizeof(float));
  p->q_off = take(q_rows * ld * 2);
  p->o_off = take(q_rows * ld * 2);
  p->dq_off = take(q_rows * ld * 2);
  p->k_off = take(kv_rows * ld * 2);
  p->v_off = take(kv_rows * ld * 2);
  p->dk_off = take(kv_rows * ld * sizeof(float));
  p->dv_off = take(kv_rows * ld * sizeof(float));
  return at;
}

// Bytes of the four score matrices of `rows` stacked rows, each region aligned.
std::size_t score_bytes(std::size_t rows, int ld_t) {
  const std::size_t n = rows * static_cast<std::size_t>(ld_t);
  return 2 * align_up(n * sizeof(float)) + 2 * align_up(n * 2);
}
}  // namespace

Result<GemmAttentionPlan> gemm_attention_plan(int B, int T, int NH, int NKV, int hs, std::size_t scratch_bytes) {
  if (B < 1 || T < 1 || NH < 1 || NKV < 1 || hs < 1 || NH % NKV != 0) {
    return Status::invalid_argument(fmt::format(
        "gemm_attention: B ({}), T ({}), NH ({}), NKV ({}), hs ({}) must be >= 1 with NH divisible by NKV", B, T, NH,
        NKV, hs));
  }
  GemmAttentionPlan p;
  p.B = B;
  p.T = T;
  p.NH = NH;
  p.NKV = NKV;
  p.hs = hs;
  p.G = NH / NKV;
  p.ld_hs = round8(hs);
  p.ld_t = round8(T);
  const std::size_t fixed = fixed_regions(&p);
  p.bytes = static_cast<std::size_t>(B) * NH * T * sizeof(float);  // D only, for the flash kernels
  if (scratch_bytes < fixed) return p;
  const std::size_t room = scratch_bytes - fixed;
  // The largest block (halving from kGemmAttnTimeBlock) whose rows of one head fit.
  int tb = std::min(T, kGemmAttnTimeBlock);
  while (tb > 1 && score_bytes(static_cast<std::size_t>(tb), p.ld_t) > room) tb = (tb + 1) / 2;
  if (score_bytes(static_cast<std::size_t>(tb), p.ld_t) > room) return p;
  // The largest divisor of G whose stacked heads fit.
  int hpu = 1;
  for (int h = p.G; h >= 1; h--) {
    if (p.G % h == 0 && score_bytes(static_cast<std::size_t>(h) * tb, p.ld_t) <= room) {
      hpu = h;
      break;
    }
  }
  p.time_block = tb;
  p.time_blocks = (T + tb - 1) / tb;
  p.heads_per_unit = hpu;
  p.units_per_group = p.G / hpu;
  const int groups = B * NKV;
  const std::size_t unit_rows = static_cast<std::size_t>(hpu) * tb;
  // Most groups per call that fit (score_bytes is not linear in rows because of the alignment).
  std::size_t lo = 1, hi = static_cast<std::size_t>(groups);
  while (lo < hi) {
    const std::size_t mid = (lo + hi + 1) / 2;
    if (score_bytes(mid * unit_rows, p.ld_t) <= room) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  p.calls = static_cast<int>((static_cast<std::size_t>(groups) + lo - 1) / lo);
  p.chunk = (groups + p.calls - 1) / p.calls;  // balanced: every call but the last has `chunk` groups
  p.calls = (groups + p.chunk - 1) / p.chunk;
  const std::size_t n = static_cast<std::size_t>(p.chunk) * unit_rows * static_cast<std::size_t>(p.ld_t);
  std::size_t at = fixed;
  p.s_off = at;
  at += align_up(n * sizeof(float));
  p.dp_off = at;
  at += align_up(n * sizeof(float));
  p.p_off = at;
  at += align_up(n * 2);
  p.ds_off = at;
  at += align_up(n * 2);
  p.bytes = at;
  return p;
}

std::size_t gemm_attention_scratch_bytes(int max_bt, int max_T, int NH, int NKV, int hs) {
  if (max_bt < 1 || max_T < 1 || NH < 1 || NKV < 1 || hs < 1 || NH % NKV != 0) return 0;
  const int T = std::min(max_T, max_bt);
  GemmAttentionPlan p;
  p.B = 1;
  p.T = max_bt;  // B*T rows for the head-major copies
  p.NH = NH;
  p.NKV = NKV;
  p.ld_hs = round8(hs);
  const std::size_t fixed = fixed_regions(&p);
  // All blocks of a pass (B, T) at once: B*NH*min(T, block) rows of round8(T); with B*T <= max_bt
  // that is at most NH * max_bt * min(block + 7, round8(max_T)) elements.
  const std::size_t per_row = static_cast<std::size_t>(std::min(kGemmAttnTimeBlock + 7, round8(T)));
  const std::size_t all = score_bytes(static_cast<std::size_t>(max_bt) * NH, static_cast<int>(per_row));
  return fixed + std::min(all, kGemmAttnMaxScoreBytes);
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
