// The GPU GPT kernels against the CPU references (model/kernels.h) with stated tolerances.
// The CPU sees the same bf16-rounded inputs as the GPU, so the tolerances measure only the
// kernels' arithmetic: sums in another order (relative 1e-5 or so) and the one rounding of a
// bf16 output (at most one bf16 ulp, 2^-8 relative; 2^-7 where the device's expf may differ
// from glibc's in the last fp32 bit before that rounding). Skipped without a GPU.
#include "gpu/kernels.h"

#include <gtest/gtest.h>

#include <cmath>
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
using testing::round_bf16;
using testing::rounded;
using testing::TestBuffer;
using testing::upload_bf16;

constexpr double kOneUlp = 1.0 / 256;  // one bf16 rounding
constexpr double kTwoUlp = 1.0 / 128;

std::vector<int32_t> tokens(uint64_t seed, size_t n, int V) {
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; i++) ids[i] = static_cast<int32_t>(model::detail::below(model::detail::hash3(seed, i, 7), V));
  return ids;
}

TEST(GpuKernels, EmbeddingForwardIsBitExact) {
  ZINF_REQUIRE_GPU();
  const int B = 3, T = 7, C = 40, V = 50, maxT = 9;
  const std::vector<float> wte = rounded(randn(1, V * C)), wpe = rounded(randn(2, maxT * C));
  std::vector<int32_t> ids = tokens(3, B * T, V);
  ids[0] = V - 1;
  ids[5] = ids[6];
  std::vector<float> want(B * T * C);
  model::kernels::encoder_forward(want.data(), ids.data(), wte.data(), wpe.data(), B, T, C);
  TestBuffer<uint16_t> d_wte = upload_bf16(wte), d_wpe = upload_bf16(wpe), out(B * T * C);
  TestBuffer<int32_t> d_ids(ids);
  ASSERT_TRUE(embedding_forward(bf(out), d_ids.get(), bf(d_wte), bf(d_wpe), B, T, C, V, nullptr).is_ok());
  EXPECT_TRUE(near_all(download_bf16(out), rounded(want), 0.0, 0.0));  // fp32 sum, one rounding, as the CPU

  // An id outside the vocabulary gives a NaN row, not a read out of bounds.
  ids[4] = V;
  d_ids.upload(ids);
  ASSERT_TRUE(embedding_forward(bf(out), d_ids.get(), bf(d_wte), bf(d_wpe), B, T, C, V, nullptr).is_ok());
  const std::vector<float> got = download_bf16(out);
  for (int c = 0; c < C; c++) EXPECT_TRUE(std::isnan(got[4 * C + c])) << c;
  EXPECT_FALSE(std::isnan(got[3 * C]));
}

TEST(GpuKernels, EmbeddingBackwardMatchesCpu) {
  ZINF_REQUIRE_GPU();
  const int B = 4, T = 9, C = 300, V = 20, maxT = 12;
  std::vector<int32_t> ids = tokens(4, B * T, V);
  for (int i = 0; i < 10; i++) ids[i] = 3;  // one token at many positions
  const std::vector<float> dout = randn(5, B * T * C);
  const std::vector<float> dwte0 = randn(6, V * C), dwpe0 = randn(7, maxT * C);
  std::vector<float> want_wte = dwte0, want_wpe = dwpe0;
  model::kernels::encoder_backward(want_wte.data(), want_wpe.data(), dout.data(), ids.data(), B, T, C);
  Result<EmbeddingBuckets> buckets = make_embedding_buckets(ids, V);
  ASSERT_TRUE(buckets.is_ok());
  TestBuffer<float> d_wte(dwte0), d_wpe(dwpe0), d_dout(dout);
  TestBuffer<int32_t> d_tok(buckets->tokens), d_starts(buckets->starts), d_pos(buckets->positions);
  ASSERT_TRUE(embedding_backward(d_wte.get(), d_wpe.get(), d_dout.get(), d_tok.get(), d_starts.get(), d_pos.get(),
                                 static_cast<int>(buckets->tokens.size()), B, T, C, nullptr)
                  .is_ok());
  EXPECT_TRUE(near_all(d_wte.download(), want_wte, 1e-5, 1e-6));  // fp32 sums in another order
  EXPECT_TRUE(near_all(d_wpe.download(), want_wpe, 1e-5, 1e-6));
}

