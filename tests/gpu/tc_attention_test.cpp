// The tensor-core attention (tc_attention.h) on a GPU: forward and backward through the nets'
// calls (gemm_attention.h), which must take the tensor-core path, against the CPU references with
// the GEMM path's tolerances (attention_tolerances.h), bit-identical on a second run; a head size
// without a kernel instance takes the GEMM path; and a 1.3B GPT layer against the GEMM path,
// timed (printed). Skipped without a GPU; the host-side parts are tc_attention_host_test.cpp's.
#include "gpu/tc_attention.h"

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "gpu/gemm_attention.h"
#include "attention_tolerances.h"
#include "gpu/launch_geometry.h"
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
using testing::rounded;
using testing::TestBuffer;
using testing::upload_bf16;

// ---- GPU: through the nets' calls against the CPU references ------------------------------

// Runs the nets' calls with the path on auto (whatever ZINF_ATTENTION says) and requires that
// each one went to the tensor-core kernels.
class GpuTcAttention : public testing::BlasFixture {
 protected:
  void SetUp() override {
    testing::BlasFixture::SetUp();
    set_attention_path(AttentionPath::kAuto);
  }
  void TearDown() override { set_attention_path(std::nullopt); }
};

AttentionScratch scratch_of(const TestBuffer<float>& b) { return AttentionScratch{b.get(), b.size() * sizeof(float)}; }

using testing::expect_close_grad;
using testing::expect_close_out;

struct Dims {
  int B, T, C, NH;
};
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

// hs 64 at T off every tile and fragment size, hs 128, hs 32 at 3 heads, GPT-2's 12 heads.
const Dims kTcDims[] = {{2, 1, 128, 2},   {2, 17, 128, 2},  {2, 64, 128, 2}, {2, 65, 128, 2},  {2, 130, 128, 2},
                        {2, 300, 128, 2}, {1, 130, 256, 2}, {2, 17, 256, 2}, {3, 100, 96, 3}, {2, 129, 768, 12}};

