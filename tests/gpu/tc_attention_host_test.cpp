// The tensor-core attention's host side, on every machine: its tile arithmetic
// (tc_attention_tiles.h) walked as the kernels' blocks, warps and lanes walk it (every causal
// (row, key) pair computed exactly once, no visible pair in a skipped fragment), the shared-memory
// layouts (within 99 KiB, aligned, disjoint), the online-softmax update, the size and alignment
// checks, the path selection (ZINF_ATTENTION), and the kernels' algorithm mirrored on the host
// against the CPU references with the GPU tests' tolerances (attention_tolerances.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <utility>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "attention_tolerances.h"
#include "gpu/tc_attention.h"
#include "gpu/tc_attention_tiles.h"
#include "gpu_test_util.h"
#include "kernel_test_util.h"
#include "model/kernels.h"
#include "model/llama_kernels.h"

namespace zinf::gpu {
namespace {

using testing::expect_close_grad;
using testing::expect_close_out;
using testing::near_all;
using testing::randn;
using testing::rounded;

// ---- host: the tile arithmetic --------------------------------------------------------------

const int kTs[] = {1, 2, 15, 16, 17, 63, 64, 65, 127, 128, 130, 300};

// Forward and dQ: blocks x of tiles(T) (query tile query_tile_of_block), key tiles up to the
// diagonal, warps' 16-row fragments against 16-key fragments, skipped where fragment_masked;
// the lanes' elements of each computed fragment; visible pairs counted.
TEST(TcAttentionTiles, ForwardAndDqVisitEveryCausalPairOnce) {
  using namespace tc;
  for (int T : kTs) {
    SCOPED_TRACE("T " + std::to_string(T));
    std::vector<int> seen(static_cast<std::size_t>(T) * T, 0);
    std::vector<int> tiles_of_block(static_cast<std::size_t>(tiles(T)), 0);
    for (int x = 0; x < tiles(T); x++) {
      const int qt = query_tile_of_block(x, tiles(T));
      ASSERT_GE(qt, 0);
      tiles_of_block[static_cast<std::size_t>(qt)]++;
      for (int kt = 0; kt < key_tiles_for_query_tile(qt); kt++) {
        for (int w = 0; w < kWarps; w++) {
          const int r0 = qt * kTile + w * kFrag;
          for (int j = 0; j < kTileFrags; j++) {
            const int k0 = kt * kTile + j * kFrag;
            if (fragment_masked(r0, k0)) {
              for (int rr = 0; rr < kFrag; rr++) {
                for (int cc = 0; cc < kFrag; cc++) ASSERT_FALSE(visible(r0 + rr, k0 + cc, T));
              }
              continue;
            }
            std::vector<int> hit(kFrag * kFrag, 0);
            for (int lane = 0; lane < 32; lane++) {  // two n8 accumulator tiles of 4 elements
              for (int n = 0; n < 2; n++) {
                for (int i = 0; i < 4; i++) {
                  const int rr = acc_row(lane, i);
                  const int cc = n * 8 + acc_col(lane, i);
                  hit[static_cast<std::size_t>(rr * kFrag + cc)]++;
                  if (visible(r0 + rr, k0 + cc, T)) {
                    ASSERT_LT(r0 + rr, T);
                    ASSERT_LT(k0 + cc, T);
                    seen[static_cast<std::size_t>(r0 + rr) * T + (k0 + cc)]++;
                  }
                }
              }
            }
            for (int n : hit) ASSERT_EQ(n, 1);  // the lanes cover the fragment once
          }
        }
      }
    }
    for (int n : tiles_of_block) EXPECT_EQ(n, 1);
    for (int row = 0; row < T; row++) {
      for (int key = 0; key < T; key++) {
        ASSERT_EQ(seen[static_cast<std::size_t>(row) * T + key], key <= row ? 1 : 0) << row << " " << key;
      }
    }
  }
}

// ldmatrix as PTX defines it (lanes 8i .. 8i+7 address matrix i's rows; lane l receives (row
// l / 4, columns 2(l % 4), +1), or that transposed) pointed by the ldm_* functions at a 16x16
// block gives the mma m16n8k16 operand layouts mma_sm80.cuh states: A (row g + 8 (j & 1),
// column 2t + 8 (j >> 1)); B of two n8 tiles from (n, k) rows without trans or from (k, n) rows
// with trans (k 2t + 8 (j & 1), n g + 8 (j >> 1)). Elements are coded 100 * row + column.
TEST(TcAttentionTiles, LdmatrixAddressesGiveTheMmaOperandLayouts) {
  using namespace tc;
  auto element = [](int r, int c) { return 100 * r + c; };
  // reg[lane][i]: the pair register i of `lane` as (low, high) codes.
  auto ldmatrix = [&](auto row_of, auto col_of, bool trans) {
    std::vector<std::array<std::pair<int, int>, 4>> reg(32);
    for (int l = 0; l < 32; l++) {
      for (int i = 0; i < 4; i++) {
        const int g = l / 4, t = l % 4;
        auto at = [&](int addr_lane, int c) { return element(row_of(addr_lane), col_of(addr_lane) + c); };
        reg[static_cast<std::size_t>(l)][static_cast<std::size_t>(i)] =
            trans ? std::pair{at(8 * i + 2 * t, g), at(8 * i + 2 * t + 1, g)}
                  : std::pair{at(8 * i + g, 2 * t), at(8 * i + g, 2 * t + 1)};
      }
    }
    return reg;
  };
  const auto a = ldmatrix(ldm_row_a, ldm_col_a, false);
  const auto bn = ldmatrix(ldm_row_bn, ldm_col_bn, false);
  const auto bt = ldmatrix(ldm_row_a, ldm_col_a, true);
  for (int l = 0; l < 32; l++) {
    const int g = l / 4, t = l % 4;
    for (int j = 0; j < 4; j++) {
      const auto& ra = a[static_cast<std::size_t>(l)][static_cast<std::size_t>(j)];
      const int row = g + 8 * (j & 1), col = 2 * t + 8 * (j >> 1);
      EXPECT_EQ(ra, std::pair(element(row, col), element(row, col + 1))) << "A lane " << l << " reg " << j;
      // B: k = 2t + 8 (j & 1) (and + 1), n = g + 8 (j >> 1); stored (n, k) or (k, n).
      const int k = 2 * t + 8 * (j & 1), n = g + 8 * (j >> 1);
      EXPECT_EQ(bn[static_cast<std::size_t>(l)][static_cast<std::size_t>(j)],
                std::pair(element(n, k), element(n, k + 1)))
          << "B (n, k) lane " << l << " reg " << j;
      EXPECT_EQ(bt[static_cast<std::size_t>(l)][static_cast<std::size_t>(j)],
                std::pair(element(k, n), element(k + 1, n)))
          << "B (k, n) lane " << l << " reg " << j;
    }
  }
  // The accumulator: each of a 16x8 tile's elements in exactly one (lane, i).
  std::vector<int> hit(16 * 8, 0);
  for (int l = 0; l < 32; l++) {
    for (int i = 0; i < 4; i++) hit[static_cast<std::size_t>(acc_row(l, i) * 8 + acc_col(l, i))]++;
  }
  for (int n : hit) EXPECT_EQ(n, 1);
}

// dK/dV: per key tile and warp, the query tiles from the diagonal down and their 16-query
// fragments (skipped where fragment_masked(query, key)); once per query head of the kv head.
TEST(TcAttentionTiles, DkvVisitsEveryCausalPairOnce) {
  using namespace tc;
  for (int T : kTs) {
    SCOPED_TRACE("T " + std::to_string(T));
    std::vector<int> seen(static_cast<std::size_t>(T) * T, 0);
    for (int kt = 0; kt < tiles(T); kt++) {
      for (int w = 0; w < kWarps; w++) {
        const int c0 = kt * kTile + w * kFrag;
        for (int qt = first_query_tile(kt); qt < tiles(T); qt++) {
          for (int j = 0; j < kTileFrags; j++) {
            const int qj = qt * kTile + j * kFrag;
            if (fragment_masked(qj, c0)) {
              for (int rr = 0; rr < kFrag; rr++) {
                for (int cc = 0; cc < kFrag; cc++) ASSERT_FALSE(visible(qj + cc, c0 + rr, T));
              }
              continue;
            }
            for (int lane = 0; lane < 32; lane++) {  // S^T: keys are rows, queries columns
              for (int n = 0; n < 2; n++) {
                for (int i = 0; i < 4; i++) {
                  const int key = c0 + acc_row(lane, i);
                  const int row = qj + n * 8 + acc_col(lane, i);
                  if (visible(row, key, T)) seen[static_cast<std::size_t>(row) * T + key]++;
                }
              }
            }
          }
        }
      }
    }
    for (int row = 0; row < T; row++) {
      for (int key = 0; key < T; key++) {
        ASSERT_EQ(seen[static_cast<std::size_t>(row) * T + key], key <= row ? 1 : 0) << row << " " << key;
      }
    }
    // Query tiles before a key tile see none of its keys (the dK/dV walk starts at the diagonal).
    for (int kt = 1; kt < tiles(T); kt++) {
      const int last_row_before = first_query_tile(kt) * kTile - 1;
      EXPECT_FALSE(visible(last_row_before, kt * kTile, T));
    }
  }
}

TEST(TcAttentionTiles, SharedMemoryLayoutsFitAndAreAligned) {
  using namespace tc;
  for (int hs = kFrag; hs <= kMaxHeadSize; hs += kFrag) {
    ASSERT_TRUE(head_size_supported(hs));
    // Every row 16-byte aligned (ldmatrix's rows, the 16-byte vector stores), and a row's 16-byte
    // segment an odd number of segments after the previous row's: ldmatrix's 8 rows of 16 bytes
    // then fall in 8 distinct groups of 4 banks.
    EXPECT_EQ(static_cast<std::size_t>(ld_head(hs)) * 2 % 16, 0u);
    EXPECT_EQ(static_cast<std::size_t>(ld_head(hs)) * 2 / 16 % 2, 1u);
    for (Kernel k : {Kernel::kForward, Kernel::kDq, Kernel::kDkv}) {
      SCOPED_TRACE("hs " + std::to_string(hs) + " kernel " + std::to_string(static_cast<int>(k)));
      const SmemLayout s = smem_layout(k, hs);
      EXPECT_LE(s.bytes, kMaxSmemBytes);
      EXPECT_GE(s.tile_bytes, static_cast<std::size_t>(kTile) * ld_head(hs) * 2);
      struct Region {
        std::size_t at, size;
      };
      std::vector<Region> r = {{s.t0, s.tile_bytes}, {s.t1, s.tile_bytes}};
      if (k == Kernel::kDkv) {
        r.push_back({s.t2, s.tile_bytes});
        r.push_back({s.t3, s.tile_bytes});
        r.push_back({s.lse, kTile * 4});
        r.push_back({s.dsum, kTile * 4});
      }
      for (std::size_t i = 0; i < r.size(); i++) {
        EXPECT_EQ(r[i].at % 128, 0u) << "region " << i;
        EXPECT_LE(r[i].at + r[i].size, s.bytes) << "region " << i;
        for (std::size_t j = i + 1; j < r.size(); j++) {
          EXPECT_TRUE(r[i].at + r[i].size <= r[j].at || r[j].at + r[j].size <= r[i].at) << i << " and " << j;
        }
      }
    }
  }
  EXPECT_FALSE(head_size_supported(0));
  EXPECT_FALSE(head_size_supported(8));
  EXPECT_FALSE(head_size_supported(72));
  EXPECT_FALSE(head_size_supported(144));
}

TEST(TcAttentionTiles, OnlineSoftmaxUpdate) {
  using tc::row_update;
  tc::RowUpdate u = row_update(-INFINITY, 2.0f);  // first tile: nothing to rescale
  EXPECT_EQ(u.m, 2.0f);
  EXPECT_EQ(u.alpha, 0.0f);
  u = row_update(2.0f, 1.0f);  // a smaller max keeps m
  EXPECT_EQ(u.m, 2.0f);
  EXPECT_EQ(u.alpha, 1.0f);
  u = row_update(1.0f, 3.0f);
  EXPECT_EQ(u.m, 3.0f);
  EXPECT_FLOAT_EQ(u.alpha, std::exp(-2.0f));
  u = row_update(-INFINITY, -INFINITY);  // a padding row: nothing seen, no NaN
  EXPECT_EQ(u.m, -INFINITY);
  EXPECT_EQ(u.alpha, 1.0f);
  EXPECT_FLOAT_EQ(tc::score_grad(0.5f, 2.0f, 0.5f), 0.75f);
}

// ---- host: the kernels' algorithm, mirrored --------------------------------------------------
// The forward, dK/dV and dQ kernels' walks on host memory, fragment by fragment as their warps
// take them, with the same formulas (tc_attention_tiles.h) and the same bf16 roundings (inputs,
// P, dS, outputs); scalar fp32 dot products stand in for the WMMA products. Checked against the
// CPU references with the GPU tests' tolerances, so that the algorithm (online softmax, masks and
// tails, the GQA head loop, where the scale goes) is tested on every machine; the device code
// itself waits for a GPU.
struct HostAttention {
  const float* q;  // layouts as TcAttentionTensors, on host floats holding bf16 values
  const float* k;
  const float* v;
  std::size_t q_ld, kv_ld, o_ld;
  int B, T, NH, NKV, hs;

