// cuBLASLt linear layers against the CPU matmul (model/kernels.h) on the same bf16-rounded
// inputs. Tolerances: a bf16 output is within one bf16 rounding (2^-8 relative) plus 1e-4 of
// the largest value (fp32 accumulation in cuBLASLt's order, split-K included); fp32 weight
// gradients within 1e-4 of the largest value. cuBLASLt's own GELU may be the tanh form or the
// erf form (they differ by at most 4.8e-4, derivatives by 8.7e-4), so GELU epilogues get 1e-3
// absolute on top. Skipped without a GPU.
#include "gpu/blas.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "gpu/launch_geometry.h"
#include "gpu_test_util.h"
#include "kernel_test_util.h"
#include "model/kernels.h"

namespace zinf::gpu {
namespace {

using testing::bf;
using testing::download_bf16;
using testing::max_abs;
using testing::near_all;
using testing::randn;
using testing::rounded;
using testing::TestBuffer;
using testing::upload_bf16;

constexpr double kOneUlp = 1.0 / 256;

struct Shape {
  int N, C, OC, ld_out;
};

// Unpacks rows of ld into rows of OC.
std::vector<float> unpad(const std::vector<float>& x, int N, int OC, int ld) {
  std::vector<float> out(static_cast<size_t>(N) * OC);
  for (int n = 0; n < N; n++) {
    for (int o = 0; o < OC; o++) out[static_cast<size_t>(n) * OC + o] = x[static_cast<size_t>(n) * ld + o];
  }
  return out;
}

class GpuBlasTest : public testing::BlasFixture {};

// Shapes: the model's (multiples of 8), odd ones (no 16-byte aligned rows), and the tied
// head's padded logits rows.
const Shape kShapes[] = {{70, 96, 136, 0}, {5, 13, 7, 0}, {33, 64, 50, 56}, {1, 8, 8, 0}};

TEST_F(GpuBlasTest, ForwardMatchesCpu) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "N " << s.N << " C " << s.C << " OC " << s.OC << " ld " << s.ld_out);
    const int ld = s.ld_out == 0 ? s.OC : s.ld_out;
    const std::vector<float> inp = rounded(randn(1, s.N * s.C)), w = rounded(randn(2, s.OC * s.C, 0.2));
    const std::vector<float> bias = rounded(randn(3, s.OC)), res = rounded(randn(4, static_cast<size_t>(s.N) * ld));
    TestBuffer<uint16_t> d_inp = upload_bf16(inp), d_w = upload_bf16(w), d_bias = upload_bf16(bias);
    TestBuffer<uint16_t> d_res = upload_bf16(res), out(static_cast<size_t>(s.N) * ld);
    for (bool with_bias : {false, true}) {
      for (bool with_res : {false, true}) {
        std::vector<float> want(static_cast<size_t>(s.N) * s.OC);
        model::kernels::matmul_forward(want.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, s.N, s.C,
                                       s.OC);
        std::vector<float> product(want.size());  // inp @ w^T alone
        model::kernels::matmul_forward(product.data(), inp.data(), w.data(), nullptr, s.N, s.C, s.OC);
        if (with_res) {
          for (int n = 0; n < s.N; n++) {
            for (int o = 0; o < s.OC; o++) want[static_cast<size_t>(n) * s.OC + o] += res[static_cast<size_t>(n) * ld + o];
          }
        }
        const Status st = linear_forward(*blas_, LinearShape{s.N, s.C, s.OC, s.ld_out}, bf(out), bf(d_inp), bf(d_w),
                                         with_bias ? bf(d_bias) : nullptr, with_res ? bf(d_res) : nullptr, nullptr);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        const std::vector<float> got = unpad(download_bf16(out), s.N, s.OC, ld);
        if (!with_res) {
          EXPECT_TRUE(near_all(got, want, kOneUlp, 1e-4)) << (with_bias ? "bias" : "");
          continue;
        }
        // With a residual the result is rounded to bf16 twice, an intermediate sum first (seen on
        // an H100: results a whole bf16 ulp from the exact sum, on the far side of it, and up to
        // 17 ulps where the sum is much smaller than its terms). So each element within half an
        // ulp of the result plus half an ulp of the largest intermediate, bounded by the sum of
        // the terms' magnitudes (product, bias, residual).
        const double floor = 1e-4 * testing::max_abs(want);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < got.size(); ++i) {
          const std::size_t n = i / static_cast<std::size_t>(s.OC), o = i % static_cast<std::size_t>(s.OC);
          const double terms = std::fabs(product[i]) + (with_bias ? std::fabs(bias[o]) : 0.0) +
                               std::fabs(res[n * static_cast<std::size_t>(ld) + o]);
          const double tol = kOneUlp * (terms + std::fabs(want[i])) + floor;
          if (std::fabs(static_cast<double>(got[i]) - want[i]) > tol && bad++ < 5) {
            ADD_FAILURE() << (with_bias ? "bias " : "") << "residual: element " << i << " got " << got[i] << " want "
                          << want[i] << " (product " << product[i] << ")";
          }
        }
        EXPECT_EQ(bad, 0u) << (with_bias ? "bias " : "") << "residual";
      }
    }
  }
}