TEST(GpuKernels, LayerNormForwardMatchesCpu) {
  ZINF_REQUIRE_GPU();
  const int N = 37, C = 200;  // C not a multiple of 32
  std::vector<float> inp = randn(1, N * C);
  for (float& x : inp) x = x + 3.0f;  // a mean far from 0 tests the two-pass variance
  inp = rounded(inp);
  const std::vector<float> w = rounded(randn(2, C, 0.5)), b = rounded(randn(3, C, 0.5));
  std::vector<float> want(N * C), want_mean(N), want_rstd(N);
  model::kernels::layernorm_forward(want.data(), want_mean.data(), want_rstd.data(), inp.data(), w.data(), b.data(), N, C);
  TestBuffer<uint16_t> d_inp = upload_bf16(inp), d_w = upload_bf16(w), d_b = upload_bf16(b), out(N * C);
  TestBuffer<float> mean(N), rstd(N);
  ASSERT_TRUE(layernorm_forward(bf(out), mean.get(), rstd.get(), bf(d_inp), bf(d_w), bf(d_b), N, C, nullptr).is_ok());
  EXPECT_TRUE(near_all(download_bf16(out), want, kOneUlp, 1e-5));
  EXPECT_TRUE(near_all(mean.download(), want_mean, 1e-5, 1e-6));
  EXPECT_TRUE(near_all(rstd.download(), want_rstd, 1e-5, 0.0));
}

TEST(GpuKernels, LayerNormBackwardMatchesCpu) {
  ZINF_REQUIRE_GPU();
  const int N = 150, C = 72;  // three row chunks of the parameter gradients' column sums
  const std::vector<float> inp = rounded(randn(1, N * C, 2.0)), w = rounded(randn(2, C)), b = rounded(randn(3, C));
  const std::vector<float> dout = rounded(randn(4, N * C));
  std::vector<float> y(N * C), mean(N), rstd(N);
  model::kernels::layernorm_forward(y.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
  const std::vector<float> dinp0 = randn(5, N * C), dw0 = randn(6, C), db0 = randn(7, C);
  std::vector<float> want_dinp = dinp0, want_dw = dw0, want_db = db0;
  model::kernels::layernorm_backward(want_dinp.data(), want_dw.data(), want_db.data(), dout.data(), inp.data(), w.data(),
                                     mean.data(), rstd.data(), N, C);
  TestBuffer<uint16_t> d_inp = upload_bf16(inp), d_w = upload_bf16(w), d_dout = upload_bf16(dout);
  TestBuffer<float> d_mean(mean), d_rstd(rstd), dinp(dinp0), dw(dw0), db(db0);
  TestBuffer<float> scratch(layernorm_backward_scratch_floats(N, C));
  ASSERT_TRUE(layernorm_backward(dinp.get(), dw.get(), db.get(), scratch.get(), bf(d_dout), bf(d_inp), bf(d_w),
                                 d_mean.get(), d_rstd.get(), N, C, nullptr)
                  .is_ok());
  EXPECT_TRUE(near_all(dinp.download(), want_dinp, 1e-4, 1e-5));
  EXPECT_TRUE(near_all(dw.download(), want_dw, 1e-4, 1e-5));
  EXPECT_TRUE(near_all(db.download(), want_db, 1e-4, 1e-5));
}

TEST(GpuKernels, GeluForwardAndBackwardMatchCpu) {
  ZINF_REQUIRE_GPU();
  const size_t n = 10007;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; i++) x[i] = -6.0f + 12.0f * static_cast<float>(i) / static_cast<float>(n);
  x = rounded(x);
  const std::vector<float> dout = rounded(randn(2, n));
  std::vector<float> want(n), want_d(n);
  model::kernels::gelu_forward(want.data(), x.data(), n);
  model::kernels::gelu_backward(want_d.data(), x.data(), dout.data(), n);
  TestBuffer<uint16_t> d_x = upload_bf16(x), out(n), d_dout = upload_bf16(dout);
  ASSERT_TRUE(gelu_forward(bf(out), bf(d_x), n, nullptr).is_ok());
  ASSERT_TRUE(gelu_backward(bf(d_dout), bf(d_x), bf(d_dout), n, nullptr).is_ok());  // in place, as the model runs it
  // Device expf vs glibc and FMA contraction move the fp32 value by a few ulp, which can move
  // the bf16 rounding by one ulp: 2^-7 relative, plus 1e-6 of the range for GELU's tiny tail.
  EXPECT_TRUE(near_all(download_bf16(out), want, kTwoUlp, 1e-6));
  EXPECT_TRUE(near_all(download_bf16(d_dout), want_d, kTwoUlp, 1e-6));
}

