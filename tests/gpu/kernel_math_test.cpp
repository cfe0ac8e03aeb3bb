// The GPU layer's host-side arithmetic, tested without a GPU: the bf16 rounding and GELU the
// kernels share with the host, the Adam element update against the CPU optimizer, launch
// geometry, the embedding buckets, and the row-major -> column-major mapping of the linear
// layers onto cuBLASLt products (evaluated here by a scalar reference of cuBLASLt's contract);
// the GEMM attention's row arithmetic against double precision, its scratch plan, and its
// whole forward and backward algebra (plan, products, row functions, head-major copies) on
// host memory against the CPU attention.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <algorithm>
#include <tuple>
#include <vector>

#include "gpu/adam.h"
#include "gpu/attention_math.h"
#include "gpu/attention_tiles.h"
#include "gpu/blas.h"
#include "gpu/gemm_attention.h"
#include "gpu/launch_geometry.h"
#include "gpu/numerics.h"
#include "kernel_test_util.h"
#include "model/kernels.h"
#include "model/llama_kernels.h"
#include "zinf/optim/half.h"
#include "zinf/optim/optimizer.h"

namespace zinf::gpu {
namespace {

using testing::from_bits;
using testing::near_all;
using testing::randn;
using testing::rounded;
using testing::to_bits;

// ---- shared numerics ---------------------------------------------------------------------------

TEST(GpuNumerics, Bf16RoundingIsTheCpuDefinition) {
  std::vector<float> specials = {0.0f, -0.0f, 1.0f, -1.5f, 3.0e38f, -3.4e38f, 1e-40f, -1e-45f,
                                 INFINITY, -INFINITY, NAN, 1.00390625f /* tie */, 1.01171875f /* tie, odd */};
  for (float f : specials) EXPECT_EQ(bf16_bits_rne(f), optim::f32_to_bf16_bits(f)) << f;
  uint64_t x = 12345;
  for (int i = 0; i < 200000; i++) {
    x = model::detail::splitmix64(x);
    const uint32_t bits = static_cast<uint32_t>(x);
    float f;
    std::memcpy(&f, &bits, sizeof f);
    ASSERT_EQ(bf16_bits_rne(f), optim::f32_to_bf16_bits(f)) << std::hex << bits;
    const uint16_t h = static_cast<uint16_t>(x >> 32);
    const float back = f32_from_bf16_bits(h);
    const float want = optim::bf16_bits_to_f32(h);
    ASSERT_EQ(std::memcmp(&back, &want, sizeof back), 0) << std::hex << h;
  }
}

// The formulas the GPU GELU kernels run are the CPU kernel's, bit for bit on the host (the
// device's expf may differ from glibc's in the last bit; the GPU tests allow for that).
TEST(GpuNumerics, GeluIsTheCpuKernelsFormula) {
  const float big[] = {20.0f, -20.0f, 100.0f, -100.0f, 1e10f, -1e10f};
  std::vector<float> x(8001 + std::size(big));
  for (size_t i = 0; i < 8001; i++) x[i] = static_cast<float>(static_cast<int>(i) - 4000) * 0.0025f;
  for (size_t i = 0; i < std::size(big); i++) x[8001 + i] = big[i];
  std::vector<float> fwd(x.size()), bwd(x.size()), ones(x.size(), 1.0f);
  model::kernels::gelu_forward(fwd.data(), x.data(), x.size());
  model::kernels::gelu_backward(bwd.data(), x.data(), ones.data(), x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const float f = gelu_tanh(x[i]);
    const float g = gelu_tanh_grad(x[i]);
    ASSERT_EQ(std::memcmp(&f, &fwd[i], sizeof f), 0) << x[i] << ": " << f << " vs " << fwd[i];
    ASSERT_EQ(std::memcmp(&g, &bwd[i], sizeof g), 0) << x[i] << ": " << g << " vs " << bwd[i];
  }
}

// ---- Adam --------------------------------------------------------------------------------------

struct AdamCase {
  optim::DType grad;
  optim::DType copy;  // kF32: no copy
  double weight_decay;
  bool adam_w;
};

std::vector<uint16_t> half_bits(const std::vector<float>& x, optim::DType t) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); i++) {
    h[i] = t == optim::DType::kBF16 ? optim::f32_to_bf16_bits(x[i]) : optim::f32_to_f16_bits(x[i]);
  }
  return h;
}

// The per-element code the GPU kernel runs gives the CPU optimizer's bits (scalar ISA, which
// every CPU path equals), for every gradient dtype, copy dtype and decay mode.
TEST(GpuAdam, ElementCodeMatchesCpuOptimizerBitForBit) {
  const size_t n = 1003;
  std::vector<AdamCase> cases;
  for (optim::DType g : {optim::DType::kF32, optim::DType::kBF16, optim::DType::kF16}) {
    for (optim::DType c : {optim::DType::kF32, optim::DType::kBF16, optim::DType::kF16}) {
      cases.push_back({g, c, 0.0, true});
      cases.push_back({g, c, 0.01, true});
      cases.push_back({g, c, 0.01, false});
    }
  }
  for (const AdamCase& k : cases) {
    SCOPED_TRACE(std::string(optim::dtype_name(k.grad)) + " grad, copy " + std::string(optim::dtype_name(k.copy)) +
                 ", wd " + std::to_string(k.weight_decay) + (k.adam_w ? " adamw" : " l2"));
    optim::AdamParams hp;
    hp.lr = 3e-3;
    hp.weight_decay = k.weight_decay;
    hp.adam_w_mode = k.adam_w;
    std::vector<float> p0 = randn(1, n), m0 = randn(2, n, 0.1), v0 = randn(3, n, 0.01), g32 = randn(4, n, 5.0);
    for (float& v : v0) v = std::fabs(v);
    g32[7] = 0.0f;
    g32[8] = 1e-30f;
    std::vector<uint16_t> g16 = k.grad == optim::DType::kF32 ? std::vector<uint16_t>{} : half_bits(g32, k.grad);
    const void* grad = k.grad == optim::DType::kF32 ? static_cast<const void*>(g32.data()) : g16.data();
    const double scale = 1.0 / 1024.0;
    for (int64_t step : {1, 2, 50}) {
      std::vector<float> pc = p0, mc = m0, vc = v0, pg = p0, mg = m0, vg = v0;
      std::vector<uint16_t> copy_c(n, 0), copy_g(n, 0);
      const bool with_copy = k.copy != optim::DType::kF32;
      optim::ExecOptions exec;
      exec.isa = optim::KernelIsa::kScalar;
      optim::HalfCopy hc;
      if (with_copy) hc = optim::HalfCopy{copy_c.data(), k.copy};
      ASSERT_TRUE(optim::adam_step(hp, step, pc, mc, vc, optim::GradView{grad, k.grad, n, scale}, hc, exec).is_ok());
      AdamArrays a{pg.data(), mg.data(), vg.data(), grad, k.grad, with_copy ? copy_g.data() : nullptr, k.copy, n};
      ASSERT_TRUE(adam_step_on_host(hp, step, scale, a).is_ok());
      ASSERT_EQ(std::memcmp(pc.data(), pg.data(), 4 * n), 0) << "params, step " << step;
      ASSERT_EQ(std::memcmp(mc.data(), mg.data(), 4 * n), 0) << "exp_avg, step " << step;
      ASSERT_EQ(std::memcmp(vc.data(), vg.data(), 4 * n), 0) << "exp_avg_sq, step " << step;
      ASSERT_EQ(copy_c, copy_g) << "copy, step " << step;
    }
  }
}