TEST_F(GpuTcAttention, GptForwardAndBackwardMatchCpuReference) {
  for (const Dims& d : kTcDims) {
    SCOPED_TRACE(name(d));
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
    const std::size_t bytes = gemm_attention_scratch_bytes(d.B * d.T, d.T, d.NH, d.NH, d.C / d.NH);
    TestBuffer<float> scratch((bytes + 3) / 4), lse(n_lse), lse2(n_lse);
    TestBuffer<uint16_t> out(n_out), out2(n_out), dqkv(n_qkv), dqkv2(n_qkv);
    const long long calls = tc_attention_calls();
    Status st = gemm_attention_forward(*blas_, scratch_of(scratch), bf(out), lse.get(), bf(d_qkv), d.B, d.T, d.C, d.NH,
                                       nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(tc_attention_calls(), calls + 1) << "the forward did not take the tensor-core path";
    expect_close_out(download_bf16(out), want);
    EXPECT_TRUE(near_all(lse.download(), want_lse, 1e-5, 1e-6));
    st = gemm_attention_backward(*blas_, scratch_of(scratch), bf(dqkv), bf(d_dout), bf(d_qkv), bf(out), lse.get(), d.B,
                                 d.T, d.C, d.NH, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(tc_attention_calls(), calls + 2) << "the backward did not take the tensor-core path";
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

std::string gqa_name(const GqaShape& s) {
  return "B " + std::to_string(s.B) + " T " + std::to_string(s.T) + " NH " + std::to_string(s.NH) + " NKV " +
         std::to_string(s.NKV) + " hs " + std::to_string(s.hs);
}

TEST_F(GpuTcAttention, GqaForwardAndBackwardMatchCpuReference) {
  namespace cpu = model::kernels;
  const GqaShape shapes[] = {{2, 1, 4, 2, 64},   {2, 17, 4, 2, 64},  {2, 130, 4, 2, 64}, {2, 1, 4, 2, 128},
                             {2, 17, 4, 2, 128}, {2, 130, 4, 2, 128}, {2, 37, 4, 1, 64}, {2, 37, 4, 4, 64},
                             {3, 33, 6, 3, 80},  {1, 65, 2, 1, 16},  {1, 70, 8, 2, 32},  {1, 200, 6, 2, 96},
                             {1, 90, 2, 2, 48},  {1, 77, 2, 1, 112}};
  for (const GqaShape& s : shapes) {
    SCOPED_TRACE(gqa_name(s));
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
    const std::size_t bytes = gemm_attention_scratch_bytes(s.B * s.T, s.T, s.NH, s.NKV, s.hs);
    TestBuffer<float> scratch((bytes + 3) / 4), lse(nlse), lse2(nlse);
    TestBuffer<uint16_t> out(nq), out2(nq), dq(nq), dk(nkv), dv(nkv), dq2(nq), dk2(nkv), dv2(nkv);
    const long long calls = tc_attention_calls();
    Status st = gemm_gqa_attention_forward(*blas_, scratch_of(scratch), bf(out), lse.get(), bf(dq_in), bf(dk_in),
                                           bf(dv_in), s, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(tc_attention_calls(), calls + 1) << "the forward did not take the tensor-core path";
    expect_close_out(download_bf16(out), want);
    EXPECT_TRUE(near_all(lse.download(), want_lse, 1e-5, 1e-6));
    st = gemm_gqa_attention_backward(*blas_, scratch_of(scratch), bf(dq), bf(dk), bf(dv), bf(d_dout), bf(dq_in),
                                     bf(dk_in), bf(dv_in), bf(out), lse.get(), s, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(tc_attention_calls(), calls + 2) << "the backward did not take the tensor-core path";
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
    ASSERT_TRUE(gemm_gqa_attention_forward(*blas_, scratch_of(scratch), bf(out2), lse2.get(), bf(dq_in), bf(dk_in),
                                           bf(dv_in), s, nullptr)
                    .is_ok());
    st = gemm_gqa_attention_backward(*blas_, scratch_of(scratch), bf(dq2), bf(dk2), bf(dv2), bf(d_dout), bf(dq_in),
                                     bf(dk_in), bf(dv_in), bf(out), lse.get(), s, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(out.download(), out2.download());  // deterministic
    EXPECT_EQ(lse.download(), lse2.download());
    EXPECT_EQ(dq.download(), dq2.download());
    EXPECT_EQ(dk.download(), dk2.download());
    EXPECT_EQ(dv.download(), dv2.download());
  }
}

// Head sizes without a kernel instance (72) go to the GEMM path.
TEST_F(GpuTcAttention, UnsupportedHeadSizeTakesTheGemmPath) {
  const GqaShape s{1, 20, 2, 1, 72};
  const size_t nq = static_cast<size_t>(s.T) * s.NH * s.hs, nkv = static_cast<size_t>(s.T) * s.NKV * s.hs;
  TestBuffer<uint16_t> q = upload_bf16(rounded(randn(1, nq))), k = upload_bf16(rounded(randn(2, nkv)));
  TestBuffer<uint16_t> v = upload_bf16(rounded(randn(3, nkv))), out(nq);
  TestBuffer<float> lse(static_cast<size_t>(s.NH) * s.T);
  const std::size_t bytes = gemm_attention_scratch_bytes(s.T, s.T, s.NH, s.NKV, s.hs);
  TestBuffer<float> scratch((bytes + 3) / 4);
  const long long calls = tc_attention_calls();
  const Status st =
      gemm_gqa_attention_forward(*blas_, scratch_of(scratch), bf(out), lse.get(), bf(q), bf(k), bf(v), s, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(tc_attention_calls(), calls);
}

// One layer of the 1.3B GPT (B 4, T 2048, C 2048, NH 16, hs 128): the tensor-core path against
// the GEMM path on the same inputs, and both timed (printed; the median of 5 after a warm-up).
TEST_F(GpuTcAttention, Gpt13bLayerAgreesWithGemmAndIsTimed) {
  const Dims d{4, 2048, 2048, 16};
  const size_t n_qkv = static_cast<size_t>(d.B) * d.T * 3 * d.C;
  const size_t n_out = static_cast<size_t>(d.B) * d.T * d.C;
  const size_t n_lse = static_cast<size_t>(d.B) * d.NH * d.T;
  const std::vector<float> qkv = rounded(randn(1, n_qkv)), dout = rounded(randn(2, n_out));
  TestBuffer<uint16_t> d_qkv = upload_bf16(qkv), d_dout = upload_bf16(dout);
  TestBuffer<uint16_t> out(n_out), gemm_out(n_out), dqkv(n_qkv), gemm_dqkv(n_qkv);
  TestBuffer<float> lse(n_lse), gemm_lse(n_lse);
  const std::size_t bytes = gemm_attention_scratch_bytes(d.B * d.T, d.T, d.NH, d.NH, d.C / d.NH);
  TestBuffer<float> scratch((bytes + 3) / 4);
  auto fwd = [&](bf16* o, float* l) {
    return gemm_attention_forward(*blas_, scratch_of(scratch), o, l, bf(d_qkv), d.B, d.T, d.C, d.NH, nullptr);
  };
  auto bwd = [&](bf16* g, const bf16* o, const float* l) {
    return gemm_attention_backward(*blas_, scratch_of(scratch), g, bf(d_dout), bf(d_qkv), o, l, d.B, d.T, d.C, d.NH,
                                   nullptr);
  };
  set_attention_path(AttentionPath::kGemm);
  ASSERT_TRUE(fwd(bf(gemm_out), gemm_lse.get()).is_ok());
  ASSERT_TRUE(bwd(bf(gemm_dqkv), bf(gemm_out), gemm_lse.get()).is_ok());
  set_attention_path(AttentionPath::kAuto);
  const long long calls = tc_attention_calls();
  ASSERT_TRUE(fwd(bf(out), lse.get()).is_ok());
  ASSERT_TRUE(bwd(bf(dqkv), bf(out), lse.get()).is_ok());
  EXPECT_EQ(tc_attention_calls(), calls + 2);
  expect_close_out(download_bf16(out), download_bf16(gemm_out));
  EXPECT_TRUE(near_all(lse.download(), gemm_lse.download(), 1e-5, 1e-6));
  const std::vector<float> got = download_bf16(dqkv), want = download_bf16(gemm_dqkv);
  const double floor = 1e-2 * testing::max_abs(want);
  for (int which = 0; which < 3; which++) {
    SCOPED_TRACE("qkv"[which]);
    expect_close_grad(part(got, d, which), part(want, d, which), floor);
  }
  auto time_ms = [](auto&& run) {
    cudaEvent_t start = nullptr, stop = nullptr;
    EXPECT_EQ(cudaEventCreate(&start), cudaSuccess);
    EXPECT_EQ(cudaEventCreate(&stop), cudaSuccess);
    EXPECT_TRUE(run().is_ok());  // warm-up
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
  const float tf = time_ms([&] { return fwd(bf(out), lse.get()); });
  const float tb = time_ms([&] { return bwd(bf(dqkv), bf(out), lse.get()); });
  set_attention_path(AttentionPath::kGemm);
  const float gf = time_ms([&] { return fwd(bf(gemm_out), gemm_lse.get()); });
  const float gb = time_ms([&] { return bwd(bf(gemm_dqkv), bf(gemm_out), gemm_lse.get()); });
  std::printf("1.3B GPT attention layer, B 4 T 2048 C 2048 NH 16: tensor-core forward %.3f ms backward %.3f ms; "
              "GEMM forward %.3f ms backward %.3f ms\n",
              tf, tb, gf, gb);
  RecordProperty("tc_forward_ms", std::to_string(tf));
  RecordProperty("tc_backward_ms", std::to_string(tb));
  RecordProperty("gemm_forward_ms", std::to_string(gf));
  RecordProperty("gemm_backward_ms", std::to_string(gb));
}

}  // namespace
}  // namespace zinf::gpu