  const float* q_row(int b, int h, int t) const { return q + (static_cast<std::size_t>(b) * T + t) * q_ld + h * hs; }
  std::size_t kv_at(int b, int g, int t) const { return (static_cast<std::size_t>(b) * T + t) * kv_ld + g * hs; }
  std::size_t o_at(int b, int h, int t) const { return (static_cast<std::size_t>(b) * T + t) * o_ld + h * hs; }
  int kv_head(int h) const { return h / (NH / NKV); }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(hs)); }
};

float dot(const float* x, const float* y, int n) {
  float s = 0.0f;
  for (int d = 0; d < n; d++) s += x[d] * y[d];
  return s;
}

// out (rows o_ld apart, bf16 values), lse (B,NH,T).
void tc_forward_on_host(const HostAttention& a, float* out, float* lse) {
  using namespace tc;
  const int nt = tiles(a.T);
  for (int b = 0; b < a.B; b++) {
    for (int h = 0; h < a.NH; h++) {
      const int g = a.kv_head(h);
      for (int x = 0; x < nt; x++) {
        const int qt = query_tile_of_block(x, nt);
        for (int w = 0; w < kWarps; w++) {
          const int r0 = qt * kTile + w * kFrag;
          std::vector<float> m(kFrag, -INFINITY), l(kFrag, 0.0f), o(static_cast<std::size_t>(kFrag) * a.hs, 0.0f);
          for (int kt = 0; kt < key_tiles_for_query_tile(qt); kt++) {
            const int k0 = kt * kTile;
            std::vector<float> S(kFrag * kTile, NAN);  // never read where not computed
            for (int j = 0; j < kTileFrags; j++) {
              if (fragment_masked(r0, k0 + j * kFrag)) continue;
              for (int rr = 0; rr < kFrag; rr++) {
                for (int cc = 0; cc < kFrag; cc++) {
                  const int row = r0 + rr, key = k0 + j * kFrag + cc;
                  float s = 0.0f;  // rows and keys past T are zero tiles
                  if (row < a.T && key < a.T) s = dot(a.q_row(b, h, row), a.k + a.kv_at(b, g, key), a.hs);
                  S[static_cast<std::size_t>(rr * kTile + j * kFrag + cc)] = s;
                }
              }
            }
            for (int rr = 0; rr < kFrag; rr++) {
              const int row = r0 + rr;
              float tile_max = -INFINITY;
              for (int c = 0; c < kTile; c++) {
                if (visible(row, k0 + c, a.T)) tile_max = std::max(tile_max, S[rr * kTile + c] * a.scale());
              }
              const RowUpdate u = row_update(m[rr], tile_max);
              float sum = 0.0f;
              std::vector<float> p(kTile, 0.0f);
              for (int c = 0; c < kTile; c++) {
                const float pc = visible(row, k0 + c, a.T) ? exp_f(S[rr * kTile + c] * a.scale() - u.m) : 0.0f;
                p[c] = testing::round_bf16(pc);
                sum += pc;
              }
              l[rr] = l[rr] * u.alpha + sum;
              m[rr] = u.m;
              for (int d = 0; d < a.hs; d++) {
                float acc = o[static_cast<std::size_t>(rr * a.hs + d)] * u.alpha;
                for (int c = 0; c < kTile; c++) {
                  if (k0 + c < a.T && !fragment_masked(r0, k0 + (c / kFrag) * kFrag)) {
                    acc += p[c] * a.v[a.kv_at(b, g, k0 + c) + d];
                  }
                }
                o[static_cast<std::size_t>(rr * a.hs + d)] = acc;
              }
            }
          }
          for (int rr = 0; rr < kFrag; rr++) {
            const int row = r0 + rr;
            if (row >= a.T) continue;
            const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
            for (int d = 0; d < a.hs; d++) {
              out[a.o_at(b, h, row) + d] = testing::round_bf16(o[static_cast<std::size_t>(rr * a.hs + d)] * inv);
            }
            lse[(static_cast<std::size_t>(b) * a.NH + h) * a.T + row] = m[rr] + std::log(l[rr]);
          }
        }
      }
    }
  }
}