TEST(GpuAdam, ChecksArgumentsAsTheCpuOptimizer) {
  std::vector<float> p(8), m(8), v(8), g(8);
  AdamArrays a{p.data(), m.data(), v.data(), g.data(), optim::DType::kF32, nullptr, optim::DType::kBF16, 8};
  optim::AdamParams hp;
  EXPECT_EQ(check_adam_step(hp, 0, 1.0, a).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(check_adam_step(hp, 1, 0.0, a).code(), ErrorCode::kInvalidArgument);
  AdamArrays overlap = a;
  overlap.exp_avg = p.data() + 4;
  const Status st = check_adam_step(hp, 1, 1.0, overlap);
  EXPECT_NE(st.message().find("overlap"), std::string::npos) << st.message();
  AdamArrays f32_copy = a;
  f32_copy.copy = m.data();
  f32_copy.copy_dtype = optim::DType::kF32;
  EXPECT_EQ(check_adam_step(hp, 1, 1.0, f32_copy).code(), ErrorCode::kInvalidArgument);
  hp.beta1 = 1.0;
  EXPECT_EQ(check_adam_step(hp, 1, 1.0, a).code(), ErrorCode::kInvalidArgument);
}

// ---- geometry ----------------------------------------------------------------------------------

TEST(GpuGeometry, ElementwiseGridsAndColumnChunks) {
  EXPECT_EQ(grid_for(0, 256), 0u);
  EXPECT_EQ(grid_for(1, 256), 1u);
  EXPECT_EQ(grid_for(256, 256), 1u);
  EXPECT_EQ(grid_for(257, 256), 2u);
  EXPECT_EQ(grid_for(size_t{1} << 40, 256), kMaxBlocks);  // the grid-stride loops cover the rest
  EXPECT_EQ(column_chunks(1), 1);
  EXPECT_EQ(column_chunks(kColumnChunkRows), 1);
  EXPECT_EQ(column_chunks(kColumnChunkRows + 1), 2);
  EXPECT_EQ(column_sum_scratch_floats(65, 10), 20u);
  EXPECT_EQ(layernorm_backward_scratch_floats(65, 10), 40u);
  EXPECT_TRUE(check_column_sum_shape(8192, 3072, "x").is_ok());
  EXPECT_EQ(check_column_sum_shape(kColumnChunkRows * kMaxColumnChunks + 1, 8, "x").code(), ErrorCode::kUnsupported);
  EXPECT_EQ(logits_ld(50257), 50304);
  EXPECT_EQ(logits_ld(256), 256);
  EXPECT_EQ(logits_ld(1), 64);
  EXPECT_EQ(head_weight_pad_elems(50257, 768), 50304u * 768u);
  EXPECT_EQ(head_weight_pad_elems(256, 768), 0u);
}

TEST(GpuGeometry, AttentionTilesAndSharedMemory) {
  Result<AttentionGeometry> g = attention_geometry(8, 1024, 768, 12);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_EQ(g->hs, 64);
  EXPECT_EQ(g->per_lane, 2);
  EXPECT_EQ(g->q_tiles, 1024u / kAttnQTile);
  EXPECT_EQ(g->k_tiles, 1024u / kAttnKTile);
  EXPECT_EQ(g->heads, 96u);
  EXPECT_EQ(g->forward_smem, 4u * (16 * 64 + 32 * 65 + 32 * 64));
  EXPECT_EQ(g->dq_smem, 4u * (2 * 16 * 64 + 2 * 32 * 65));
  EXPECT_EQ(g->dkv_smem, 4u * (2 * 32 * 65 + 2 * 32 * 64 + 64));
  // Every GPT preset's head size runs; 2.7b has hs 80 (3 per lane), tiny 16 (1).
  for (auto [C, NH, per_lane] : {std::tuple{64, 4, 1}, std::tuple{2560, 32, 3}, std::tuple{5120, 40, 4}}) {
    Result<AttentionGeometry> p = attention_geometry(1, 37, C, NH);
    ASSERT_TRUE(p.is_ok()) << C << "/" << NH;
    EXPECT_EQ(p->per_lane, per_lane);
    EXPECT_EQ(p->q_tiles, 3u);  // ceil(37 / 16)
    EXPECT_EQ(p->k_tiles, 2u);  // ceil(37 / 32)
    EXPECT_LE(p->dkv_smem, 99u * 1024) << "more shared memory than an sm_86 block can have";
  }
  EXPECT_EQ(attention_geometry(1, 8, 256, 1).status().code(), ErrorCode::kUnsupported);  // hs 256
  EXPECT_EQ(attention_geometry(1, 8, 100, 3).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(attention_geometry(70000, 8, 64, 1).status().code(), ErrorCode::kUnsupported);
  EXPECT_EQ(attention_backward_scratch_floats(2, 5, 3), 30u);
}

// Walks the flash attention kernels' loops (attention_tiles.h) as their blocks, warps and lanes
// do: the forward and dQ visit every causal pair (key <= row < T) exactly once, dK/dV too; the
// lanes a loop reads are exactly those whose pair is visible; every output row (forward, dQ)
// and key (dK, dV) is written by exactly one warp.
TEST(GpuGeometry, AttentionLoopsVisitEveryCausalPairOnce) {
  for (int T : {1, 2, 15, 16, 17, 31, 32, 33, 37, 64, 100, 257}) {
    SCOPED_TRACE(T);
    Result<AttentionGeometry> g = attention_geometry(1, T, 64, 1);
    ASSERT_TRUE(g.is_ok());
    const size_t TT = static_cast<size_t>(T) * T;
    std::vector<int> by_row(TT, 0), by_key(TT, 0), rows_written(T, 0), keys_written(T, 0);
    for (unsigned bx = 0; bx < g->q_tiles; bx++) {
      const int q0 = static_cast<int>(bx) * kAttnQTile;
      for (int warp = 0; warp < kAttnWarps; warp++) {
        for (int rr = 0; rr < kAttnRowsPerWarp; rr++) {
          const int row = attn::query_row(q0, warp, rr);
          if (row < T) rows_written[row]++;
        }
      }
      for (int k0 = 0; k0 <= attn::last_row(q0, T); k0 += kAttnKTile) {
        for (int warp = 0; warp < kAttnWarps; warp++) {
          for (int rr = 0; rr < kAttnRowsPerWarp; rr++) {
            const int row = attn::query_row(q0, warp, rr);
            if (!attn::row_active(row, k0, T)) continue;
            const int n = attn::keys_seen(row, k0);
            for (int lane = 0; lane < 32; lane++) ASSERT_EQ(k0 + lane <= row, lane < n) << row << " " << k0;
            for (int j = 0; j < n; j++) {
              ASSERT_LT(k0 + j, T);
              by_row[static_cast<size_t>(row) * T + k0 + j]++;
            }
          }
        }
      }
    }
    for (unsigned bx = 0; bx < g->k_tiles; bx++) {
      const int key0 = static_cast<int>(bx) * kAttnKTile;
      for (int warp = 0; warp < kAttnWarps; warp++) {
        for (int kk = 0; kk < kAttnKeysPerWarp; kk++) {
          const int key = attn::dkv_key(key0, warp, kk);
          if (key < T) keys_written[key]++;
        }
      }
      for (int q0 = key0; q0 < T; q0 += kAttnKTile) {
        const int rows_here = attn::dkv_rows_here(q0, T);
        for (int warp = 0; warp < kAttnWarps; warp++) {
          for (int kk = 0; kk < kAttnKeysPerWarp; kk++) {
            const int key = attn::dkv_key(key0, warp, kk);
            if (key >= T) continue;
            const int first = attn::dkv_first_row(key, q0);
            for (int lane = 0; lane < 32; lane++) {
              const bool visible = q0 + lane < T && key <= q0 + lane;  // p != 0 in the kernel
              ASSERT_EQ(visible, lane >= first && lane < rows_here) << key << " " << q0;
            }
            for (int j = first; j < rows_here; j++) by_key[static_cast<size_t>(q0 + j) * T + key]++;
          }
        }
      }
    }
    for (int row = 0; row < T; row++) {
      ASSERT_EQ(rows_written[row], 1) << row;
      ASSERT_EQ(keys_written[row], 1) << row;
      for (int key = 0; key < T; key++) {
        const int want = key <= row ? 1 : 0;
        ASSERT_EQ(by_row[static_cast<size_t>(row) * T + key], want) << row << " " << key;
        ASSERT_EQ(by_key[static_cast<size_t>(row) * T + key], want) << row << " " << key;
      }
    }
  }
}

TEST(GpuGeometry, AlignmentOfAddresses) {
  alignas(256) static char buf[1024];
  EXPECT_EQ(alignment_of(buf), 256u);
  EXPECT_EQ(alignment_of(buf + 2), 2u);
  EXPECT_EQ(alignment_of(buf + 48), 16u);
  EXPECT_EQ(alignment_of(buf + 512), 256u);
  EXPECT_EQ(alignment_of(nullptr), 256u);
}

TEST(GpuGeometry, EmbeddingBucketsGroupPositionsByToken) {
  const std::vector<int32_t> ids = {5, 2, 5, 0, 2, 5};
  Result<EmbeddingBuckets> b = make_embedding_buckets(ids, 8);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->tokens, (std::vector<int32_t>{0, 2, 5}));
  EXPECT_EQ(b->starts, (std::vector<int32_t>{0, 1, 3, 6}));
  EXPECT_EQ(b->positions, (std::vector<int32_t>{3, 1, 4, 0, 2, 5}));
  Result<EmbeddingBuckets> empty = make_embedding_buckets({}, 8);
  ASSERT_TRUE(empty.is_ok());
  EXPECT_TRUE(empty->tokens.empty());
  EXPECT_EQ(empty->starts, std::vector<int32_t>{0});
  const std::vector<int32_t> bad = {1, 8};
  const Status st = make_embedding_buckets(bad, 8).status();
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("position 1"), std::string::npos) << st.message();
}

