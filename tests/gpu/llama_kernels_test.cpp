// Llama's GPU kernels (RMSNorm, RoPE, SwiGLU, grouped-query attention) against the CPU kernels
// of model/llama_kernels.h on the same bf16-rounded inputs, with stated tolerances, and the host
// arithmetic they share with the CPU (run everywhere). The GPU tests skip without a GPU.
//
// Tolerances, and why:
// - RoPE: bit-exact against the CPU's fp32 result rounded to bf16. Both do the same four
//   products and two sums, each rounded separately (numerics.h rope_rotate, no FMA), on the
//   same fp32 tables.
// - SwiGLU: 2^-7 relative + 1e-6 of the largest value. Only the exponential differs (device
//   expf within 2 ulp of glibc's), which can move the bf16 rounding by one ulp; the floor covers
//   silu'(g)'s zero near g = -1.28, where 1 + g (1 - sig) cancels.
// - RMSNorm forward: 2^-8 relative (one bf16 rounding) + 1e-5 of the largest value; rstd 1e-5
//   relative (a warp's butterfly sum of squares against the CPU's serial sum).
// - RMSNorm backward (fp32 outputs), also with d(out) in parts: 1e-4 relative + 1e-5 of the
//   largest value: sums in another order, and FMA contraction in dnorm - norm * mean(dnorm *
//   norm), which cancels.
// - GQA forward: out 2^-8 relative + 1e-4 of the largest value (one bf16 rounding of an fp32
//   online softmax); lse 1e-5 relative. Backward: dq, dk, dv each within 1e-2 relative L2 and
//   every element within 2^-6 relative + 1e-2 of the largest gradient (D = rowsum(dO * O) reads
//   the bf16-rounded O; the reference uses its exact P): the GPT attention's bounds, which
//   passed on an H100.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/flash_attention.h"
#include "gpu/launch_geometry.h"
#include "gpu/llama_kernels.h"
#include "gpu/numerics.h"
#include "gpu_test_util.h"
#include "kernel_test_util.h"
#include "model/fused_kernels.h"
#include "model/llama_kernels.h"