// dq (rows q_ld apart), dk, dv (kv_ld apart), bf16 values, from dout and the mirror's out, lse.
void tc_backward_on_host(const HostAttention& a, const float* dout, const float* out, const float* lse, float* dq,
                         float* dk, float* dv) {
  using namespace tc;
  const int nt = tiles(a.T);
  const float scale = a.scale();
  std::vector<float> D(static_cast<std::size_t>(a.B) * a.NH * a.T);
  for (int b = 0; b < a.B; b++) {
    for (int h = 0; h < a.NH; h++) {
      for (int t = 0; t < a.T; t++) {
        const std::size_t at = a.o_at(b, h, t);
        D[(static_cast<std::size_t>(b) * a.NH + h) * a.T + t] = dot(dout + at, out + at, a.hs);
      }
    }
  }
  // P and dS of (row, key) of query head h: 0 where not visible.
  auto grads = [&](int b, int h, int row, int key, float& p, float& ds) {
    p = ds = 0.0f;
    if (!visible(row, key, a.T)) return;
    const int g = a.kv_head(h);
    const std::size_t bh = static_cast<std::size_t>(b) * a.NH + h;
    const float s = dot(a.q_row(b, h, row), a.k + a.kv_at(b, g, key), a.hs);
    const float dp = dot(dout + a.o_at(b, h, row), a.v + a.kv_at(b, g, key), a.hs);
    p = prob(s, scale, lse[bh * a.T + row]);
    ds = score_grad(p, dp, D[bh * a.T + row]);
  };
  const int group = a.NH / a.NKV;
  for (int b = 0; b < a.B; b++) {
    for (int g = 0; g < a.NKV; g++) {  // dK, dV: blocks (key tile, kv head), warps' 16 keys
      for (int kt = 0; kt < nt; kt++) {
        for (int w = 0; w < kWarps; w++) {
          const int c0 = kt * kTile + w * kFrag;
          std::vector<float> ak(static_cast<std::size_t>(kFrag) * a.hs, 0.0f), av(ak.size(), 0.0f);
          for (int h = g * group; h < (g + 1) * group; h++) {
            for (int qt = first_query_tile(kt); qt < nt; qt++) {
              for (int j = 0; j < kTileFrags; j++) {
                const int qj = qt * kTile + j * kFrag;
                if (fragment_masked(qj, c0)) continue;
                for (int rr = 0; rr < kFrag; rr++) {
                  for (int cc = 0; cc < kFrag; cc++) {
                    float p = 0.0f, ds = 0.0f;
                    grads(b, h, qj + cc, c0 + rr, p, ds);
                    if (p == 0.0f && ds == 0.0f) continue;
                    const float pb = testing::round_bf16(p), dsb = testing::round_bf16(ds);
                    for (int d = 0; d < a.hs; d++) {
                      av[static_cast<std::size_t>(rr * a.hs + d)] += pb * dout[a.o_at(b, h, qj + cc) + d];
                      ak[static_cast<std::size_t>(rr * a.hs + d)] += dsb * a.q_row(b, h, qj + cc)[d];
                    }
                  }
                }
              }
            }
          }
          for (int rr = 0; rr < kFrag; rr++) {
            if (c0 + rr >= a.T) continue;
            for (int d = 0; d < a.hs; d++) {
              dk[a.kv_at(b, g, c0 + rr) + d] = testing::round_bf16(ak[static_cast<std::size_t>(rr * a.hs + d)] * scale);
              dv[a.kv_at(b, g, c0 + rr) + d] = testing::round_bf16(av[static_cast<std::size_t>(rr * a.hs + d)]);
            }
          }
        }
      }
    }
    for (int h = 0; h < a.NH; h++) {  // dQ: blocks (query tile, head), warps' 16 rows
      const int g = a.kv_head(h);
      for (int x = 0; x < nt; x++) {
        const int qt = query_tile_of_block(x, nt);
        for (int w = 0; w < kWarps; w++) {
          const int r0 = qt * kTile + w * kFrag;
          std::vector<float> aq(static_cast<std::size_t>(kFrag) * a.hs, 0.0f);
          for (int kt = 0; kt < key_tiles_for_query_tile(qt); kt++) {
            for (int j = 0; j < kTileFrags; j++) {
              const int kj = kt * kTile + j * kFrag;
              if (fragment_masked(r0, kj)) continue;
              for (int rr = 0; rr < kFrag; rr++) {
                for (int cc = 0; cc < kFrag; cc++) {
                  float p = 0.0f, ds = 0.0f;
                  grads(b, h, r0 + rr, kj + cc, p, ds);
                  const float dsb = testing::round_bf16(ds);
                  if (dsb == 0.0f) continue;
                  const float* key = a.k + a.kv_at(b, g, kj + cc);
                  for (int d = 0; d < a.hs; d++) aq[static_cast<std::size_t>(rr * a.hs + d)] += dsb * key[d];
                }
              }
            }
          }
          for (int rr = 0; rr < kFrag; rr++) {
            if (r0 + rr >= a.T) continue;
            float* row = dq + (static_cast<std::size_t>(b) * a.T + r0 + rr) * a.q_ld + h * a.hs;
            for (int d = 0; d < a.hs; d++) {
              row[d] = testing::round_bf16(aq[static_cast<std::size_t>(rr * a.hs + d)] * scale);
            }
          }
        }
      }
    }
  }
}

