// The GPU layer's host-side arithmetic, tested without a GPU: the bf16 rounding and GELU the
// kernels share with the host, the Adam element update against the CPU optimizer, launch
// geometry, the embedding buckets, and the row-major -> column-major mapping of the linear
// layers onto cuBLASLt products (evaluated here by a scalar reference of cuBLASLt's contract).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "gpu/adam.h"
#include "gpu/attention_tiles.h"
#include "gpu/blas.h"
#include "gpu/launch_geometry.h"
#include "gpu/numerics.h"
#include "kernel_test_util.h"
#include "model/kernels.h"
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

}  // namespace
}  // namespace zinf::gpu