namespace zinf::gpu {
namespace {

namespace cpu = model::kernels;
using testing::bf;
using testing::download_bf16;
using testing::near_all;
using testing::near_all_floor;
using testing::randn;
using testing::rel_l2;
using testing::rounded;
using testing::TestBuffer;
using testing::to_bits;
using testing::upload_bf16;

constexpr double kOneUlp = 1.0 / 256;
constexpr double kTwoUlp = 1.0 / 128;

// ---- host arithmetic (no GPU) ------------------------------------------------------------------

// numerics.h's SwiGLU, which the kernels run, is the CPU kernel's formula bit for bit on the host.
TEST(GpuLlamaMath, SwigluIsTheCpuKernelsFormula) {
  std::vector<float> g(6001 + 6), up(g.size()), dout(g.size());
  for (size_t i = 0; i < 6001; i++) g[i] = static_cast<float>(static_cast<int>(i) - 3000) * 0.005f;
  const float big[] = {40.0f, -40.0f, 100.0f, -100.0f, 1e10f, -1e10f};
  for (size_t i = 0; i < 6; i++) g[6001 + i] = big[i];
  const std::vector<float> u = randn(1, g.size()), d = randn(2, g.size());
  std::vector<float> out(g.size()), dgate(g.size()), dup(g.size());
  cpu::swiglu_forward(out.data(), g.data(), u.data(), g.size());
  cpu::swiglu_backward(dgate.data(), dup.data(), d.data(), g.data(), u.data(), g.size());
  for (size_t i = 0; i < g.size(); i++) {
    const float f = swiglu(g[i], u[i]);
    const float dg = swiglu_dgate(g[i], u[i], d[i]);
    const float du = swiglu_dup(g[i], d[i]);
    ASSERT_EQ(std::memcmp(&f, &out[i], sizeof f), 0) << g[i] << ": " << f << " vs " << out[i];
    ASSERT_EQ(std::memcmp(&dg, &dgate[i], sizeof dg), 0) << g[i] << ": " << dg << " vs " << dgate[i];
    ASSERT_EQ(std::memcmp(&du, &dup[i], sizeof du), 0) << g[i] << ": " << du << " vs " << dup[i];
  }
}

// The RoPE kernel's loop, run on the host: every element of x is rotated exactly once (each
// pair's lo in the first half of a head, its hi half a head later), and the result is the CPU
// rope_forward/rope_backward bit for bit.
TEST(GpuLlamaMath, RopePairsAreTheCpuRotation) {
  struct Shape {
    int B, T, NH, hd;
  };
  for (const Shape s : {Shape{2, 5, 3, 8}, Shape{1, 1, 2, 128}, Shape{3, 7, 1, 6}, Shape{1, 33, 4, 64}}) {
    SCOPED_TRACE(std::to_string(s.B) + " " + std::to_string(s.T) + " " + std::to_string(s.NH) + " " +
                 std::to_string(s.hd));
    const int half = s.hd / 2;
    const size_t n = static_cast<size_t>(s.B) * s.T * s.NH * s.hd;
    std::vector<float> cos(static_cast<size_t>(s.T) * half), sin(cos.size());
    cpu::rope_tables(cos.data(), sin.data(), s.T, s.hd, 10000.0);
    const std::vector<float> x = rounded(randn(3, n));
    for (float sign : {1.0f, -1.0f}) {
      std::vector<float> want = x, got = x;
      if (sign > 0) {
        cpu::rope_forward(want.data(), cos.data(), sin.data(), s.B, s.T, s.NH, s.hd);
      } else {
        cpu::rope_backward(want.data(), cos.data(), sin.data(), s.B, s.T, s.NH, s.hd);
      }
      std::vector<int> touched(n, 0);
      for (size_t idx = 0; idx < n / 2; idx++) {
        const detail::RopePair p = detail::rope_pair(idx, s.T, s.NH, s.hd);
        ASSERT_LT(p.lo % static_cast<size_t>(s.hd), static_cast<size_t>(half));
        ASSERT_LT(p.table, cos.size());
        touched[p.lo]++;
        touched[p.lo + half]++;
        const RotatedPair r = rope_rotate(x[p.lo], x[p.lo + half], cos[p.table], sign * sin[p.table]);
        got[p.lo] = r.lo;
        got[p.lo + half] = r.hi;
      }
      for (size_t i = 0; i < n; i++) ASSERT_EQ(touched[i], 1) << i;
      ASSERT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0);
    }
  }
}

TEST(GpuLlamaMath, GqaGeometryAndScratch) {
  // Llama-2 70B's shape: 64 query heads on 8 kv heads of 128.
  Result<AttentionGeometry> g = gqa_attention_geometry(2, 100, 64, 8, 128);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_EQ(g->hs, 128);
  EXPECT_EQ(g->per_lane, 4);
  EXPECT_EQ(g->heads, 128u);
  EXPECT_EQ(g->kv_heads, 16u);
  EXPECT_EQ(g->q_tiles, 7u);  // ceil(100 / 16)
  EXPECT_EQ(g->k_tiles, 4u);  // ceil(100 / 32)
  EXPECT_LE(g->dkv_smem, 99u * 1024) << "more shared memory than an sm_86 block can have";
  // Shared memory depends on hs alone, as GPT's.
  Result<AttentionGeometry> mha = attention_geometry(2, 100, 64 * 128, 64);
  ASSERT_TRUE(mha.is_ok());
  EXPECT_EQ(mha->kv_heads, mha->heads);
  EXPECT_EQ(g->forward_smem, mha->forward_smem);
  EXPECT_EQ(g->dq_smem, mha->dq_smem);
  EXPECT_EQ(g->dkv_smem, mha->dkv_smem);
  EXPECT_EQ(gqa_attention_geometry(1, 8, 6, 4, 64).status().code(), ErrorCode::kInvalidArgument);  // 6 % 4
  EXPECT_EQ(gqa_attention_geometry(1, 0, 4, 4, 64).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(gqa_attention_geometry(1, 8, 4, 2, 0).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(gqa_attention_geometry(1, 8, 4, 2, 160).status().code(), ErrorCode::kUnsupported);
  EXPECT_EQ(gqa_attention_geometry(70000, 8, 1, 1, 64).status().code(), ErrorCode::kUnsupported);
  EXPECT_EQ(rmsnorm_backward_scratch_floats(65, 10), 20u);
}

// No device needed: every launcher rejects bad sizes before touching CUDA, naming itself and the
// sizes.
TEST(GpuLlamaMath, SizesAreCheckedBeforeLaunching) {
  Status st = rope_forward(nullptr, nullptr, nullptr, 16, 1, 8, 2, 7, nullptr);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("rope_forward B=1 T=8 n_heads=2 head_dim=7"), std::string::npos) << st.message();
  st = rope_backward(nullptr, nullptr, nullptr, 4, 1, 8, 2, 8, nullptr);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("table_rows=4"), std::string::npos) << st.message();
  st = rmsnorm_forward(nullptr, nullptr, nullptr, nullptr, 1e-5f, 3, 0, nullptr);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("rmsnorm_forward N=3 C=0"), std::string::npos) << st.message();
  EXPECT_EQ(rmsnorm_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8, nullptr).code(),
            ErrorCode::kInvalidArgument);
  st = summed_rmsnorm_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 0,
                               nullptr);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("summed_rmsnorm_backward"), std::string::npos) << st.message();
  st = gqa_attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, GqaShape{1, 8, 6, 4, 64}, nullptr);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("NKV (4)"), std::string::npos) << st.message();
  st = gqa_attention_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                              GqaShape{1, 8, 4, 2, 256}, nullptr);
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
  EXPECT_NE(st.message().find("head size 256"), std::string::npos) << st.message();
  EXPECT_TRUE(swiglu_forward(nullptr, nullptr, nullptr, 0, nullptr).is_ok());  // nothing to do
  EXPECT_TRUE(swiglu_backward(nullptr, nullptr, nullptr, nullptr, nullptr, 0, nullptr).is_ok());
}