TEST(TcAttentionOnHost, GqaMatchesCpuReference) {
  namespace cpu = model::kernels;
  const GqaShape shapes[] = {{2, 1, 4, 2, 64},  {2, 17, 4, 2, 64}, {1, 130, 4, 2, 64}, {1, 17, 4, 2, 128},
                             {1, 130, 4, 2, 128}, {2, 37, 4, 1, 32}, {1, 70, 2, 2, 16}};
  for (const GqaShape& s : shapes) {
    SCOPED_TRACE("B " + std::to_string(s.B) + " T " + std::to_string(s.T) + " NH " + std::to_string(s.NH) + " NKV " +
                 std::to_string(s.NKV) + " hs " + std::to_string(s.hs));
    const size_t nq = static_cast<size_t>(s.B) * s.T * s.NH * s.hs, nkv = static_cast<size_t>(s.B) * s.T * s.NKV * s.hs;
    const size_t nlse = static_cast<size_t>(s.B) * s.NH * s.T;
    const std::vector<float> q = rounded(randn(1, nq)), k = rounded(randn(2, nkv)), v = rounded(randn(3, nkv));
    const std::vector<float> dout = rounded(randn(4, nq));
    const cpu::GqaShape cs{s.B, s.T, s.NH, s.NKV, s.hs};
    std::vector<float> want(nq), cpu_out(nq), want_lse(nlse), want_dq(nq), want_dk(nkv), want_dv(nkv);
    cpu::gqa_attention_forward_reference(want.data(), q.data(), k.data(), v.data(), cs);
    std::vector<float> cpu_scratch(cpu::gqa_attention_scratch_floats());
    cpu::gqa_attention_forward(cpu_out.data(), want_lse.data(), q.data(), k.data(), v.data(), cpu_scratch.data(), cs);
    cpu::gqa_attention_backward_reference(want_dq.data(), want_dk.data(), want_dv.data(), dout.data(), q.data(),
                                          k.data(), v.data(), cs);
    const std::size_t qw = static_cast<std::size_t>(s.NH) * s.hs, kvw = static_cast<std::size_t>(s.NKV) * s.hs;
    const HostAttention a{q.data(), k.data(), v.data(), qw, kvw, qw, s.B, s.T, s.NH, s.NKV, s.hs};
    std::vector<float> out(nq), lse(nlse), dq(nq), dk(nkv), dv(nkv);
    tc_forward_on_host(a, out.data(), lse.data());
    expect_close_out(out, want);
    EXPECT_TRUE(near_all(lse, want_lse, 1e-5, 1e-6));
    tc_backward_on_host(a, dout.data(), out.data(), lse.data(), dq.data(), dk.data(), dv.data());
    const double floor =
        1e-2 * std::max({testing::max_abs(want_dq), testing::max_abs(want_dk), testing::max_abs(want_dv)});
    expect_close_grad(dq, want_dq, floor);
    expect_close_grad(dk, want_dk, floor);
    expect_close_grad(dv, want_dv, floor);
  }
}