// ---- the linear layers as cuBLASLt products ----------------------------------------------------

float bf(const bf16* p, size_t i) {
  uint16_t h;
  std::memcpy(&h, static_cast<const void*>(p + i), 2);
  return optim::bf16_bits_to_f32(h);
}
void set_bf(bf16* p, size_t i, float v) {
  const uint16_t h = optim::f32_to_bf16_bits(v);
  std::memcpy(static_cast<void*>(p + i), &h, 2);
}

// cuBLASLt's contract for one Gemm (blas.h), evaluated on host memory in double: what the GPU
// product must compute, independent of how blas.cpp maps rows and columns.
void reference_gemm(const Gemm& g) {
  if (g.batch > 1) {  // each product of the batch on its own offsets
    const size_t dsz = g.d_type == GemmOutput::kF32 ? 4 : 2;
    for (int i = 0; i < g.batch; i++) {
      Gemm one = g;
      one.batch = 1;
      one.a = g.a + i * g.stride_a;
      one.b = g.b + i * g.stride_b;
      one.d = static_cast<char*>(g.d) + static_cast<size_t>(i * g.stride_d) * dsz;
      if (g.c != nullptr) one.c = static_cast<const char*>(g.c) + static_cast<size_t>(i * g.stride_c) * dsz;
      reference_gemm(one);
    }
    return;
  }
  auto a = [&](int i, int p) {  // op(A)(i, p)
    return bf(g.a, g.trans_a ? static_cast<size_t>(p) + static_cast<size_t>(i) * g.lda
                             : static_cast<size_t>(i) + static_cast<size_t>(p) * g.lda);
  };
  auto b = [&](int p, int j) {  // op(B)(p, j)
    return bf(g.b, g.trans_b ? static_cast<size_t>(j) + static_cast<size_t>(p) * g.ldb
                             : static_cast<size_t>(p) + static_cast<size_t>(j) * g.ldb);
  };
  const bool f32 = g.d_type == GemmOutput::kF32;
  for (int j = 0; j < g.n; j++) {
    for (int i = 0; i < g.m; i++) {
      double acc = 0.0;
      for (int p = 0; p < g.k; p++) acc += static_cast<double>(a(i, p)) * b(p, j);
      double v = g.alpha * acc;
      if (g.c != nullptr) {
        const size_t ci = static_cast<size_t>(i) + static_cast<size_t>(j) * g.ldc;
        v += g.beta * (f32 ? static_cast<const float*>(g.c)[ci] : bf(static_cast<const bf16*>(g.c), ci));
      }
      const size_t ai = static_cast<size_t>(i) + static_cast<size_t>(j) * g.ld_aux;
      switch (g.epilogue) {
        case GemmEpilogue::kNone: break;
        case GemmEpilogue::kBias: v += bf(g.bias, i); break;
        case GemmEpilogue::kGeluAuxBias:
          v += bf(g.bias, i);
          set_bf(g.aux, ai, static_cast<float>(v));
          v = gelu_tanh(static_cast<float>(v));
          break;
        case GemmEpilogue::kDGelu: v *= gelu_tanh_grad(bf(g.aux, ai)); break;
      }
      const size_t di = static_cast<size_t>(i) + static_cast<size_t>(j) * g.ldd;
      if (f32) {
        static_cast<float*>(g.d)[di] = static_cast<float>(v);
      } else {
        set_bf(static_cast<bf16*>(g.d), di, static_cast<float>(v));
      }
    }
  }
}