// ---- RMSNorm, RoPE, SwiGLU on the GPU ----------------------------------------------------------

struct NormShape {
  int N, C;
};
const NormShape kNormShapes[] = {{37, 200}, {1, 64}, {70, 4096}, {130, 33}};

TEST(GpuLlamaKernels, RmsNormForwardMatchesCpu) {
  ZINF_REQUIRE_GPU();
  const float eps = 1e-5f;
  for (const NormShape s : kNormShapes) {
    SCOPED_TRACE("N " + std::to_string(s.N) + " C " + std::to_string(s.C));
    const size_t n = static_cast<size_t>(s.N) * s.C;
    std::vector<float> inp = randn(1, n, 2.0);
    inp[0] = 0.0f;
    inp = rounded(inp);
    const std::vector<float> w = rounded(randn(2, s.C, 0.5));
    std::vector<float> want(n), want_rstd(s.N);
    cpu::rmsnorm_forward(want.data(), want_rstd.data(), inp.data(), w.data(), eps, s.N, s.C);
    TestBuffer<uint16_t> d_inp = upload_bf16(inp), d_w = upload_bf16(w), out(n), out2(n);
    TestBuffer<float> rstd(s.N);
    Status st = rmsnorm_forward(bf(out), rstd.get(), bf(d_inp), bf(d_w), eps, s.N, s.C, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_TRUE(near_all(download_bf16(out), want, kOneUlp, 1e-5));
    EXPECT_TRUE(near_all(rstd.download(), want_rstd, 1e-5, 0.0));
    ASSERT_TRUE(rmsnorm_forward(bf(out2), rstd.get(), bf(d_inp), bf(d_w), eps, s.N, s.C, nullptr).is_ok());
    EXPECT_EQ(out.download(), out2.download());  // deterministic
  }
}

TEST(GpuLlamaKernels, RmsNormBackwardMatchesCpu) {
  ZINF_REQUIRE_GPU();
  const float eps = 1e-5f;
  for (const NormShape s : kNormShapes) {
    SCOPED_TRACE("N " + std::to_string(s.N) + " C " + std::to_string(s.C));
    const size_t n = static_cast<size_t>(s.N) * s.C;
    const std::vector<float> inp = rounded(randn(1, n, 2.0)), w = rounded(randn(2, s.C, 0.5));
    const std::vector<float> dout = rounded(randn(3, n));
    std::vector<float> y(n), rstd(s.N);
    cpu::rmsnorm_forward(y.data(), rstd.data(), inp.data(), w.data(), eps, s.N, s.C);
    const std::vector<float> dinp0 = randn(4, n), dw0 = randn(5, s.C);
    std::vector<float> want_dinp = dinp0, want_dw = dw0;
    cpu::rmsnorm_backward(want_dinp.data(), want_dw.data(), dout.data(), inp.data(), w.data(), rstd.data(), s.N, s.C);
    TestBuffer<uint16_t> d_inp = upload_bf16(inp), d_w = upload_bf16(w), d_dout = upload_bf16(dout);
    TestBuffer<float> d_rstd(rstd), dinp(dinp0), dw(dw0), dinp2(dinp0), dw2(dw0);
    TestBuffer<float> scratch(rmsnorm_backward_scratch_floats(s.N, s.C));
    Status st = rmsnorm_backward(dinp.get(), dw.get(), scratch.get(), bf(d_dout), bf(d_inp), bf(d_w), d_rstd.get(),
                                 s.N, s.C, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_TRUE(near_all(dinp.download(), want_dinp, 1e-4, 1e-5));
    EXPECT_TRUE(near_all(dw.download(), want_dw, 1e-4, 1e-5));
    st = rmsnorm_backward(dinp2.get(), dw2.get(), scratch.get(), bf(d_dout), bf(d_inp), bf(d_w), d_rstd.get(), s.N,
                          s.C, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(dinp.download(), dinp2.download());  // deterministic
    EXPECT_EQ(dw.download(), dw2.download());
  }
}

// d(out) in two parts (post_attention_layernorm: gate's and up's) and three (input_layernorm:
// q's, k's and v's), summed in the kernel as the CPU's fused kernel sums them.
TEST(GpuLlamaKernels, SummedRmsNormBackwardMatchesCpu) {
  ZINF_REQUIRE_GPU();
  const float eps = 1e-5f;
  const int N = 45, C = 160;
  const size_t n = static_cast<size_t>(N) * C;
  const std::vector<float> inp = rounded(randn(1, n, 2.0)), w = rounded(randn(2, C, 0.5));
  const std::vector<float> d0 = rounded(randn(3, n)), d1 = rounded(randn(4, n)), d2 = rounded(randn(5, n));
  std::vector<float> y(n), rstd(N);
  cpu::rmsnorm_forward(y.data(), rstd.data(), inp.data(), w.data(), eps, N, C);
  const std::vector<float> dinp0 = randn(6, n), dw0 = randn(7, C);
  TestBuffer<uint16_t> d_inp = upload_bf16(inp), d_w = upload_bf16(w);
  TestBuffer<uint16_t> d_d0 = upload_bf16(d0), d_d1 = upload_bf16(d1), d_d2 = upload_bf16(d2);
  TestBuffer<float> d_rstd(rstd), scratch(rmsnorm_backward_scratch_floats(N, C));
  for (int parts : {2, 3}) {
    SCOPED_TRACE(parts);
    std::vector<float> want_dinp = dinp0, want_dw = dw0;
    const float* want_d2 = parts == 3 ? d2.data() : nullptr;
    cpu::summed_rmsnorm_backward(want_dinp.data(), want_dw.data(), d0.data(), d1.data(), want_d2, inp.data(), w.data(),
                                 rstd.data(), N, C);
    TestBuffer<float> dinp(dinp0), dw(dw0);
    const Status st = summed_rmsnorm_backward(dinp.get(), dw.get(), scratch.get(), bf(d_d0), bf(d_d1),
                                              parts == 3 ? bf(d_d2) : nullptr, bf(d_inp), bf(d_w), d_rstd.get(), N, C,
                                              nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_TRUE(near_all(dinp.download(), want_dinp, 1e-4, 1e-5));
    EXPECT_TRUE(near_all(dw.download(), want_dw, 1e-4, 1e-5));
  }
}

TEST(GpuLlamaKernels, RopeIsBitExact) {
  ZINF_REQUIRE_GPU();
  struct Shape {
    int B, T, NH, hd;
  };
  for (const Shape s : {Shape{2, 37, 4, 64}, Shape{1, 1, 2, 128}, Shape{3, 17, 3, 6}, Shape{1, 70, 8, 128}}) {
    SCOPED_TRACE(std::to_string(s.B) + " " + std::to_string(s.T) + " " + std::to_string(s.NH) + " " +
                 std::to_string(s.hd));
    const int rows = s.T + 5;  // tables longer than T: the kernel reads the first T rows
    const size_t n = static_cast<size_t>(s.B) * s.T * s.NH * s.hd;
    std::vector<float> cos(static_cast<size_t>(rows) * (s.hd / 2)), sin(cos.size());
    cpu::rope_tables(cos.data(), sin.data(), rows, s.hd, 500000.0);
    const std::vector<float> x = rounded(randn(1, n, 3.0));
    std::vector<float> fwd = x, bwd = x;
    cpu::rope_forward(fwd.data(), cos.data(), sin.data(), s.B, s.T, s.NH, s.hd);
    cpu::rope_backward(bwd.data(), cos.data(), sin.data(), s.B, s.T, s.NH, s.hd);
    TestBuffer<float> d_cos(cos), d_sin(sin);
    TestBuffer<uint16_t> d_x = upload_bf16(x);
    Status st = rope_forward(bf(d_x), d_cos.get(), d_sin.get(), rows, s.B, s.T, s.NH, s.hd, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(d_x.download(), to_bits(fwd));
    d_x.upload(to_bits(x));
    st = rope_backward(bf(d_x), d_cos.get(), d_sin.get(), rows, s.B, s.T, s.NH, s.hd, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(d_x.download(), to_bits(bwd));
  }
}

TEST(GpuLlamaKernels, SwigluForwardAndBackwardMatchCpu) {
  ZINF_REQUIRE_GPU();
  const size_t n = 10007;
  std::vector<float> g(n);
  for (size_t i = 0; i < n; i++) g[i] = -12.0f + 24.0f * static_cast<float>(i) / static_cast<float>(n);
  g = rounded(g);
  const std::vector<float> up = rounded(randn(1, n)), dout = rounded(randn(2, n));
  std::vector<float> want(n), want_dgate(n), want_dup(n);
  cpu::swiglu_forward(want.data(), g.data(), up.data(), n);
  cpu::swiglu_backward(want_dgate.data(), want_dup.data(), dout.data(), g.data(), up.data(), n);
  TestBuffer<uint16_t> d_g = upload_bf16(g), d_up = upload_bf16(up), d_dout = upload_bf16(dout), out(n), dup(n);
  ASSERT_TRUE(swiglu_forward(bf(out), bf(d_g), bf(d_up), n, nullptr).is_ok());
  // dgate over dout, in place, as the model runs it.
  ASSERT_TRUE(swiglu_backward(bf(d_dout), bf(dup), bf(d_dout), bf(d_g), bf(d_up), n, nullptr).is_ok());
  EXPECT_TRUE(near_all(download_bf16(out), want, kTwoUlp, 1e-6));
  EXPECT_TRUE(near_all(download_bf16(d_dout), want_dgate, kTwoUlp, 1e-6));
  EXPECT_TRUE(near_all(download_bf16(dup), want_dup, kTwoUlp, 1e-6));
}

// ---- grouped-query attention --------------------------------------------------------------------

std::string name(const GqaShape& s) {
  return "B " + std::to_string(s.B) + " T " + std::to_string(s.T) + " NH " + std::to_string(s.NH) + " NKV " +
         std::to_string(s.NKV) + " hs " + std::to_string(s.hs);
}

// NKV in {1, 2, NH}; head sizes 64 and 128 (Llama's) and others; T = 1, T across tile edges.
const GqaShape kGqaShapes[] = {{2, 37, 4, 1, 64},  {2, 37, 4, 2, 64},  {2, 37, 4, 4, 64}, {1, 70, 8, 2, 128},
                               {1, 1, 4, 2, 128},  {1, 1, 2, 1, 64},   {3, 33, 6, 3, 80}, {1, 65, 2, 1, 16},
                               {2, 16, 3, 1, 32},  {1, 100, 8, 8, 128}};

struct GqaData {
  std::vector<float> q, k, v;
  size_t nq, nkv, nlse;
};
GqaData gqa_data(const GqaShape& s) {
  GqaData d;
  d.nq = static_cast<size_t>(s.B) * s.T * s.NH * s.hs;
  d.nkv = static_cast<size_t>(s.B) * s.T * s.NKV * s.hs;
  d.nlse = static_cast<size_t>(s.B) * s.NH * s.T;
  d.q = rounded(randn(1, d.nq));
  d.k = rounded(randn(2, d.nkv));
  d.v = rounded(randn(3, d.nkv));
  return d;
}
cpu::GqaShape cpu_shape(const GqaShape& s) { return cpu::GqaShape{s.B, s.T, s.NH, s.NKV, s.hs}; }

TEST(GpuLlamaAttention, ForwardMatchesCpuReference) {
  ZINF_REQUIRE_GPU();
  for (const GqaShape& s : kGqaShapes) {
    SCOPED_TRACE(name(s));
    const GqaData d = gqa_data(s);
    std::vector<float> want(d.nq), cpu_out(d.nq), want_lse(d.nlse);
    cpu::gqa_attention_forward_reference(want.data(), d.q.data(), d.k.data(), d.v.data(), cpu_shape(s));
    std::vector<float> scratch(cpu::gqa_attention_scratch_floats());
    cpu::gqa_attention_forward(cpu_out.data(), want_lse.data(), d.q.data(), d.k.data(), d.v.data(), scratch.data(),
                               cpu_shape(s));
    TestBuffer<uint16_t> q = upload_bf16(d.q), k = upload_bf16(d.k), v = upload_bf16(d.v), out(d.nq), out2(d.nq);
    TestBuffer<float> lse(d.nlse), lse2(d.nlse);
    Status st = gqa_attention_forward(bf(out), lse.get(), bf(q), bf(k), bf(v), s, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_TRUE(near_all(download_bf16(out), want, kOneUlp, 1e-4));
    EXPECT_TRUE(near_all(lse.download(), want_lse, 1e-5, 1e-6));
    ASSERT_TRUE(gqa_attention_forward(bf(out2), lse2.get(), bf(q), bf(k), bf(v), s, nullptr).is_ok());
    EXPECT_EQ(out.download(), out2.download());  // deterministic
    EXPECT_EQ(lse.download(), lse2.download());
  }
}

TEST(GpuLlamaAttention, BackwardMatchesCpuReference) {
  ZINF_REQUIRE_GPU();
  for (const GqaShape& s : kGqaShapes) {
    SCOPED_TRACE(name(s));
    const GqaData d = gqa_data(s);
    const std::vector<float> dout = rounded(randn(4, d.nq));
    std::vector<float> want_dq(d.nq), want_dk(d.nkv), want_dv(d.nkv);
    cpu::gqa_attention_backward_reference(want_dq.data(), want_dk.data(), want_dv.data(), dout.data(), d.q.data(),
                                          d.k.data(), d.v.data(), cpu_shape(s));
    TestBuffer<uint16_t> q = upload_bf16(d.q), k = upload_bf16(d.k), v = upload_bf16(d.v), d_dout = upload_bf16(dout);
    TestBuffer<uint16_t> out(d.nq), dq(d.nq), dk(d.nkv), dv(d.nkv), dq2(d.nq), dk2(d.nkv), dv2(d.nkv);
    TestBuffer<float> lse(d.nlse), scratch(attention_backward_scratch_floats(s.B, s.T, s.NH));
    ASSERT_TRUE(gqa_attention_forward(bf(out), lse.get(), bf(q), bf(k), bf(v), s, nullptr).is_ok());
    Status st = gqa_attention_backward(bf(dq), bf(dk), bf(dv), scratch.get(), bf(d_dout), bf(q), bf(k), bf(v), bf(out),
                                       lse.get(), s, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    // The floor is relative to the largest gradient of the three: with T = 1 the softmax has one
    // element and dq, dk are zero in exact arithmetic, where the GPU leaves rounding residue.
    const double floor = 1e-2 * std::max({testing::max_abs(want_dq), testing::max_abs(want_dk),
                                          testing::max_abs(want_dv)});
    const std::vector<float> got[3] = {download_bf16(dq), download_bf16(dk), download_bf16(dv)};
    const std::vector<float>* want[3] = {&want_dq, &want_dk, &want_dv};
    for (int which = 0; which < 3; which++) {
      SCOPED_TRACE("qkv"[which]);
      if (testing::max_abs(*want[which]) > 0) {
        EXPECT_LT(rel_l2(got[which], *want[which]), 1e-2);
      }
      EXPECT_TRUE(near_all_floor(got[which], *want[which], 1.0 / 64, floor));
    }
    st = gqa_attention_backward(bf(dq2), bf(dk2), bf(dv2), scratch.get(), bf(d_dout), bf(q), bf(k), bf(v), bf(out),
                                lse.get(), s, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(dq.download(), dq2.download());  // deterministic
    EXPECT_EQ(dk.download(), dk2.download());
    EXPECT_EQ(dv.download(), dv2.download());
  }
}

// With NKV == NH the grouped-query kernels on separate q, k, v are GPT's attention on the packed
// (B,T,3C) qkv: the same arithmetic in the same order, so the same bits, forward and backward.
TEST(GpuLlamaAttention, OneKvHeadPerQueryHeadIsGptAttentionBitForBit) {
  ZINF_REQUIRE_GPU();
  const GqaShape s{2, 45, 4, 4, 64};
  const int C = s.NH * s.hs;
  const GqaData d = gqa_data(s);
  const std::vector<float> dout = rounded(randn(4, d.nq));
  const size_t BT = static_cast<size_t>(s.B) * s.T;
  std::vector<float> qkv(BT * 3 * C);
  for (size_t bt = 0; bt < BT; bt++) {
    for (int c = 0; c < C; c++) {
      qkv[bt * 3 * C + c] = d.q[bt * C + c];
      qkv[bt * 3 * C + C + c] = d.k[bt * C + c];
      qkv[bt * 3 * C + 2 * C + c] = d.v[bt * C + c];
    }
  }
  TestBuffer<uint16_t> q = upload_bf16(d.q), k = upload_bf16(d.k), v = upload_bf16(d.v), d_dout = upload_bf16(dout);
  TestBuffer<uint16_t> d_qkv = upload_bf16(qkv), out(d.nq), gpt_out(d.nq), dq(d.nq), dk(d.nkv), dv(d.nkv);
  TestBuffer<uint16_t> dqkv(qkv.size());
  TestBuffer<float> lse(d.nlse), gpt_lse(d.nlse), scratch(attention_backward_scratch_floats(s.B, s.T, s.NH));
  ASSERT_TRUE(gqa_attention_forward(bf(out), lse.get(), bf(q), bf(k), bf(v), s, nullptr).is_ok());
  ASSERT_TRUE(attention_forward(bf(gpt_out), gpt_lse.get(), bf(d_qkv), s.B, s.T, C, s.NH, nullptr).is_ok());
  EXPECT_EQ(out.download(), gpt_out.download());
  EXPECT_EQ(lse.download(), gpt_lse.download());
  ASSERT_TRUE(gqa_attention_backward(bf(dq), bf(dk), bf(dv), scratch.get(), bf(d_dout), bf(q), bf(k), bf(v), bf(out),
                                     lse.get(), s, nullptr)
                  .is_ok());
  ASSERT_TRUE(attention_backward(bf(dqkv), scratch.get(), bf(d_dout), bf(d_qkv), bf(gpt_out), gpt_lse.get(), s.B, s.T,
                                 C, s.NH, nullptr)
                  .is_ok());
  const std::vector<uint16_t> packed = dqkv.download();
  const std::vector<uint16_t> parts[3] = {dq.download(), dk.download(), dv.download()};
  for (size_t bt = 0; bt < BT; bt++) {
    for (int which = 0; which < 3; which++) {
      for (int c = 0; c < C; c++) {
        ASSERT_EQ(packed[bt * 3 * C + static_cast<size_t>(which) * C + c], parts[which][bt * C + c])
            << "qkv"[which] << " row " << bt << " column " << c;
      }
    }
  }
}

}  // namespace
}  // namespace zinf::gpu
