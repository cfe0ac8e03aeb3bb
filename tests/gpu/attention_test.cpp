// Causal attention on the GPU against the CPU's direct-loop references
// (model/kernels.h attention_*_reference, model/llama_kernels.h gqa_attention_*_reference) on
// the same bf16-rounded inputs. GpuAttention: the GEMM path (gemm_attention.h, forced), GPT
// and grouped-query, with the nets' scratch (one batched call per time block and product) and
// with room for 8 rows of scores (blocks of <= 8 positions of one head, one kv group per call:
// units and blocks accumulate dK, dV, the calls cover the groups); T = 1, T off every tile and
// block size (T = 300: two blocks of 256 and 44), hs 16 to 128, B > 1. GpuFlashAttention: the
// flash kernels (the fallback) over every head-size class.
// Tolerances: flash forward out within one bf16 rounding (2^-8 relative) plus 1e-4 of its
// largest value; the GEMM path rounds P to bf16 before P V, so out within 2^-7 relative plus
// 1e-2 of the largest value and 5e-3 relative L2; lse within 1e-5 relative; backward dq, dk,
// dv each within 1e-2 relative L2 error and every element within 2^-6 relative plus 1e-2 of the
// largest gradient (the GPU's D = rowsum(dO * O) reads the bf16-rounded O, the reference its
// exact P; the GEMM path's dS is bf16). Skipped without a GPU.
#include "gpu/flash_attention.h"
#include "gpu/gemm_attention.h"

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <tuple>
#include <vector>

#include "gpu/launch_geometry.h"
#include "gpu/tc_attention.h"
#include "gpu_test_util.h"
#include "kernel_test_util.h"
#include "model/kernels.h"
#include "model/llama_kernels.h"