TEST(TcAttentionOnHost, GptPackedQkvMatchesCpuReference) {
  for (const int T : {1, 17, 65, 130}) {
    const int B = 2, C = 128, NH = 2;
    SCOPED_TRACE("T " + std::to_string(T));
    const size_t n_qkv = static_cast<size_t>(B) * T * 3 * C, n_out = static_cast<size_t>(B) * T * C;
    const std::vector<float> qkv = rounded(randn(1, n_qkv)), dout = rounded(randn(2, n_out));
    std::vector<float> want(n_out), want_grad(n_qkv);
    model::kernels::attention_forward_reference(want.data(), qkv.data(), B, T, C, NH);
    model::kernels::attention_backward_reference(want_grad.data(), dout.data(), qkv.data(), B, T, C, NH);
    const std::size_t c = static_cast<std::size_t>(C);
    const HostAttention a{qkv.data(), qkv.data() + c, qkv.data() + 2 * c, 3 * c, 3 * c, c, B, T, NH, NH, C / NH};
    std::vector<float> out(n_out), lse(static_cast<size_t>(B) * NH * T), dqkv(n_qkv, NAN);
    tc_forward_on_host(a, out.data(), lse.data());
    expect_close_out(out, want);
    tc_backward_on_host(a, dout.data(), out.data(), lse.data(), dqkv.data(), dqkv.data() + c, dqkv.data() + 2 * c);
    const double floor = 1e-2 * testing::max_abs(want_grad);
    expect_close_grad(dqkv, want_grad, floor);  // every element written (NaN otherwise)
  }
}