TEST_F(GpuBlasTest, ForwardGeluEpilogueMatchesCpu) {
  const int N = 70, C = 96, OC = 384;
  const std::vector<float> inp = rounded(randn(1, N * C)), w = rounded(randn(2, OC * C, 0.15)), bias = rounded(randn(3, OC));
  std::vector<float> pre(N * OC), act(N * OC);
  model::kernels::matmul_forward(pre.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  model::kernels::gelu_forward(act.data(), pre.data(), pre.size());
  TestBuffer<uint16_t> d_inp = upload_bf16(inp), d_w = upload_bf16(w), d_bias = upload_bf16(bias);
  TestBuffer<uint16_t> out(N * OC), d_pre(N * OC);
  const Status st = linear_forward_gelu(*blas_, LinearShape{N, C, OC}, bf(out), bf(d_pre), bf(d_inp), bf(d_w),
                                        bf(d_bias), nullptr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_TRUE(near_all(download_bf16(d_pre), pre, kOneUlp, 1e-4));
  const double abs_frac = 1e-3 / max_abs(act) + 1e-4;  // 1e-3 absolute, plus the sums' order
  EXPECT_TRUE(near_all(download_bf16(out), act, kOneUlp, abs_frac));
}

TEST_F(GpuBlasTest, BackwardMatchesCpu) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "N " << s.N << " C " << s.C << " OC " << s.OC << " ld " << s.ld_out);
    const int ld = s.ld_out == 0 ? s.OC : s.ld_out;
    const std::vector<float> inp = rounded(randn(1, s.N * s.C)), w = rounded(randn(2, s.OC * s.C, 0.2));
    const std::vector<float> dout_padded = rounded(randn(3, static_cast<size_t>(s.N) * ld));
    const std::vector<float> dout = unpad(dout_padded, s.N, s.OC, ld);
    const std::vector<float> dw0 = randn(4, s.OC * s.C);
    std::vector<float> want_dinp(s.N * s.C), want_dw = dw0;
    model::kernels::matmul_backward(want_dinp.data(), want_dw.data(), nullptr, dout.data(), inp.data(), w.data(), s.N,
                                    s.C, s.OC);
    TestBuffer<uint16_t> d_inp = upload_bf16(inp), d_w = upload_bf16(w), d_dout = upload_bf16(dout_padded);
    TestBuffer<uint16_t> dinp(s.N * s.C);
    TestBuffer<float> dw(dw0);
    const LinearShape shape{s.N, s.C, s.OC, s.ld_out};
    Status st = linear_backward_input(*blas_, shape, bf(dinp), bf(d_dout), bf(d_w), nullptr, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    st = linear_backward_weight(*blas_, shape, dw.get(), bf(d_dout), bf(d_inp), nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_TRUE(near_all(download_bf16(dinp), want_dinp, kOneUlp, 1e-4));
    EXPECT_TRUE(near_all(dw.download(), want_dw, 1e-5, 1e-4));  // accumulated onto dw0
  }
}

TEST_F(GpuBlasTest, BackwardDGeluEpilogueMatchesCpu) {
  const int N = 70, C = 384, OC = 96;  // c_proj of the MLP: dinp (N, 4C) times gelu'(pre)
  const std::vector<float> w = rounded(randn(2, OC * C, 0.1)), dout = rounded(randn(3, N * OC));
  const std::vector<float> pre = rounded(randn(4, N * C, 2.0));
  std::vector<float> dpre(N * C), want(N * C);  // dpre = dout @ w in double, then * gelu'(pre)
  for (int n = 0; n < N; n++) {
    for (int c = 0; c < C; c++) {
      double acc = 0.0;
      for (int o = 0; o < OC; o++) acc += static_cast<double>(dout[n * OC + o]) * w[static_cast<size_t>(o) * C + c];
      dpre[static_cast<size_t>(n) * C + c] = static_cast<float>(acc);
    }
  }
  model::kernels::gelu_backward(want.data(), pre.data(), dpre.data(), want.size());
  TestBuffer<uint16_t> d_w = upload_bf16(w), d_dout = upload_bf16(dout), d_pre = upload_bf16(pre), dinp(N * C);
  const Status st = linear_backward_input(*blas_, LinearShape{N, C, OC}, bf(dinp), bf(d_dout), bf(d_w), bf(d_pre), nullptr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  // gelu' of the two GELU forms differs by up to 8.7e-4, times |dout @ w| <= max|dpre|.
  const double abs_frac = 1e-3 * max_abs(dpre) / max_abs(want) + 1e-4;
  EXPECT_TRUE(near_all(download_bf16(dinp), want, 1.0 / 128, abs_frac)) << "max |dpre| " << max_abs(dpre);
}

TEST_F(GpuBlasTest, SameShapeGivesTheSameBits) {
  const Shape s{64, 128, 256, 0};
  const std::vector<float> inp = rounded(randn(1, s.N * s.C)), w = rounded(randn(2, s.OC * s.C));
  TestBuffer<uint16_t> d_inp = upload_bf16(inp), d_w = upload_bf16(w), a(s.N * s.OC), b(s.N * s.OC);
  const LinearShape shape{s.N, s.C, s.OC};
  ASSERT_TRUE(linear_forward(*blas_, shape, bf(a), bf(d_inp), bf(d_w), nullptr, nullptr, nullptr).is_ok());
  ASSERT_TRUE(linear_forward(*blas_, shape, bf(b), bf(d_inp), bf(d_w), nullptr, nullptr, nullptr).is_ok());
  EXPECT_EQ(a.download(), b.download());
}

TEST_F(GpuBlasTest, ErrorsNameTheProduct) {
  TestBuffer<uint16_t> x(64);
  const Status st = linear_forward(*blas_, LinearShape{4, 8, 16, 8}, bf(x), bf(x), bf(x), nullptr, nullptr, nullptr);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("linear_forward"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace zinf::gpu