bf16* as_bf(std::vector<uint16_t>& v) { return reinterpret_cast<bf16*>(v.data()); }

// Tolerance: the product's one bf16 rounding (2^-8 relative covers it) plus fp32-vs-double
// accumulation differences (1e-5 of the largest value).
constexpr double kBf16Rel = 1.0 / 256;

TEST(GpuLinear, ForwardIsTheCpuMatmulWithBiasAndResidual) {
  const int N = 7, C = 24, OC = 40, ld = 48;  // rows of out padded to 48, as the logits are
  const std::vector<float> inp = rounded(randn(1, N * C)), w = rounded(randn(2, OC * C)), bias = rounded(randn(3, OC));
  const std::vector<float> res = rounded(randn(4, N * ld));
  std::vector<uint16_t> inp_b = to_bits(inp), w_b = to_bits(w), bias_b = to_bits(bias), res_b = to_bits(res);
  for (bool with_bias : {false, true}) {
    for (bool with_res : {false, true}) {
      SCOPED_TRACE(std::string(with_bias ? "bias" : "no bias") + (with_res ? ", residual" : ""));
      std::vector<uint16_t> out_b(static_cast<size_t>(N) * ld, 0x7FC0);  // NaN in the padding must stay
      const Gemm g = linear_forward_gemm(LinearShape{N, C, OC, ld}, as_bf(out_b), as_bf(inp_b), as_bf(w_b),
                                         with_bias ? as_bf(bias_b) : nullptr, with_res ? as_bf(res_b) : nullptr);
      ASSERT_TRUE(check_gemm(g).is_ok()) << check_gemm(g).to_string();
      reference_gemm(g);
      std::vector<float> want(static_cast<size_t>(N) * OC);
      model::kernels::matmul_forward(want.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, N, C, OC);
      std::vector<float> got(static_cast<size_t>(N) * OC);
      for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
          got[n * OC + o] = bf(as_bf(out_b), static_cast<size_t>(n) * ld + o);
          if (with_res) want[n * OC + o] += res[static_cast<size_t>(n) * ld + o];
        }
        for (int o = OC; o < ld; o++) ASSERT_EQ(out_b[static_cast<size_t>(n) * ld + o], 0x7FC0) << "padding written";
      }
      EXPECT_TRUE(near_all(got, want, kBf16Rel, 1e-5));
    }
  }
}