// ---- host: sizes, alignment, path selection -------------------------------------------------

TEST(TcAttentionPath, ParsesZinfAttention) {
  EXPECT_EQ(parse_attention_path("tc"), AttentionPath::kTensorCore);
  EXPECT_EQ(parse_attention_path("gemm"), AttentionPath::kGemm);
  EXPECT_EQ(parse_attention_path("flash"), AttentionPath::kFlash);
  EXPECT_EQ(parse_attention_path("auto"), AttentionPath::kAuto);
  EXPECT_EQ(parse_attention_path(""), AttentionPath::kAuto);
  EXPECT_EQ(parse_attention_path("TC"), std::nullopt);
  EXPECT_EQ(parse_attention_path("cudnn"), std::nullopt);
  for (AttentionPath p :
       {AttentionPath::kAuto, AttentionPath::kTensorCore, AttentionPath::kGemm, AttentionPath::kFlash}) {
    EXPECT_EQ(parse_attention_path(attention_path_name(p)), p);
  }
}

TEST(TcAttentionPath, SelectsTensorCoresWhereSupported) {
  const Status ok = Status::ok();
  const Status no = Status::unsupported("hs 72");
  EXPECT_EQ(attention_path_for(AttentionPath::kAuto, ok), AttentionPath::kTensorCore);
  EXPECT_EQ(attention_path_for(AttentionPath::kAuto, no), AttentionPath::kGemm);
  EXPECT_EQ(attention_path_for(AttentionPath::kTensorCore, ok), AttentionPath::kTensorCore);
  EXPECT_EQ(attention_path_for(AttentionPath::kTensorCore, no), AttentionPath::kGemm);
  EXPECT_EQ(attention_path_for(AttentionPath::kGemm, ok), AttentionPath::kGemm);
  EXPECT_EQ(attention_path_for(AttentionPath::kFlash, ok), AttentionPath::kFlash);
  set_attention_path(AttentionPath::kFlash);
  EXPECT_EQ(requested_attention_path(), AttentionPath::kFlash);
  set_attention_path(std::nullopt);
}