TEST(GpuKernels, ResidualAndCastsAreBitExact) {
  ZINF_REQUIRE_GPU();
  const size_t n = 5000;
  const std::vector<float> a = rounded(randn(1, n)), b = rounded(randn(2, n, 1e-3));
  std::vector<float> want(n);
  for (size_t i = 0; i < n; i++) want[i] = round_bf16(a[i] + b[i]);
  TestBuffer<uint16_t> d_a = upload_bf16(a), d_b = upload_bf16(b), out(n);
  ASSERT_TRUE(residual_forward(bf(out), bf(d_a), bf(d_b), n, nullptr).is_ok());
  EXPECT_TRUE(near_all(download_bf16(out), want, 0.0, 0.0));
  ASSERT_TRUE(residual_forward(bf(d_a), bf(d_a), bf(d_b), n, nullptr).is_ok());  // in place
  EXPECT_TRUE(near_all(download_bf16(d_a), want, 0.0, 0.0));

  std::vector<float> f = randn(3, n, 100.0);
  f[0] = 1e-40f;  // subnormal
  f[1] = -3.4e38f;
  f[2] = INFINITY;
  f[3] = 1.00390625f;  // a tie
  TestBuffer<float> d_f(f), back(n);
  TestBuffer<uint16_t> h(n);
  ASSERT_TRUE(cast_to_bf16(bf(h), d_f.get(), n, nullptr).is_ok());
  EXPECT_EQ(h.download(), testing::to_bits(f));
  ASSERT_TRUE(cast_to_f32(back.get(), bf(h), n, nullptr).is_ok());
  EXPECT_EQ(back.download(), rounded(f));
}

TEST(GpuKernels, ColumnSumsMatchDoubleSums) {
  ZINF_REQUIRE_GPU();
  const int N = 200, C = 70, ld = 80;
  const std::vector<float> x = rounded(randn(1, N * ld));
  const std::vector<float> out0 = randn(2, C);
  std::vector<float> want = out0;
  for (int c = 0; c < C; c++) {
    double s = 0.0;
    for (int r = 0; r < N; r++) s += x[static_cast<size_t>(r) * ld + c];
    want[c] = static_cast<float>(want[c] + s);
  }
  TestBuffer<float> d_x(x), out_f(out0), out_b(out0), scratch(column_sum_scratch_floats(N, C));
  TestBuffer<uint16_t> d_xb = upload_bf16(x);
  ASSERT_TRUE(column_sum_add(out_f.get(), scratch.get(), d_x.get(), N, C, ld, nullptr).is_ok());
  ASSERT_TRUE(column_sum_add(out_b.get(), scratch.get(), bf(d_xb), N, C, ld, nullptr).is_ok());
  EXPECT_TRUE(near_all(out_f.download(), want, 1e-5, 1e-6));
  EXPECT_TRUE(near_all(out_b.download(), want, 1e-5, 1e-6));
  EXPECT_EQ(column_sum_add(out_f.get(), scratch.get(), d_x.get(), N, C, C - 1, nullptr).code(),
            ErrorCode::kInvalidArgument);
}