TEST(GpuLinear, ForwardGeluWritesPreActivationAndGelu) {
  const int N = 5, C = 16, OC = 32;
  const std::vector<float> inp = rounded(randn(1, N * C)), w = rounded(randn(2, OC * C, 0.3)), bias = rounded(randn(3, OC));
  std::vector<uint16_t> inp_b = to_bits(inp), w_b = to_bits(w), bias_b = to_bits(bias);
  std::vector<uint16_t> out_b(N * OC), pre_b(N * OC);
  const Gemm g = linear_forward_gelu_gemm(LinearShape{N, C, OC}, as_bf(out_b), as_bf(pre_b), as_bf(inp_b), as_bf(w_b),
                                          as_bf(bias_b));
  ASSERT_TRUE(check_gemm(g).is_ok()) << check_gemm(g).to_string();
  reference_gemm(g);
  std::vector<float> pre(N * OC), act(N * OC);
  model::kernels::matmul_forward(pre.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  model::kernels::gelu_forward(act.data(), pre.data(), pre.size());
  EXPECT_TRUE(near_all(from_bits(pre_b), pre, kBf16Rel, 1e-5));
  EXPECT_TRUE(near_all(from_bits(out_b), act, kBf16Rel, 1e-5));
}

TEST(GpuLinear, BackwardIsTheCpuMatmulBackward) {
  const int N = 9, C = 24, OC = 40, ld = 48;
  const std::vector<float> inp = rounded(randn(1, N * C)), w = rounded(randn(2, OC * C));
  std::vector<float> dout_padded = rounded(randn(3, N * ld));
  std::vector<float> dout(N * OC);
  for (int n = 0; n < N; n++) {
    for (int o = 0; o < OC; o++) dout[n * OC + o] = dout_padded[static_cast<size_t>(n) * ld + o];
  }
  std::vector<uint16_t> inp_b = to_bits(inp), w_b = to_bits(w), dout_b = to_bits(dout_padded);
  const LinearShape s{N, C, OC, ld};

  std::vector<uint16_t> dinp_b(N * C);
  const Gemm gi = linear_backward_input_gemm(s, as_bf(dinp_b), as_bf(dout_b), as_bf(w_b), nullptr);
  ASSERT_TRUE(check_gemm(gi).is_ok()) << check_gemm(gi).to_string();
  reference_gemm(gi);
  std::vector<float> dw0 = randn(5, OC * C), dw = dw0;  // accumulated onto earlier values
  const Gemm gw = linear_backward_weight_gemm(s, dw.data(), as_bf(dout_b), as_bf(inp_b));
  ASSERT_TRUE(check_gemm(gw).is_ok()) << check_gemm(gw).to_string();
  reference_gemm(gw);

  std::vector<float> want_dinp(N * C), want_dw = dw0;
  model::kernels::matmul_backward(want_dinp.data(), want_dw.data(), nullptr, dout.data(), inp.data(), w.data(), N, C, OC);
  EXPECT_TRUE(near_all(from_bits(dinp_b), want_dinp, kBf16Rel, 1e-5));
  EXPECT_TRUE(near_all(dw, want_dw, 1e-6, 1e-6));  // fp32 out: only the sums' order differs

  // With DGELU: dinp = (dout @ weight) * gelu'(pre).
  const std::vector<float> pre = rounded(randn(6, N * C));
  std::vector<uint16_t> pre_b = to_bits(pre), dg_b(N * C);
  const Gemm gd = linear_backward_input_gemm(s, as_bf(dg_b), as_bf(dout_b), as_bf(w_b), as_bf(pre_b));
  ASSERT_TRUE(check_gemm(gd).is_ok()) << check_gemm(gd).to_string();
  reference_gemm(gd);
  std::vector<float> want_dg(N * C);
  model::kernels::gelu_backward(want_dg.data(), pre.data(), want_dinp.data(), want_dg.size());
  EXPECT_TRUE(near_all(from_bits(dg_b), want_dg, kBf16Rel, 1e-5));
}

TEST(GpuLinear, CheckGemmNamesTheShapeAndTheRule) {
  std::vector<uint16_t> x(64 * 64);
  Gemm g = linear_forward_gemm(LinearShape{4, 8, 16}, as_bf(x), as_bf(x), as_bf(x), nullptr, nullptr);
  g.what = "h.3.mlp.c_fc";
  ASSERT_TRUE(check_gemm(g).is_ok());
  Gemm bad = g;
  bad.lda = 4;
  Status st = check_gemm(bad);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("h.3.mlp.c_fc"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("16x4"), std::string::npos) << st.message();  // D (m x n)
  EXPECT_NE(st.message().find("lda"), std::string::npos) << st.message();
  bad = g;
  bad.beta = 1.0f;
  EXPECT_NE(check_gemm(bad).message().find("no C"), std::string::npos);
  bad = linear_forward_gelu_gemm(LinearShape{4, 8, 12}, as_bf(x), as_bf(x), as_bf(x), as_bf(x), as_bf(x));
  EXPECT_NE(check_gemm(bad).message().find("multiple of 8"), std::string::npos) << check_gemm(bad).message();
  bad = linear_forward_gelu_gemm(LinearShape{4, 8, 16}, as_bf(x), as_bf(x), as_bf(x), as_bf(x), nullptr);
  EXPECT_NE(check_gemm(bad).message().find("bias"), std::string::npos);
  bad = g;
  bad.m = 0;
  EXPECT_EQ(check_gemm(bad).code(), ErrorCode::kInvalidArgument);
}

// ---- GEMM attention: row arithmetic, plan, and the whole algebra on the host ------------------

// One row's softmax (p over T keys, lse) against double precision; fails naming the first bad
// value. Masked keys must be exactly 0.
::testing::AssertionResult softmax_row_matches(const std::vector<float>& s, int pos, float scale,
                                               const std::vector<float>& p, float lse) {
  const int T = static_cast<int>(s.size());
  double mx = -INFINITY;
  for (int j = 0; j <= pos; j++) mx = std::max(mx, static_cast<double>(s[j]) * scale);
  double sum = 0.0;
  for (int j = 0; j <= pos; j++) sum += std::exp(static_cast<double>(s[j]) * scale - mx);
  const double want_lse = mx + std::log(sum);
  if (std::fabs(lse - want_lse) > 1e-5 * (1.0 + std::fabs(want_lse))) {
    return ::testing::AssertionFailure() << "pos " << pos << ": lse " << lse << ", want " << want_lse;
  }
  for (int j = 0; j < T; j++) {
    const double want = j <= pos ? std::exp(static_cast<double>(s[j]) * scale - want_lse) : 0.0;
    if (std::fabs(p[j] - want) > 1e-5 * want + 1e-7 || (j > pos && p[j] != 0.0f)) {
      return ::testing::AssertionFailure() << "pos " << pos << " key " << j << ": p " << p[j] << ", want " << want;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(GpuAttentionMath, SoftmaxRowAndScoreGradientMatchDouble) {
  const int T = 70;  // more than two warps' strides: lanes hold 2 or 3 keys, some none
  const float scale = 0.125f;
  std::vector<float> s = randn(11, T, 4.0);
  const std::vector<float> dp = randn(12, T);
  for (int j = 40; j < T; j++) s[j] += 60.0f;  // keys above the diagonal of the rows below would dominate
  for (int pos : {0, 1, 5, 31, 32, 33, 39, 40, 69}) {
    SCOPED_TRACE("pos " + std::to_string(pos));
    std::vector<float> p(T);
    const float lse = attn::softmax_row_on_host(s.data(), T, pos, scale, p.data());
    EXPECT_TRUE(softmax_row_matches(s, pos, scale, p, lse));
    // The backward's recomputation gives the forward's P, and dS = P * (dP - D).
    const float d = 0.3f;
    std::vector<float> p2(T), ds(T);
    attn::score_grad_row_on_host(s.data(), dp.data(), T, pos, scale, lse, d, p2.data(), ds.data());
    EXPECT_EQ(p2, p);
    for (int j = 0; j < T; j++) {
      const double want = j <= pos ? static_cast<double>(p[j]) * (static_cast<double>(dp[j]) - d) : 0.0;
      EXPECT_NEAR(ds[j], want, 1e-6 * std::fabs(want) + 1e-9) << "key " << j;
    }
  }
  // The check catches a mask off by one either way (what key_visible or stacked_position
  // getting it wrong would do): a row computed for pos +- 1 is not pos's row.
  for (int pos : {5, 39, 40}) {
    std::vector<float> p(T);
    float lse = attn::softmax_row_on_host(s.data(), T, pos + 1, scale, p.data());
    EXPECT_FALSE(softmax_row_matches(s, pos, scale, p, lse)) << "pos + 1 passed for " << pos;
    lse = attn::softmax_row_on_host(s.data(), T, pos - 1, scale, p.data());
    EXPECT_FALSE(softmax_row_matches(s, pos, scale, p, lse)) << "pos - 1 passed for " << pos;
  }
  // Statistics merge symmetrically (both butterfly partners hold the same bits), empty sets too.
  attn::SoftmaxStats a = attn::stats_add(attn::stats_add(attn::stats_empty(), 1.5f), -2.0f);
  attn::SoftmaxStats b = attn::stats_add(attn::stats_empty(), 3.0f);
  const attn::SoftmaxStats ab = attn::stats_merge(a, b), ba = attn::stats_merge(b, a);
  EXPECT_EQ(ab.m, ba.m);
  EXPECT_EQ(ab.l, ba.l);
  EXPECT_NEAR(attn::stats_lse(ab), std::log(std::exp(1.5) + std::exp(-2.0) + std::exp(3.0)), 1e-6);
  const attn::SoftmaxStats ae = attn::stats_merge(a, attn::stats_empty());
  EXPECT_EQ(ae.m, a.m);
  EXPECT_EQ(ae.l, a.l);
  EXPECT_EQ(attn::stats_merge(attn::stats_empty(), attn::stats_empty()).l, 0.0f);
  // Block rows: 2 heads per unit, block [4, 8) of T = 10 (8 rows per group), G = 4, from group 3,
  // unit 1 (heads 2, 3): launch row 13 is group 4's row 5 = position 4 + 5 / 2 = 6, head 2 + 1;
  // its lse row ((4 * 4) + 3) * 10 + 6.
  EXPECT_EQ(attn::block_position(13, 8, 2, 4), 6);
  EXPECT_EQ(attn::block_global_row(13, 8, 2, 4, 10, 4, 3, 2), 196);
}

TEST(GpuGeometry, GemmAttentionPlan) {
  // GPT-2 124M, B = 8, T = 1024 with the nets' scratch: blocks of 256 positions, all 96 heads in
  // one call per block and product.
  const std::size_t gpt2 = gemm_attention_scratch_bytes(8 * 1024, 1024, 12, 12, 64);
  Result<GemmAttentionPlan> p = gemm_attention_plan(8, 1024, 12, 12, 64, gpt2);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(p->time_block, 256);
  EXPECT_EQ(p->time_blocks, 4);
  EXPECT_EQ(p->heads_per_unit, 1);
  EXPECT_EQ(p->units_per_group, 1);
  EXPECT_EQ(p->chunk, 96);
  EXPECT_EQ(p->calls, 1);
  EXPECT_LE(p->bytes, gpt2);
  EXPECT_LE(gpt2 - p->s_off, kGemmAttnMaxScoreBytes);
  EXPECT_EQ(p->ld_hs, 64);
  EXPECT_EQ(p->ld_t, 1024);
  // Regions in order, 256-aligned, not overlapping.
  const std::size_t offs[] = {p->d_off, p->q_off, p->o_off, p->dq_off, p->k_off, p->v_off, p->dk_off,
                              p->dv_off, p->s_off, p->dp_off, p->p_off, p->ds_off, p->bytes};
  for (size_t i = 0; i + 1 < std::size(offs); i++) {
    EXPECT_EQ(offs[i] % 256, 0u) << i;
    EXPECT_LT(offs[i], offs[i + 1]) << i;
  }
  EXPECT_EQ(p->dp_off - p->s_off, static_cast<std::size_t>(96) * 256 * 1024 * 4);
  // Any smaller pass fits the same scratch in one call per block and product.
  for (auto [B, T] : {std::pair{1, 1}, std::pair{3, 333}, std::pair{8, 1000}, std::pair{16, 512}, std::pair{64, 7},
                      std::pair{32, 255}, std::pair{31, 257}}) {
    Result<GemmAttentionPlan> q = gemm_attention_plan(B, T, 12, 12, 64, gpt2);
    ASSERT_TRUE(q.is_ok());
    EXPECT_EQ(q->heads_per_unit, 1) << B << " x " << T;
    EXPECT_EQ(q->time_block, std::min(T, 256)) << B << " x " << T;
    EXPECT_EQ(q->calls, 1) << B << " x " << T;
    EXPECT_LE(q->bytes, gpt2) << B << " x " << T;
  }
  // Small shapes: everything in one call; hs and T padded to 8.
  const std::size_t small = gemm_attention_scratch_bytes(2 * 37, 37, 6, 2, 20);
  p = gemm_attention_plan(2, 37, 6, 2, 20, small);
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(p->G, 3);
  EXPECT_EQ(p->heads_per_unit, 3);
  EXPECT_EQ(p->time_block, 37);
  EXPECT_EQ(p->chunk, 4);
  EXPECT_EQ(p->calls, 1);
  EXPECT_EQ(p->ld_hs, 24);
  EXPECT_EQ(p->ld_t, 40);
  // Room for 8 rows of scores: blocks of 8 positions of one head, one group per call.
  const std::size_t rows8 = p->s_off + 2 * 8 * 40 * 4 + 2 * 8 * 40 * 2 + 4 * 256;
  p = gemm_attention_plan(2, 37, 6, 2, 20, rows8);
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(p->time_block, 5);  // 37 halved (rounding up) until 8 rows fit
  EXPECT_EQ(p->time_blocks, 8);
  EXPECT_EQ(p->heads_per_unit, 1);
  EXPECT_EQ(p->units_per_group, 3);
  EXPECT_EQ(p->chunk, 1);
  EXPECT_EQ(p->calls, 4);
  // Less than one row: the flash fallback (D only).
  p = gemm_attention_plan(2, 37, 6, 2, 20, p->s_off + 100);
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(p->heads_per_unit, 0);
  EXPECT_EQ(p->bytes, static_cast<std::size_t>(2 * 6 * 37 * 4));
  // Long sequences stay on the GEMM path: T = 32768, Llama-3 8B's heads.
  const std::size_t long_t = gemm_attention_scratch_bytes(32768, 32768, 32, 8, 128);
  p = gemm_attention_plan(1, 32768, 32, 8, 128, long_t);
  ASSERT_TRUE(p.is_ok());
  EXPECT_GE(p->heads_per_unit, 1);
  EXPECT_LE(long_t - p->s_off, kGemmAttnMaxScoreBytes);
  EXPECT_EQ(gemm_attention_plan(1, 8, 6, 4, 64, 1 << 20).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(gemm_attention_scratch_bytes(0, 8, 4, 4, 64), 0u);
}

// gemm_attention.cu's loops on the host: the same plan, the same Gemm descriptions evaluated by
// reference_gemm (cuBLASLt's contract in double, each output rounded once as the GPU's), the
// same row functions, bf16 P and dS. What the GPU run adds is only cuBLASLt's accumulation order.
struct HostGemmAttention {
  GemmAttentionPlan p;
  std::vector<unsigned char> mem;
  unsigned char* base;
  std::size_t q_ld, kv_ld, o_ld;

  HostGemmAttention(const GemmAttentionPlan& plan, std::size_t q_ld_, std::size_t kv_ld_, std::size_t o_ld_)
      : p(plan), mem(plan.bytes + 256), q_ld(q_ld_), kv_ld(kv_ld_), o_ld(o_ld_) {
    base = mem.data() + (256 - reinterpret_cast<std::uintptr_t>(mem.data()) % 256) % 256;
  }
  template <typename T>
  T* at(std::size_t off) {
    return reinterpret_cast<T*>(base + off);
  }
  // Head-major row of (b, h, t): heads in units of hpu, a unit's rows ordered (t, head).
  size_t hm_row(int b, int h, int t, int H, int hpu) const {
    return (static_cast<size_t>(b) * H + h - h % hpu) * p.T + static_cast<size_t>(t) * hpu + h % hpu;
  }
  void gather(bf16* dst, const bf16* src, std::size_t src_ld, int H, int hpu) {
    for (int b = 0; b < p.B; b++)
      for (int h = 0; h < H; h++)
        for (int t = 0; t < p.T; t++)
          for (int d = 0; d < p.hs; d++)
            dst[hm_row(b, h, t, H, hpu) * p.ld_hs + d] =
                src[(static_cast<size_t>(b) * p.T + t) * src_ld + static_cast<size_t>(h) * p.hs + d];
  }
  template <typename Src>
  void scatter(bf16* dst, std::size_t dst_ld, const Src* src, int H, int hpu) {
    for (int b = 0; b < p.B; b++)
      for (int h = 0; h < H; h++)
        for (int t = 0; t < p.T; t++)
          for (int d = 0; d < p.hs; d++) {
            const size_t from = hm_row(b, h, t, H, hpu) * p.ld_hs + d;
            float v;
            if constexpr (std::is_same_v<Src, float>) {
              v = src[from];
            } else {
              v = bf(src, from);
            }
            set_bf(dst, (static_cast<size_t>(b) * p.T + t) * dst_ld + static_cast<size_t>(h) * p.hs + d, v);
          }
  }
  void forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v) {
    bf16 *qh = at<bf16>(p.q_off), *kh = at<bf16>(p.k_off), *vh = at<bf16>(p.v_off), *oh = at<bf16>(p.o_off);
    float* S = at<float>(p.s_off);
    bf16* P = at<bf16>(p.p_off);
    gather(qh, q, q_ld, p.NH, p.heads_per_unit);
    gather(kh, k, kv_ld, p.NKV, 1);
    gather(vh, v, kv_ld, p.NKV, 1);
    const float scale = gemm_attn::score_scale(p.hs);
    const int groups = p.B * p.NKV;
    std::vector<float> row(static_cast<size_t>(p.T));
    for (int g0 = 0; g0 < groups; g0 += p.chunk) {
      for (int unit = 0; unit < p.units_per_group; unit++) {
        for (int block = p.time_blocks - 1; block >= 0; block--) {
          const gemm_attn::Batch b = gemm_attn::batch_for(p, g0, unit, block);
          const Gemm gs = gemm_attn::scores_gemm(p, b, S, qh, kh, "S");
          ASSERT_TRUE(check_gemm(gs).is_ok()) << check_gemm(gs).to_string();
          reference_gemm(gs);
          const long long br = gemm_attn::block_rows(b, p);
          for (long long R = 0; R < b.groups * br; R++) {
            const int pos = attn::block_position(R, br, p.heads_per_unit, b.t0);
            const float l = attn::softmax_row_on_host(S + R * p.ld_t, b.t1, pos, scale, row.data());
            for (int j = 0; j < b.t1; j++) set_bf(P, static_cast<size_t>(R) * p.ld_t + j, row[j]);
            lse[attn::block_global_row(R, br, p.heads_per_unit, b.t0, p.T, p.G, g0, unit * p.heads_per_unit)] = l;
          }
          const Gemm go = gemm_attn::rows_gemm(p, b, oh, P, vh, 1.0f, "O");
          ASSERT_TRUE(check_gemm(go).is_ok()) << check_gemm(go).to_string();
          reference_gemm(go);
        }
      }
    }
    scatter(out, o_ld, static_cast<const bf16*>(oh), p.NH, p.heads_per_unit);
  }
  void backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                const bf16* out, const float* lse) {
    float* dsum = at<float>(p.d_off);
    bf16 *qh = at<bf16>(p.q_off), *kh = at<bf16>(p.k_off), *vh = at<bf16>(p.v_off), *doh = at<bf16>(p.o_off);
    bf16* dqh = at<bf16>(p.dq_off);
    float *dkh = at<float>(p.dk_off), *dvh = at<float>(p.dv_off), *S = at<float>(p.s_off), *dP = at<float>(p.dp_off);
    bf16 *P = at<bf16>(p.p_off), *dS = at<bf16>(p.ds_off);
    for (int b = 0; b < p.B; b++)
      for (int h = 0; h < p.NH; h++)
        for (int t = 0; t < p.T; t++) {
          float acc = 0.0f;
          const size_t at_o = (static_cast<size_t>(b) * p.T + t) * o_ld + static_cast<size_t>(h) * p.hs;
          for (int d = 0; d < p.hs; d++) acc += bf(dout, at_o + d) * bf(out, at_o + d);
          dsum[(static_cast<size_t>(b) * p.NH + h) * p.T + t] = acc;
        }
    gather(qh, q, q_ld, p.NH, p.heads_per_unit);
    gather(kh, k, kv_ld, p.NKV, 1);
    gather(vh, v, kv_ld, p.NKV, 1);
    gather(doh, dout, o_ld, p.NH, p.heads_per_unit);
    const float scale = gemm_attn::score_scale(p.hs);
    const int groups = p.B * p.NKV;
    std::vector<float> prow(static_cast<size_t>(p.T)), dsrow(static_cast<size_t>(p.T));
    for (int g0 = 0; g0 < groups; g0 += p.chunk) {
      for (int unit = 0; unit < p.units_per_group; unit++) {
        for (int block = p.time_blocks - 1; block >= 0; block--) {
          const gemm_attn::Batch b = gemm_attn::batch_for(p, g0, unit, block);
          const Gemm products[2] = {gemm_attn::scores_gemm(p, b, S, qh, kh, "S"),
                                    gemm_attn::scores_gemm(p, b, dP, doh, vh, "dP")};
          for (const Gemm& g : products) {
            ASSERT_TRUE(check_gemm(g).is_ok()) << check_gemm(g).to_string();
            reference_gemm(g);
          }
          const long long br = gemm_attn::block_rows(b, p);
          for (long long R = 0; R < b.groups * br; R++) {
            const long long gr =
                attn::block_global_row(R, br, p.heads_per_unit, b.t0, p.T, p.G, g0, unit * p.heads_per_unit);
            const int pos = attn::block_position(R, br, p.heads_per_unit, b.t0);
            attn::score_grad_row_on_host(S + R * p.ld_t, dP + R * p.ld_t, b.t1, pos, scale, lse[gr], dsum[gr],
                                         prow.data(), dsrow.data());
            for (int j = 0; j < b.t1; j++) {
              set_bf(P, static_cast<size_t>(R) * p.ld_t + j, prow[j]);
              set_bf(dS, static_cast<size_t>(R) * p.ld_t + j, dsrow[j]);
            }
          }
          const Gemm grads[3] = {gemm_attn::rows_gemm(p, b, dqh, dS, kh, scale, "dQ"),
                                 gemm_attn::keys_gemm(p, b, dkh, dS, qh, scale, "dK"),
                                 gemm_attn::keys_gemm(p, b, dvh, P, doh, 1.0f, "dV")};
          for (const Gemm& g : grads) {
            ASSERT_TRUE(check_gemm(g).is_ok()) << check_gemm(g).to_string();
            reference_gemm(g);
          }
        }
      }
    }
    scatter(dq, q_ld, static_cast<const bf16*>(dqh), p.NH, p.heads_per_unit);
    scatter(dk, kv_ld, static_cast<const float*>(dkh), p.NKV, 1);
    scatter(dv, kv_ld, static_cast<const float*>(dvh), p.NKV, 1);
  }
};

// Tolerances as the GPU tests' (attention_test.cpp): out within 2^-7 relative plus 1e-2 of its
// largest value and 5e-3 relative L2 (P is rounded to bf16 before P V); lse 1e-5; gradients
// 1e-2 relative L2 and 2^-6 plus 1e-2 of the largest gradient per element.
void expect_close_grads(const std::vector<float>& got, const std::vector<float>& want, double floor) {
  if (testing::max_abs(want) > 0) {
    EXPECT_LT(testing::rel_l2(got, want), 1e-2);
  }
  EXPECT_TRUE(testing::near_all_floor(got, want, 1.0 / 64, floor));
}

// Scratch sizes: the nets' (one call per block), and room for 8 rows of scores (blocks of at
// most 8 positions of one head, one group per call: units and blocks accumulate dK, dV, calls
// cover the groups).
std::vector<std::size_t> scratch_sizes(int B, int T, int NH, int NKV, int hs) {
  const std::size_t full = gemm_attention_scratch_bytes(B * T, T, NH, NKV, hs);
  const GemmAttentionPlan p = gemm_attention_plan(B, T, NH, NKV, hs, full).value();
  const std::size_t n = static_cast<std::size_t>(8) * p.ld_t;
  return {full, p.s_off + 2 * n * 4 + 2 * n * 2 + 4 * 256};
}

TEST(GpuAttentionMath, GemmAlgebraOnHostMatchesCpuAttention) {
  struct D {
    int B, T, C, NH;
  };
  for (const D d : {D{2, 37, 64, 4}, D{1, 1, 64, 2}, D{1, 70, 128, 1}, D{3, 9, 48, 3}, D{1, 300, 64, 2}}) {
    const int hs = d.C / d.NH;
    const size_t BT = static_cast<size_t>(d.B) * d.T, n_qkv = BT * 3 * d.C, n_out = BT * d.C;
    const std::vector<float> qkv = rounded(randn(1, n_qkv)), dout = rounded(randn(2, n_out));
    std::vector<float> want(n_out), want_lse(static_cast<size_t>(d.B) * d.NH * d.T), cpu_out(n_out),
        want_grad(n_qkv);
    model::kernels::attention_forward_reference(want.data(), qkv.data(), d.B, d.T, d.C, d.NH);
    std::vector<float> cpu_scratch(model::kernels::attention_scratch_floats());
    model::kernels::attention_forward(cpu_out.data(), want_lse.data(), qkv.data(), cpu_scratch.data(), d.B, d.T, d.C,
                                      d.NH);
    model::kernels::attention_backward_reference(want_grad.data(), dout.data(), qkv.data(), d.B, d.T, d.C, d.NH);
    for (std::size_t bytes : scratch_sizes(d.B, d.T, d.NH, d.NH, hs)) {
      SCOPED_TRACE("B " + std::to_string(d.B) + " T " + std::to_string(d.T) + " C " + std::to_string(d.C) + " NH " +
                   std::to_string(d.NH) + " scratch " + std::to_string(bytes));
      const GemmAttentionPlan p = gemm_attention_plan(d.B, d.T, d.NH, d.NH, hs, bytes).value();
      ASSERT_GE(p.heads_per_unit, 1);
      const size_t c = static_cast<size_t>(d.C);
      HostGemmAttention h(p, 3 * c, 3 * c, c);
      std::vector<uint16_t> qkv_b = to_bits(qkv), dout_b = to_bits(dout), out_b(n_out), grad_b(n_qkv);
      std::vector<float> lse(want_lse.size());
      const bf16* x = as_bf(qkv_b);
      h.forward(as_bf(out_b), lse.data(), x, x + c, x + 2 * c);
      const std::vector<float> out = from_bits(out_b);
      EXPECT_TRUE(near_all(out, want, 1.0 / 128, 1e-2));
      EXPECT_LT(testing::rel_l2(out, want), 5e-3);
      EXPECT_TRUE(near_all(lse, want_lse, 1e-5, 1e-6));
      bf16* gq = as_bf(grad_b);
      h.backward(gq, gq + c, gq + 2 * c, as_bf(dout_b), x, x + c, x + 2 * c, as_bf(out_b), lse.data());
      const std::vector<float> got = from_bits(grad_b);
      const double floor = 1e-2 * testing::max_abs(want_grad);
      for (int which = 0; which < 3; which++) {
        SCOPED_TRACE("qkv"[which]);
        std::vector<float> g(n_out), w(n_out);
        for (size_t bt = 0; bt < BT; bt++)
          for (size_t k = 0; k < c; k++) {
            g[bt * c + k] = got[bt * 3 * c + which * c + k];
            w[bt * c + k] = want_grad[bt * 3 * c + which * c + k];
          }
        expect_close_grads(g, w, floor);
      }
    }
  }
}

TEST(GpuAttentionMath, GqaGemmAlgebraOnHostMatchesCpuAttention) {
  namespace cpu = model::kernels;
  for (const GqaShape s : {GqaShape{2, 19, 6, 2, 16}, GqaShape{1, 33, 4, 1, 64}, GqaShape{2, 1, 4, 2, 128},
                           GqaShape{1, 20, 4, 4, 24}, GqaShape{1, 270, 4, 2, 16}}) {
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
    for (std::size_t bytes : scratch_sizes(s.B, s.T, s.NH, s.NKV, s.hs)) {
      SCOPED_TRACE("B " + std::to_string(s.B) + " T " + std::to_string(s.T) + " NH " + std::to_string(s.NH) +
                   " NKV " + std::to_string(s.NKV) + " hs " + std::to_string(s.hs) + " scratch " +
                   std::to_string(bytes));
      const GemmAttentionPlan p = gemm_attention_plan(s.B, s.T, s.NH, s.NKV, s.hs, bytes).value();
      ASSERT_GE(p.heads_per_unit, 1);
      const size_t qw = static_cast<size_t>(s.NH) * s.hs, kvw = static_cast<size_t>(s.NKV) * s.hs;
      HostGemmAttention h(p, qw, kvw, qw);
      std::vector<uint16_t> q_b = to_bits(q), k_b = to_bits(k), v_b = to_bits(v), dout_b = to_bits(dout);
      std::vector<uint16_t> out_b(nq), dq_b(nq), dk_b(nkv), dv_b(nkv);
      std::vector<float> lse(nlse);
      h.forward(as_bf(out_b), lse.data(), as_bf(q_b), as_bf(k_b), as_bf(v_b));
      const std::vector<float> out = from_bits(out_b);
      EXPECT_TRUE(near_all(out, want, 1.0 / 128, 1e-2));
      EXPECT_LT(testing::rel_l2(out, want), 5e-3);
      EXPECT_TRUE(near_all(lse, want_lse, 1e-5, 1e-6));
      h.backward(as_bf(dq_b), as_bf(dk_b), as_bf(dv_b), as_bf(dout_b), as_bf(q_b), as_bf(k_b), as_bf(v_b), as_bf(out_b),
                 lse.data());
      const double floor =
          1e-2 * std::max({testing::max_abs(want_dq), testing::max_abs(want_dk), testing::max_abs(want_dv)});
      SCOPED_TRACE("dq");
      expect_close_grads(from_bits(dq_b), want_dq, floor);
      SCOPED_TRACE("dk");
      expect_close_grads(from_bits(dk_b), want_dk, floor);
      SCOPED_TRACE("dv");
      expect_close_grads(from_bits(dv_b), want_dv, floor);
    }
  }
}

}  // namespace
}  // namespace zinf::gpu
