// Flash attention on the GPU against the CPU's direct-loop references
// (model/kernels.h attention_*_reference) on the same bf16-rounded qkv and dout, over every
// head-size class the presets use (16, 64, 80, 128) and T that are not multiples of the tiles.
// Tolerances: forward out within one bf16 rounding (2^-8 relative) plus 1e-4 of its largest
// value, lse within 1e-5 relative; backward dq, dk, dv each within 1e-2 relative L2 error and
// every element within 2^-6 relative plus 1e-2 of the part's largest value (the GPU's
// D = rowsum(dO * O) reads the bf16-rounded O, the reference its exact P). Skipped without a GPU.
#include "gpu/flash_attention.h"

#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "gpu/launch_geometry.h"
#include "gpu_test_util.h"
#include "kernel_test_util.h"
#include "model/kernels.h"

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

TEST(GpuAttention, ForwardMatchesCpuReference) {
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

TEST(GpuAttention, BackwardMatchesCpuReference) {
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

TEST(GpuAttention, UnsupportedHeadSizeIsAnErrorBeforeLaunch) {
  // No device needed.
  const Status st = attention_forward(nullptr, nullptr, nullptr, 1, 8, 512, 2, nullptr);
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
  EXPECT_NE(st.message().find("head size 256"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace zinf::gpu