TEST(GpuKernels, SoftmaxCrossEntropyMatchesCpu) {
  ZINF_REQUIRE_GPU();
  const int N = 13, V = 300, ld = logits_ld(V) + 8;
  const std::vector<float> padded = rounded(randn(1, static_cast<size_t>(N) * ld, 3.0));
  std::vector<int32_t> targets = tokens(2, N, V);
  targets[0] = 0;
  targets[1] = V - 1;
  std::vector<float> probs(static_cast<size_t>(N) * V), losses(N);
  for (int n = 0; n < N; n++) {
    for (int v = 0; v < V; v++) probs[static_cast<size_t>(n) * V + v] = padded[static_cast<size_t>(n) * ld + v];
  }
  model::kernels::softmax_xent_forward(probs.data(), losses.data(), targets.data(), N, V);
  const float dloss = 0.5f / N;
  model::kernels::softmax_xent_backward(probs.data(), targets.data(), dloss, N, V);

  TestBuffer<uint16_t> logits = upload_bf16(padded);
  TestBuffer<int32_t> d_t(targets);
  TestBuffer<float> d_losses(N), mean(1);
  // Loss only: the logits stay.
  ASSERT_TRUE(softmax_xent(bf(logits), d_losses.get(), d_t.get(), N, V, ld, dloss, false, nullptr).is_ok());
  EXPECT_TRUE(near_all(d_losses.download(), losses, 1e-5, 0.0));
  EXPECT_EQ(logits.download(), testing::to_bits(padded));
  // With the gradient, in place; the padding columns stay.
  ASSERT_TRUE(softmax_xent(bf(logits), d_losses.get(), d_t.get(), N, V, ld, dloss, true, nullptr).is_ok());
  EXPECT_TRUE(near_all(d_losses.download(), losses, 1e-5, 0.0));
  const std::vector<float> got_padded = download_bf16(logits);
  std::vector<float> got(static_cast<size_t>(N) * V);
  for (int n = 0; n < N; n++) {
    for (int v = 0; v < V; v++) got[static_cast<size_t>(n) * V + v] = got_padded[static_cast<size_t>(n) * ld + v];
    for (int v = V; v < ld; v++) {
      ASSERT_EQ(got_padded[static_cast<size_t>(n) * ld + v], padded[static_cast<size_t>(n) * ld + v]) << "padding";
    }
  }
  EXPECT_TRUE(near_all(got, probs, kTwoUlp, 1e-6));
  // The mean in double, as the CPU model sums its losses.
  ASSERT_TRUE(mean_loss(mean.get(), d_losses.get(), N, nullptr).is_ok());
  double sum = 0.0;
  for (float l : losses) sum += l;
  EXPECT_NEAR(mean.download()[0], sum / N, 1e-5 * std::fabs(sum / N));
  // A target outside the vocabulary gives a NaN loss.
  targets[2] = V;
  d_t.upload(targets);
  ASSERT_TRUE(softmax_xent(bf(logits), d_losses.get(), d_t.get(), N, V, ld, dloss, false, nullptr).is_ok());
  EXPECT_TRUE(std::isnan(d_losses.download()[2]));
}

TEST(GpuKernels, SizesAreCheckedBeforeLaunching) {
  // No device needed: every launcher rejects bad sizes before touching CUDA.
  EXPECT_EQ(embedding_forward(nullptr, nullptr, nullptr, nullptr, 0, 1, 1, 1, nullptr).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(layernorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 0, nullptr).code(),
            ErrorCode::kInvalidArgument);
  const Status st = softmax_xent(nullptr, nullptr, nullptr, 4, 100, 99, 1.0f, true, nullptr);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("softmax_xent N=4 V=100 ld=99"), std::string::npos) << st.message();
  EXPECT_TRUE(gelu_forward(nullptr, nullptr, 0, nullptr).is_ok());  // nothing to do
}

}  // namespace
}  // namespace zinf::gpu