namespace zinf::gpu {
namespace {

using testing::bf;
using testing::download_bf16;
using testing::near_all;
using testing::randn;
using testing::rel_l2;
using testing::rounded;
using testing::TestBuffer;
using testing::upload_bf16;

struct Dims {
  int B, T, C, NH;
};
const Dims kDims[] = {{2, 37, 64, 4}, {1, 70, 128, 2}, {2, 33, 160, 2}, {1, 65, 256, 2}, {1, 1, 64, 2}, {3, 16, 96, 3}};

std::string name(const Dims& d) {
  return "B " + std::to_string(d.B) + " T " + std::to_string(d.T) + " C " + std::to_string(d.C) + " NH " +
         std::to_string(d.NH);
}

// Part `which` (0 q, 1 k, 2 v) of a (B,T,3C) tensor as (B,T,C).
std::vector<float> part(const std::vector<float>& qkv, const Dims& d, int which) {
  std::vector<float> out(static_cast<size_t>(d.B) * d.T * d.C);
  for (size_t bt = 0; bt < static_cast<size_t>(d.B) * d.T; bt++) {
    for (int c = 0; c < d.C; c++) out[bt * d.C + c] = qkv[bt * 3 * d.C + static_cast<size_t>(which) * d.C + c];
  }
  return out;
}

TEST(GpuFlashAttention, ForwardMatchesCpuReference) {
  ZINF_REQUIRE_GPU();
  for (const Dims& d : kDims) {
    SCOPED_TRACE(name(d));
    const size_t n_qkv = static_cast<size_t>(d.B) * d.T * 3 * d.C;
    const size_t n_out = static_cast<size_t>(d.B) * d.T * d.C;
    const std::vector<float> qkv = rounded(randn(1, n_qkv));
    std::vector<float> want(n_out), want_lse(static_cast<size_t>(d.B) * d.NH * d.T), cpu_out(n_out);
    model::kernels::attention_forward_reference(want.data(), qkv.data(), d.B, d.T, d.C, d.NH);
    std::vector<float> scratch(model::kernels::attention_scratch_floats());
    model::kernels::attention_forward(cpu_out.data(), want_lse.data(), qkv.data(), scratch.data(), d.B, d.T, d.C, d.NH);
    TestBuffer<uint16_t> d_qkv = upload_bf16(qkv), out(n_out);
    TestBuffer<float> lse(want_lse.size());
    const Status st = attention_forward(bf(out), lse.get(), bf(d_qkv), d.B, d.T, d.C, d.NH, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_TRUE(near_all(download_bf16(out), want, 1.0 / 256, 1e-4));
    EXPECT_TRUE(near_all(lse.download(), want_lse, 1e-5, 1e-6));
  }
}

TEST(GpuFlashAttention, BackwardMatchesCpuReference) {
  ZINF_REQUIRE_GPU();
  for (const Dims& d : kDims) {
    SCOPED_TRACE(name(d));
    const size_t n_qkv = static_cast<size_t>(d.B) * d.T * 3 * d.C;
    const size_t n_out = static_cast<size_t>(d.B) * d.T * d.C;
    const std::vector<float> qkv = rounded(randn(1, n_qkv)), dout = rounded(randn(2, n_out));
    std::vector<float> want(n_qkv);
    model::kernels::attention_backward_reference(want.data(), dout.data(), qkv.data(), d.B, d.T, d.C, d.NH);
    TestBuffer<uint16_t> d_qkv = upload_bf16(qkv), d_dout = upload_bf16(dout), out(n_out);
    TestBuffer<uint16_t> dqkv(n_qkv), dqkv2(n_qkv);
    TestBuffer<float> lse(static_cast<size_t>(d.B) * d.NH * d.T);
    TestBuffer<float> scratch(attention_backward_scratch_floats(d.B, d.T, d.NH));
    ASSERT_TRUE(attention_forward(bf(out), lse.get(), bf(d_qkv), d.B, d.T, d.C, d.NH, nullptr).is_ok());
    Status st = attention_backward(bf(dqkv), scratch.get(), bf(d_dout), bf(d_qkv), bf(out), lse.get(), d.B, d.T, d.C,
                                   d.NH, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    const std::vector<float> got = download_bf16(dqkv);
    // The absolute floor is relative to the whole gradient: with T = 1 the softmax has one
    // element and dq, dk are zero in exact arithmetic; the GPU leaves rounding residue of
    // order 1e-7 there (dP - rowsum(dO * O) in fp32), the CPU reference exact zeros.
    const double floor = 1e-2 * testing::max_abs(want);
    for (int which = 0; which < 3; which++) {
      SCOPED_TRACE("qkv"[which]);
      const std::vector<float> g = part(got, d, which), w = part(want, d, which);
      if (testing::max_abs(w) > 0) {
        EXPECT_LT(rel_l2(g, w), 1e-2);
      }
      EXPECT_TRUE(testing::near_all_floor(g, w, 1.0 / 64, floor));
    }
    // Deterministic: a second run gives the same bits.
    st = attention_backward(bf(dqkv2), scratch.get(), bf(d_dout), bf(d_qkv), bf(out), lse.get(), d.B, d.T, d.C, d.NH,
                            nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(dqkv.download(), dqkv2.download());
  }
}

TEST(GpuFlashAttention, UnsupportedHeadSizeIsAnErrorBeforeLaunch) {
  // No device needed.
  const Status st = attention_forward(nullptr, nullptr, nullptr, 1, 8, 512, 2, nullptr);
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
  EXPECT_NE(st.message().find("head size 256"), std::string::npos) << st.message();
}

// ---- the GEMM path ----------------------------------------------------------------------------

// The GEMM path, forced (the calls would take the tensor-core kernels first, tc_attention.h;
// tc_attention_test.cpp tests those). Every test checks that no call fell back to the flash
// kernels for want of a cuBLASLt algorithm.
class GpuAttention : public testing::BlasFixture {
 protected:
  void SetUp() override {
    testing::BlasFixture::SetUp();
    set_attention_path(AttentionPath::kGemm);
  }
  void TearDown() override {
    set_attention_path(std::nullopt);
    EXPECT_EQ(gemm_attn::flash_fallbacks(), 0) << "the GEMM path fell back to flash";
  }
};

// GPT-2's head size 64 at 12 heads, and 128, next to the flash tests' shapes.
const Dims kGemmDims[] = {{2, 37, 64, 4}, {1, 70, 128, 2}, {2, 33, 160, 2}, {1, 1, 64, 2},
                          {3, 16, 96, 3}, {2, 129, 768, 12}, {1, 300, 1024, 8}};

// The nets' scratch (one call per time block and product), and room for 8 rows of scores
// (blocks of at most 8 positions of one head, one kv group per call).
std::vector<std::size_t> scratch_sizes(int B, int T, int NH, int NKV, int hs) {
  const std::size_t full = gemm_attention_scratch_bytes(B * T, T, NH, NKV, hs);
  const GemmAttentionPlan p = gemm_attention_plan(B, T, NH, NKV, hs, full).value();
  const std::size_t n = static_cast<std::size_t>(8) * p.ld_t;
  return {full, p.s_off + 2 * n * 4 + 2 * n * 2 + 4 * 256};
}

AttentionScratch scratch_of(const TestBuffer<float>& b) { return AttentionScratch{b.get(), b.size() * sizeof(float)}; }

void expect_close_out(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_TRUE(near_all(got, want, 1.0 / 128, 1e-2));
  EXPECT_LT(rel_l2(got, want), 5e-3);
}

void expect_close_grad(const std::vector<float>& got, const std::vector<float>& want, double floor) {
  if (testing::max_abs(want) > 0) {
    EXPECT_LT(rel_l2(got, want), 1e-2);
  }
  EXPECT_TRUE(testing::near_all_floor(got, want, 1.0 / 64, floor));
}

TEST_F(GpuAttention, ForwardAndBackwardMatchCpuReference) {
  for (const Dims& d : kGemmDims) {
    const int hs = d.C / d.NH;
    const size_t n_qkv = static_cast<size_t>(d.B) * d.T * 3 * d.C;
    const size_t n_out = static_cast<size_t>(d.B) * d.T * d.C;
    const size_t n_lse = static_cast<size_t>(d.B) * d.NH * d.T;
    const std::vector<float> qkv = rounded(randn(1, n_qkv)), dout = rounded(randn(2, n_out));
    std::vector<float> want(n_out), want_lse(n_lse), cpu_out(n_out), want_grad(n_qkv);
    model::kernels::attention_forward_reference(want.data(), qkv.data(), d.B, d.T, d.C, d.NH);
    std::vector<float> cpu_scratch(model::kernels::attention_scratch_floats());
    model::kernels::attention_forward(cpu_out.data(), want_lse.data(), qkv.data(), cpu_scratch.data(), d.B, d.T, d.C,
                                      d.NH);
    model::kernels::attention_backward_reference(want_grad.data(), dout.data(), qkv.data(), d.B, d.T, d.C, d.NH);
    TestBuffer<uint16_t> d_qkv = upload_bf16(qkv), d_dout = upload_bf16(dout);
    for (std::size_t bytes : scratch_sizes(d.B, d.T, d.NH, d.NH, hs)) {
      SCOPED_TRACE(name(d) + " scratch " + std::to_string(bytes));
      TestBuffer<float> scratch((bytes + 3) / 4), lse(n_lse), lse2(n_lse);
      TestBuffer<uint16_t> out(n_out), out2(n_out), dqkv(n_qkv), dqkv2(n_qkv);
      Status st = gemm_attention_forward(*blas_, scratch_of(scratch), bf(out), lse.get(), bf(d_qkv), d.B, d.T, d.C,
                                         d.NH, nullptr);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      expect_close_out(download_bf16(out), want);
      EXPECT_TRUE(near_all(lse.download(), want_lse, 1e-5, 1e-6));
      st = gemm_attention_backward(*blas_, scratch_of(scratch), bf(dqkv), bf(d_dout), bf(d_qkv), bf(out), lse.get(),
                                   d.B, d.T, d.C, d.NH, nullptr);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      const std::vector<float> got = download_bf16(dqkv);
      const double floor = 1e-2 * testing::max_abs(want_grad);
      for (int which = 0; which < 3; which++) {
        SCOPED_TRACE("qkv"[which]);
        expect_close_grad(part(got, d, which), part(want_grad, d, which), floor);
      }
      // Deterministic: a second run gives the same bits.
      ASSERT_TRUE(gemm_attention_forward(*blas_, scratch_of(scratch), bf(out2), lse2.get(), bf(d_qkv), d.B, d.T, d.C,
                                         d.NH, nullptr)
                      .is_ok());
      ASSERT_TRUE(gemm_attention_backward(*blas_, scratch_of(scratch), bf(dqkv2), bf(d_dout), bf(d_qkv), bf(out),
                                          lse.get(), d.B, d.T, d.C, d.NH, nullptr)
                      .is_ok());
      EXPECT_EQ(out.download(), out2.download());
      EXPECT_EQ(lse.download(), lse2.download());
      EXPECT_EQ(dqkv.download(), dqkv2.download());
    }
  }
}

std::string gqa_name(const GqaShape& s) {
  return "B " + std::to_string(s.B) + " T " + std::to_string(s.T) + " NH " + std::to_string(s.NH) + " NKV " +
         std::to_string(s.NKV) + " hs " + std::to_string(s.hs);
}

TEST_F(GpuAttention, GqaForwardAndBackwardMatchCpuReference) {
  namespace cpu = model::kernels;
  const GqaShape shapes[] = {{2, 37, 4, 1, 64}, {2, 37, 4, 2, 64}, {2, 37, 4, 4, 64}, {1, 70, 8, 2, 128},
                             {1, 1, 4, 2, 128}, {3, 33, 6, 3, 80}, {1, 65, 2, 1, 16}, {2, 200, 32, 8, 128},
                             {1, 300, 8, 2, 64}};
  for (const GqaShape& s : shapes) {
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
    TestBuffer<uint16_t> dq_in = upload_bf16(q), dk_in = upload_bf16(k), dv_in = upload_bf16(v);
    TestBuffer<uint16_t> d_dout = upload_bf16(dout);
    for (std::size_t bytes : scratch_sizes(s.B, s.T, s.NH, s.NKV, s.hs)) {
      SCOPED_TRACE(gqa_name(s) + " scratch " + std::to_string(bytes));
      TestBuffer<float> scratch((bytes + 3) / 4), lse(nlse);
      TestBuffer<uint16_t> out(nq), dq(nq), dk(nkv), dv(nkv), dq2(nq), dk2(nkv), dv2(nkv);
      Status st = gemm_gqa_attention_forward(*blas_, scratch_of(scratch), bf(out), lse.get(), bf(dq_in), bf(dk_in),
                                             bf(dv_in), s, nullptr);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      expect_close_out(download_bf16(out), want);
      EXPECT_TRUE(near_all(lse.download(), want_lse, 1e-5, 1e-6));
      st = gemm_gqa_attention_backward(*blas_, scratch_of(scratch), bf(dq), bf(dk), bf(dv), bf(d_dout), bf(dq_in),
                                       bf(dk_in), bf(dv_in), bf(out), lse.get(), s, nullptr);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      const double floor =
          1e-2 * std::max({testing::max_abs(want_dq), testing::max_abs(want_dk), testing::max_abs(want_dv)});
      {
        SCOPED_TRACE("dq");
        expect_close_grad(download_bf16(dq), want_dq, floor);
      }
      {
        SCOPED_TRACE("dk");
        expect_close_grad(download_bf16(dk), want_dk, floor);
      }
      {
        SCOPED_TRACE("dv");
        expect_close_grad(download_bf16(dv), want_dv, floor);
      }
      st = gemm_gqa_attention_backward(*blas_, scratch_of(scratch), bf(dq2), bf(dk2), bf(dv2), bf(d_dout), bf(dq_in),
                                       bf(dk_in), bf(dv_in), bf(out), lse.get(), s, nullptr);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      EXPECT_EQ(dq.download(), dq2.download());  // deterministic
      EXPECT_EQ(dk.download(), dk2.download());
      EXPECT_EQ(dv.download(), dv2.download());
    }
  }
}

// Without room for one head's scores the flash kernels run: their bits exactly.
TEST_F(GpuAttention, WithoutRoomForOneHeadTheFlashKernelsRun) {
  const Dims d{2, 37, 64, 4};
  const size_t n_qkv = static_cast<size_t>(d.B) * d.T * 3 * d.C;
  const size_t n_out = static_cast<size_t>(d.B) * d.T * d.C;
  const size_t n_lse = static_cast<size_t>(d.B) * d.NH * d.T;
  const std::vector<float> qkv = rounded(randn(1, n_qkv)), dout = rounded(randn(2, n_out));
  TestBuffer<uint16_t> d_qkv = upload_bf16(qkv), d_dout = upload_bf16(dout);
  TestBuffer<uint16_t> out(n_out), flash_out(n_out), dqkv(n_qkv), flash_dqkv(n_qkv);
  TestBuffer<float> lse(n_lse), flash_lse(n_lse), scratch(n_lse), flash_scratch(n_lse);
  const GemmAttentionPlan p = gemm_attention_plan(d.B, d.T, d.NH, d.NH, d.C / d.NH, scratch.size() * 4).value();
  ASSERT_EQ(p.heads_per_unit, 0);
  ASSERT_TRUE(gemm_attention_forward(*blas_, scratch_of(scratch), bf(out), lse.get(), bf(d_qkv), d.B, d.T, d.C, d.NH,
                                     nullptr)
                  .is_ok());
  ASSERT_TRUE(attention_forward(bf(flash_out), flash_lse.get(), bf(d_qkv), d.B, d.T, d.C, d.NH, nullptr).is_ok());
  EXPECT_EQ(out.download(), flash_out.download());
  EXPECT_EQ(lse.download(), flash_lse.download());
  ASSERT_TRUE(gemm_attention_backward(*blas_, scratch_of(scratch), bf(dqkv), bf(d_dout), bf(d_qkv), bf(out), lse.get(),
                                      d.B, d.T, d.C, d.NH, nullptr)
                  .is_ok());
  ASSERT_TRUE(attention_backward(bf(flash_dqkv), flash_scratch.get(), bf(d_dout), bf(d_qkv), bf(flash_out),
                                 flash_lse.get(), d.B, d.T, d.C, d.NH, nullptr)
                  .is_ok());
  EXPECT_EQ(dqkv.download(), flash_dqkv.download());
}

TEST_F(GpuAttention, ScratchErrorsNameTheCall) {
  const Dims d{1, 16, 64, 2};
  TestBuffer<float> scratch(1 << 20);
  TestBuffer<uint16_t> qkv(static_cast<size_t>(d.T) * 3 * d.C), out(static_cast<size_t>(d.T) * d.C);
  TestBuffer<float> lse(static_cast<size_t>(d.NH) * d.T);
  AttentionScratch misaligned{reinterpret_cast<char*>(scratch.get()) + 16, (std::size_t{1} << 22) - 16};
  Status st = gemm_attention_forward(*blas_, misaligned, bf(out), lse.get(), bf(qkv), d.B, d.T, d.C, d.NH, nullptr);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("gemm_attention_forward"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("256-byte"), std::string::npos) << st.message();
  st = gemm_attention_backward(*blas_, AttentionScratch{scratch.get(), 8}, bf(qkv), bf(out), bf(qkv), bf(out),
                               lse.get(), d.B, d.T, d.C, d.NH, nullptr);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("gemm_attention_backward"), std::string::npos) << st.message();
  st = gemm_attention_forward(*blas_, AttentionScratch{scratch.get(), 1 << 22}, bf(out), lse.get(), bf(qkv), 1, 8,
                              512, 2, nullptr);
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);  // head size 256, as the flash kernels
}

// GPT-2 124M's attention at B = 8, T = 1024 (too large for the CPU reference in a test): the GEMM
// path against the flash kernels on the same inputs, and both timed (printed; one layer's
// forward and backward, the median of 5 after a warm-up).
TEST_F(GpuAttention, Gpt2LayerAgreesWithFlashAndIsTimed) {
  const Dims d{8, 1024, 768, 12};
  const size_t n_qkv = static_cast<size_t>(d.B) * d.T * 3 * d.C;
  const size_t n_out = static_cast<size_t>(d.B) * d.T * d.C;
  const size_t n_lse = static_cast<size_t>(d.B) * d.NH * d.T;
  const std::vector<float> qkv = rounded(randn(1, n_qkv)), dout = rounded(randn(2, n_out));
  TestBuffer<uint16_t> d_qkv = upload_bf16(qkv), d_dout = upload_bf16(dout);
  TestBuffer<uint16_t> out(n_out), flash_out(n_out), dqkv(n_qkv), flash_dqkv(n_qkv);
  TestBuffer<float> lse(n_lse), flash_lse(n_lse), flash_scratch(n_lse);
  const std::size_t bytes = gemm_attention_scratch_bytes(d.B * d.T, d.T, d.NH, d.NH, d.C / d.NH);
  TestBuffer<float> scratch((bytes + 3) / 4);
  auto gemm_fwd = [&] {
    return gemm_attention_forward(*blas_, scratch_of(scratch), bf(out), lse.get(), bf(d_qkv), d.B, d.T, d.C, d.NH,
                                  nullptr);
  };
  auto gemm_bwd = [&] {
    return gemm_attention_backward(*blas_, scratch_of(scratch), bf(dqkv), bf(d_dout), bf(d_qkv), bf(out), lse.get(),
                                   d.B, d.T, d.C, d.NH, nullptr);
  };
  auto flash_fwd = [&] {
    return attention_forward(bf(flash_out), flash_lse.get(), bf(d_qkv), d.B, d.T, d.C, d.NH, nullptr);
  };
  auto flash_bwd = [&] {
    return attention_backward(bf(flash_dqkv), flash_scratch.get(), bf(d_dout), bf(d_qkv), bf(flash_out),
                              flash_lse.get(), d.B, d.T, d.C, d.NH, nullptr);
  };
  ASSERT_TRUE(gemm_fwd().is_ok());
  ASSERT_TRUE(gemm_bwd().is_ok());
  ASSERT_TRUE(flash_fwd().is_ok());
  ASSERT_TRUE(flash_bwd().is_ok());
  expect_close_out(download_bf16(out), download_bf16(flash_out));
  EXPECT_TRUE(near_all(lse.download(), flash_lse.download(), 1e-5, 1e-6));
  const std::vector<float> got = download_bf16(dqkv), want = download_bf16(flash_dqkv);
  const double floor = 1e-2 * testing::max_abs(want);
  for (int which = 0; which < 3; which++) {
    SCOPED_TRACE("qkv"[which]);
    expect_close_grad(part(got, d, which), part(want, d, which), floor);
  }
  auto time_ms = [](auto&& run) {
    cudaEvent_t start = nullptr, stop = nullptr;
    EXPECT_EQ(cudaEventCreate(&start), cudaSuccess);
    EXPECT_EQ(cudaEventCreate(&stop), cudaSuccess);
    std::vector<float> ms;
    for (int i = 0; i < 5; i++) {
      EXPECT_EQ(cudaEventRecord(start, nullptr), cudaSuccess);
      EXPECT_TRUE(run().is_ok());
      EXPECT_EQ(cudaEventRecord(stop, nullptr), cudaSuccess);
      EXPECT_EQ(cudaEventSynchronize(stop), cudaSuccess);
      float t = 0.0f;
      EXPECT_EQ(cudaEventElapsedTime(&t, start, stop), cudaSuccess);
      ms.push_back(t);
    }
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  const float gf = time_ms(gemm_fwd), gb = time_ms(gemm_bwd), ff = time_ms(flash_fwd), fb = time_ms(flash_bwd);
  std::printf("GPT-2 attention layer, B 8 T 1024 C 768 NH 12: GEMM forward %.3f ms backward %.3f ms; "
              "flash forward %.3f ms backward %.3f ms\n",
              gf, gb, ff, fb);
  RecordProperty("gemm_forward_ms", std::to_string(gf));
  RecordProperty("gemm_backward_ms", std::to_string(gb));
  RecordProperty("flash_forward_ms", std::to_string(ff));
  RecordProperty("flash_backward_ms", std::to_string(fb));
}

}  // namespace
}  // namespace zinf::gpu