// Checks made before the device is asked (no GPU needed).
TEST(TcAttentionPath, SupportsChecksSizesAndAlignment) {
  alignas(16) static bf16 buf[64];
  const GqaShape s{2, 17, 4, 2, 64};
  TcAttentionTensors a = tc_separate_qkv(buf, buf, buf, s);
  TcAttentionTensors bad = a;
  bad.NKV = 3;  // 4 % 3
  EXPECT_EQ(tc_attention_supports(bad).code(), ErrorCode::kInvalidArgument);
  bad = a;
  bad.T = 0;
  EXPECT_EQ(tc_attention_supports(bad).code(), ErrorCode::kInvalidArgument);
  for (int hs : {8, 72, 136, 256}) {
    bad = tc_separate_qkv(buf, buf, buf, GqaShape{2, 17, 4, 2, hs});
    const Status st = tc_attention_supports(bad);
    EXPECT_EQ(st.code(), ErrorCode::kUnsupported) << hs;
    EXPECT_NE(st.message().find("head size"), std::string::npos) << st.message();
  }
  bad = a;
  bad.k = buf + 1;  // 2 bytes off
  EXPECT_EQ(tc_attention_supports(bad).code(), ErrorCode::kUnsupported);
  EXPECT_EQ(tc_attention_supports(a, {buf + 4}).code(), ErrorCode::kUnsupported);  // 8 bytes off
  bad = tc_separate_qkv(buf, buf, buf, GqaShape{70000, 17, 1, 1, 64});
  EXPECT_EQ(tc_attention_supports(bad).code(), ErrorCode::kUnsupported);  // grid.y
  // GPT's packed qkv: q, k, v at columns 0, C, 2C of rows 3C apart.
  const TcAttentionTensors g = tc_packed_qkv(buf, 2, 5, 128, 2);
  EXPECT_EQ(g.k - g.q, 128);
  EXPECT_EQ(g.v - g.q, 256);
  EXPECT_EQ(g.q_ld, 384u);
  EXPECT_EQ(g.o_ld, 128u);
  EXPECT_EQ(g.hs, 64);
  EXPECT_EQ(g.NKV, 2);
}

// Without a device the tensor-core path is unsupported, so the calls fall back.
TEST(TcAttentionWithoutGpu, IsUnsupported) {
  ZINF_REQUIRE_NO_GPU();
  alignas(16) static bf16 buf[64];
  const Status st = tc_attention_supports(tc_separate_qkv(buf, buf, buf, GqaShape{1, 8, 2, 2, 64}));
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported) << st.to_string();
  EXPECT_EQ(attention_path_for(AttentionPath::kAuto, st), AttentionPath::kGemm);
}

}  // namespace
}  // namespace zinf::gpu
