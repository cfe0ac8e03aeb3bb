// The fused row kernels (fused_kernels.h) against the unfused scalar kernels they replace in the
// models, and fast_exp against std::exp.
//
// Tolerances: the fused kernels differ from the unfused ones in two places only, fast_exp for
// std::exp (bounded below at 2 ulp) and eight-lane row sums for in-order ones. Everything the
// fusion itself moves (the bias add, the residual add, the column sums of the bias gradient) is
// compared bit for bit. Shapes are odd on purpose (tails of the 8-lane loops and of the
// 64-column chunks) and large enough that parallel_for splits them over threads.
#include "model/fused_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "model/bf16.h"
#include "model/kernels.h"
#include "model/llama_kernels.h"
#include "model/vec_math.h"
#include "model_test_util.h"

namespace zinf::model::kernels {
namespace {

std::vector<float> randn(uint64_t seed, size_t n, double scale = 1.0) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = static_cast<float>(scale * testing::test_normal(seed, i));
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// max |a - b| / max(1, |b|) over the elements.
double max_rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); i++) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]) / std::max(1.0, std::fabs(static_cast<double>(b[i])));
    worst = std::max(worst, d);
  }
  return worst;
}

// The serial loop matmul_backward used for dbias: every column summed in row order.
void serial_column_sums(std::vector<float>& dbias, const std::vector<float>& dout, int N, int OC) {
  for (int n = 0; n < N; n++) {
    for (int o = 0; o < OC; o++) dbias[o] += dout[static_cast<size_t>(n) * OC + o];
  }
}

// The scalar reference of every bf16 copy: detail::to_bf16 element by element.
std::vector<uint16_t> rounded(const std::vector<float>& v) {
  std::vector<uint16_t> r(v.size());
  for (size_t i = 0; i < v.size(); i++) r[i] = model::detail::to_bf16(v[i]);
  return r;
}

// to_bf16 against the definition: the nearest bf16 value, ties to the even significand, NaN kept.
TEST(Bf16RoundingTest, NearestEvenInfinityAndNan) {
  using model::detail::from_bf16;
  using model::detail::to_bf16;
  EXPECT_EQ(to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(to_bf16(1.0f + 0x1p-8f), 0x3f80);            // a tie: down to the even 1.0
  EXPECT_EQ(to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);        // a tie: up to the even 1 + 2^-6
  EXPECT_EQ(to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // above the tie: up
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x7f7fffffu)), 0x7f80);  // FLT_MAX rounds to infinity
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0xff800000u)), 0xff80);  // -infinity stays
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x00000001u)), 0x0000);  // the smallest subnormal: to zero
  const uint16_t nan = to_bf16(std::bit_cast<float>(0x7f800001u));  // a signalling NaN with low bits only
  EXPECT_TRUE(std::isnan(from_bf16(nan))) << std::hex << nan;
  // Exhaustively over one binade's neighbourhood of 1.0: the nearest of the two bf16 neighbours.
  for (uint32_t u = 0x3f800000u; u < 0x3f810000u; u++) {
    const float f = std::bit_cast<float>(u);
    const uint16_t r = to_bf16(f), lo = static_cast<uint16_t>(u >> 16);
    const double below = f - from_bf16(lo), above = from_bf16(static_cast<uint16_t>(lo + 1)) - f;
    const uint16_t want = below < above ? lo : above < below ? static_cast<uint16_t>(lo + 1)
                                                             : static_cast<uint16_t>((lo & 1) != 0 ? lo + 1 : lo);
    ASSERT_EQ(r, want) << std::hex << u;
  }
}

// A kernel's bf16 copy: its fp32 output unchanged (bit for bit the call without the copy) and the
// copy the scalar rounding of that output, bit for bit.
TEST(FusedKernelsTest, Bf16CopiesAreTheRoundedOutputsBitForBit) {
  const int N = 67, C = 203, OC = 811;
  {
    const std::vector<float> bias = randn(2, OC);
    std::vector<float> pre = randn(1, static_cast<size_t>(N) * OC, 3.0), pre2 = pre;
    std::vector<float> out(pre.size()), out2(pre.size());
    std::vector<uint16_t> out_bf16(pre.size());
    bias_gelu_forward(pre.data(), out.data(), bias.data(), N, OC, out_bf16.data());
    bias_gelu_forward(pre2.data(), out2.data(), bias.data(), N, OC);
    EXPECT_TRUE(same_bits(pre, pre2));
    EXPECT_TRUE(same_bits(out, out2));
    EXPECT_EQ(out_bf16, rounded(out));
  }
  {
    const std::vector<float> pre = randn(9, static_cast<size_t>(N) * OC, 3.0), db0 = randn(10, OC);
    std::vector<float> d = randn(11, pre.size()), d2 = d, db = db0, db2 = db0;
    std::vector<uint16_t> d_bf16(d.size());
    gelu_backward_bias_grad(d.data(), db.data(), pre.data(), N, OC, d_bf16.data());
    gelu_backward_bias_grad(d2.data(), db2.data(), pre.data(), N, OC);
    EXPECT_TRUE(same_bits(d, d2));
    EXPECT_TRUE(same_bits(db, db2));
    EXPECT_EQ(d_bf16, rounded(d));
  }
  const std::vector<float> w = randn(3, C), b = randn(4, C), r = randn(5, static_cast<size_t>(N) * C);
  {
    std::vector<float> x = randn(6, static_cast<size_t>(N) * C, 2.0), x2 = x;
    std::vector<float> out(x.size()), out2(x.size()), mean(N), rstd(N), mean2(N), rstd2(N);
    std::vector<uint16_t> out_bf16(x.size());
    residual_layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), r.data(), w.data(), b.data(), N, C,
                               out_bf16.data());
    residual_layernorm_forward(out2.data(), mean2.data(), rstd2.data(), x2.data(), r.data(), w.data(), b.data(), N, C);
    EXPECT_TRUE(same_bits(out, out2));
    EXPECT_TRUE(same_bits(x, x2));
    EXPECT_TRUE(same_bits(rstd, rstd2));
    EXPECT_EQ(out_bf16, rounded(out));
  }
  {
    std::vector<float> x = randn(7, static_cast<size_t>(N) * C, 2.0), x2 = x;
    std::vector<float> out(x.size()), out2(x.size()), rstd(N), rstd2(N);
    std::vector<uint16_t> out_bf16(x.size());
    residual_rmsnorm_forward(out.data(), rstd.data(), x.data(), r.data(), w.data(), 1e-6f, N, C, out_bf16.data());
    residual_rmsnorm_forward(out2.data(), rstd2.data(), x2.data(), r.data(), w.data(), 1e-6f, N, C);
    EXPECT_TRUE(same_bits(out, out2));
    EXPECT_TRUE(same_bits(rstd, rstd2));
    EXPECT_EQ(out_bf16, rounded(out));
  }
  {
    const std::vector<float> src = randn(8, static_cast<size_t>(N) * C, 100.0);
    std::vector<uint16_t> dst(src.size());
    round_to_bf16(dst.data(), src.data(), N, C);
    EXPECT_EQ(dst, rounded(src));
  }
}

TEST(FusedKernelsTest, FastExpWithinTwoUlpOfExp) {
  // Every 1/1024 over the range softmax and GELU use; exp in double is the truth.
  double worst_ulp = 0.0;
  for (int k = -87 * 1024; k <= 88 * 1024; k++) {
    const float x = static_cast<float>(k) / 1024.0f;
    const double truth = std::exp(static_cast<double>(x));
    const float got = detail::fast_exp(x);
    const double ulp = std::ldexp(1.0, std::ilogb(truth) - 23);
    worst_ulp = std::max(worst_ulp, std::fabs(got - truth) / ulp);
  }
  std::printf("fast_exp: worst error %.2f ulp on [-87, 88]\n", worst_ulp);
  EXPECT_LE(worst_ulp, 2.0);
  // Clamped outside: finite, no NaN, and 0 * huge or 1 - 2 / (huge + 1) stay well defined.
  EXPECT_GT(detail::fast_exp(-1000.0f), 0.0f);
  EXPECT_TRUE(std::isfinite(detail::fast_exp(1000.0f)));
}

TEST(FusedKernelsTest, BiasGeluForwardMatchesMatmulBiasThenGelu) {
  const int N = 97, C = 40, OC = 203;
  std::vector<float> inp = randn(1, N * C, 0.5), w = randn(2, OC * C, 0.5), b = randn(3, OC);
  // The model's old order: the bias inside the product, then GELU.
  std::vector<float> pre_ref(N * OC), out_ref(N * OC);
  matmul_forward(pre_ref.data(), inp.data(), w.data(), b.data(), N, C, OC);
  gelu_forward(out_ref.data(), pre_ref.data(), pre_ref.size());
  // The fused order: the product alone, then one pass adds the bias and applies GELU.
  std::vector<float> pre(N * OC), out(N * OC);
  matmul_forward(pre.data(), inp.data(), w.data(), nullptr, N, C, OC);
  std::vector<float> product = pre;
  bias_gelu_forward(pre.data(), out.data(), b.data(), N, OC);
  // pre must hold product + bias exactly (GELU's backward reads it) ...
  for (size_t i = 0; i < pre.size(); i++) ASSERT_EQ(pre[i], product[i] + b[i % OC]) << i;
  // ... which the unfused path computes inside sgemm in another order: a few ulps.
  EXPECT_LT(max_rel_err(pre, pre_ref), 1e-5);
  // GELU of the same pre through std::exp: fast_exp's 2 ulp in tanh, times |x| / 2.
  std::vector<float> out_same(N * OC);
  gelu_forward(out_same.data(), pre.data(), pre.size());
  const double err = max_rel_err(out, out_same);
  std::printf("bias+GELU: max error vs unfused GELU %.3g (relative to max(1, |y|))\n", err);
  EXPECT_LT(err, 2e-6);  // observed 2.5e-7
  EXPECT_LT(max_rel_err(out, out_ref), 1e-5);
}

TEST(FusedKernelsTest, GeluBackwardBiasGradMatchesGeluBackwardThenColumnSums) {
  for (auto [N, OC] : {std::pair{513, 203}, std::pair{3, 9}}) {  // split over threads, and not
    std::vector<float> pre = randn(4, N * OC, 2.0), dout = randn(5, N * OC), db0 = randn(6, OC);
    std::vector<float> dref(N * OC), dbias_ref = db0;
    gelu_backward(dref.data(), pre.data(), dout.data(), dref.size());
    serial_column_sums(dbias_ref, dref, N, OC);

    std::vector<float> d = dout, dbias = db0;
    gelu_backward_bias_grad(d.data(), dbias.data(), pre.data(), N, OC);
    const double err = max_rel_err(d, dref);
    std::printf("GELU'+dbias %dx%d: max error of d(pre) vs unfused %.3g\n", N, OC, err);
    EXPECT_LT(err, 5e-6);  // observed 8.5e-7: GELU' has the tanh twice, times |dout| up to ~4
    // dbias accumulates onto its old value, the columns of this d(pre) in row order: exactly.
    std::vector<float> dbias_of_d = db0;
    serial_column_sums(dbias_of_d, d, N, OC);
    EXPECT_TRUE(same_bits(dbias, dbias_of_d)) << N << "x" << OC;
    EXPECT_LT(max_rel_err(dbias, dbias_ref), 1e-5);
  }
}

TEST(FusedKernelsTest, BiasGradIsTheSerialLoopBitForBit) {
  for (auto [N, OC] : {std::pair{513, 203}, std::pair{2048, 64}, std::pair{7, 5}}) {
    std::vector<float> dout = randn(7, static_cast<size_t>(N) * OC, 3.0), db = randn(8, OC);
    std::vector<float> ref = db;
    serial_column_sums(ref, dout, N, OC);
    bias_grad(db.data(), dout.data(), N, OC);
    EXPECT_TRUE(same_bits(db, ref)) << N << "x" << OC;
  }
  // matmul_backward's dbias is that loop too.
  const int N = 300, C = 11, OC = 230;
  std::vector<float> inp = randn(9, N * C), w = randn(10, OC * C), dout = randn(11, N * OC);
  std::vector<float> dinp(N * C), dw(OC * C, 0.0f), db = randn(12, OC), ref = db;
  matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
  serial_column_sums(ref, dout, N, OC);
  EXPECT_TRUE(same_bits(db, ref));
}

TEST(FusedKernelsTest, ResidualLayerNormMatchesResidualAddThenLayerNorm) {
  const int N = 301, C = 203;
  std::vector<float> x0 = randn(13, N * C, 2.0), r = randn(14, N * C), w = randn(15, C), b = randn(16, C);
  for (float& v : x0) v += 1.5f;  // a mean far from zero: the two-pass variance matters
  std::vector<float> x_ref = x0, out_ref(N * C), mean_ref(N), rstd_ref(N);
  residual_add(x_ref.data(), r.data(), x_ref.size());
  layernorm_forward(out_ref.data(), mean_ref.data(), rstd_ref.data(), x_ref.data(), w.data(), b.data(), N, C);

  std::vector<float> x = x0, out(N * C), mean(N), rstd(N);
  residual_layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), r.data(), w.data(), b.data(), N, C);
  EXPECT_TRUE(same_bits(x, x_ref));  // the stream holds exactly x + r
  // Eight-lane against in-order sums over C = 203: a few ulps of the row's scale.
  const double err = std::max({max_rel_err(out, out_ref), max_rel_err(mean, mean_ref), max_rel_err(rstd, rstd_ref)});
  std::printf("residual+LayerNorm: max error vs unfused %.3g\n", err);
  EXPECT_LT(err, 1e-5);  // observed 1.4e-6 on outputs up to ~10

  // Without a residual: x untouched, and the same bits as the fused call gave on x + r.
  std::vector<float> out2(N * C), mean2(N), rstd2(N), x2 = x_ref;
  residual_layernorm_forward(out2.data(), mean2.data(), rstd2.data(), x2.data(), nullptr, w.data(), b.data(), N, C);
  EXPECT_TRUE(same_bits(x2, x_ref));
  EXPECT_TRUE(same_bits(out2, out));
  EXPECT_TRUE(same_bits(mean2, mean));
  EXPECT_TRUE(same_bits(rstd2, rstd));
}

TEST(FusedKernelsTest, ResidualRmsNormMatchesResidualAddThenRmsNorm) {
  const int N = 301, C = 203;
  const float eps = 1e-6f;
  std::vector<float> x0 = randn(17, N * C, 2.0), r = randn(18, N * C), w = randn(19, C);
  std::vector<float> x_ref = x0, out_ref(N * C), rstd_ref(N);
  residual_add(x_ref.data(), r.data(), x_ref.size());
  rmsnorm_forward(out_ref.data(), rstd_ref.data(), x_ref.data(), w.data(), eps, N, C);

  std::vector<float> x = x0, out(N * C), rstd(N);
  residual_rmsnorm_forward(out.data(), rstd.data(), x.data(), r.data(), w.data(), eps, N, C);
  EXPECT_TRUE(same_bits(x, x_ref));
  const double err = std::max(max_rel_err(out, out_ref), max_rel_err(rstd, rstd_ref));
  std::printf("residual+RMSNorm: max error vs unfused %.3g\n", err);
  EXPECT_LT(err, 1e-5);  // observed 4.9e-7

  std::vector<float> out2(N * C), rstd2(N), x2 = x_ref;
  residual_rmsnorm_forward(out2.data(), rstd2.data(), x2.data(), nullptr, w.data(), eps, N, C);
  EXPECT_TRUE(same_bits(x2, x_ref));
  EXPECT_TRUE(same_bits(out2, out));
  EXPECT_TRUE(same_bits(rstd2, rstd));
}

TEST(FusedKernelsTest, SummedRmsNormBackwardMatchesResidualAddsThenRmsNormBackward) {
  // Llama's backward before: d(norm output) summed into the first part by residual_add (q + k,
  // then + v; gate + up), then rmsnorm_backward. The fused kernel forms the same sums in its one
  // pass: dinp must be those bits. dweight is summed in chunks of kSummedRmsNormRows rows: the
  // bits of that order written out here, and close to the serial order's. Shapes: split over
  // threads with a partial last chunk, a single short chunk.
  const float eps = 1e-6f;
  for (auto [N, C] : {std::pair{301, 203}, std::pair{5, 7}}) {
    const size_t NC = static_cast<size_t>(N) * C;
    std::vector<float> x = randn(27, NC, 2.0), w = randn(28, C), out(NC), rstd(N);
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), eps, N, C);
    const std::vector<float> d0 = randn(29, NC), d1 = randn(30, NC, 3.0), d2 = randn(31, NC, 0.5);
    const std::vector<float> dinp0 = randn(32, NC), dw0 = randn(33, C, 0.1);  // both accumulate
    for (bool three : {false, true}) {
      const std::string what = std::to_string(N) + "x" + std::to_string(C) + (three ? " q+k+v" : " gate+up");
      std::vector<float> sum = d0, dinp_ref = dinp0, dw_ref = dw0;
      residual_add(sum.data(), d1.data(), NC);
      if (three) residual_add(sum.data(), d2.data(), NC);
      rmsnorm_backward(dinp_ref.data(), dw_ref.data(), sum.data(), x.data(), w.data(), rstd.data(), N, C);

      std::vector<float> dinp = dinp0, dw = dw0, p0 = d0, p1 = d1, p2 = d2;
      summed_rmsnorm_backward(dinp.data(), dw.data(), p0.data(), p1.data(), three ? p2.data() : nullptr, x.data(),
                              w.data(), rstd.data(), N, C);
      EXPECT_TRUE(same_bits(dinp, dinp_ref)) << what;
      EXPECT_TRUE(same_bits(p0, d0) && same_bits(p1, d1) && same_bits(p2, d2)) << what;  // only read

      // dweight: each chunk's terms in row order from zero, then dweight += each chunk in order.
      std::vector<float> dw_chunked = dw0;
      for (int b = 0; b < N; b += kSummedRmsNormRows) {
        std::vector<float> part(C, 0.0f);
        for (int n = b; n < std::min(N, b + kSummedRmsNormRows); n++) {
          for (int i = 0; i < C; i++) part[i] += (x[n * C + i] * rstd[n]) * sum[n * C + i];
        }
        for (int i = 0; i < C; i++) dw_chunked[i] += part[i];
      }
      EXPECT_TRUE(same_bits(dw, dw_chunked)) << what;
      // Against the serial order: sums of N terms of size ~3, relative to the largest |dweight|.
      double worst = 0.0, largest = 0.0;
      for (int i = 0; i < C; i++) {
        worst = std::max(worst, std::fabs(static_cast<double>(dw[i]) - dw_ref[i]));
        largest = std::max(largest, std::fabs(static_cast<double>(dw_ref[i])));
      }
      std::printf("summed RMSNorm backward %s: dweight vs unfused %.3g of the largest\n", what.c_str(),
                  worst / largest);
      EXPECT_LT(worst, 1e-5 * largest) << what;
    }
  }
}

TEST(FusedKernelsTest, SoftmaxXentFusedMatchesForwardThenBackward) {
  // GPT-2's vocabulary and a small odd one; logits spread like a trained model's.
  for (auto [N, V] : {std::pair{7, 50257}, std::pair{301, 259}}) {
    std::vector<float> logits = randn(20, static_cast<size_t>(N) * V, 4.0);
    std::vector<int32_t> tgt(N);
    for (int n = 0; n < N; n++) tgt[n] = static_cast<int32_t>((n * 7919 + 13) % V);
    tgt[0] = V - 1;
    const float dloss = 0.75f / static_cast<float>(N);

    std::vector<float> ref = logits, loss_ref(N);
    softmax_xent_forward(ref.data(), loss_ref.data(), tgt.data(), N, V);
    softmax_xent_backward(ref.data(), tgt.data(), dloss, N, V);

    std::vector<float> d = logits, loss(N);
    softmax_xent_fused(d.data(), loss.data(), tgt.data(), dloss, N, V);
    // Losses of ~10: fast_exp's ulps inside a double sum, then one log: ~1e-7 relative.
    EXPECT_LT(max_rel_err(loss, loss_ref), 1e-6) << V;
    // dlogits = (p - onehot) * dloss: p to a few ulps of 1, so absolute dloss * 1e-6.
    double worst = 0.0;
    for (size_t i = 0; i < d.size(); i++) worst = std::max(worst, std::fabs(static_cast<double>(d[i]) - ref[i]));
    std::printf("softmax+xent V=%d: max |dlogits - unfused| = %.3g x dloss\n", V, worst / dloss);
    EXPECT_LT(worst, 1e-6 * dloss) << V;  // observed 9e-8 x dloss

    // Evaluation's loss-only pass: the same losses bit for bit, the logits untouched.
    std::vector<float> kept = logits, loss_eval(N);
    softmax_xent_loss(kept.data(), loss_eval.data(), tgt.data(), N, V);
    EXPECT_TRUE(same_bits(loss_eval, loss)) << V;
    EXPECT_TRUE(same_bits(kept, logits)) << V;
  }
}

TEST(FusedKernelsTest, NormBackwardWeightGradsAreTheSerialRowOrderSums) {
  // layernorm_backward and rmsnorm_backward sum dweight (and dbias) over rows with columns split
  // over threads: the serial loop's bits.
  const int N = 300, C = 203;
  std::vector<float> x = randn(21, N * C, 2.0), dout = randn(22, N * C), w = randn(23, C);
  std::vector<float> out(N * C), mean(N), rstd(N), b(C, 0.0f);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  std::vector<float> dinp(N * C, 0.0f), dw = randn(24, C), db = randn(25, C);
  std::vector<float> dw_ref = dw, db_ref = db;
  layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(), N,
                     C);
  for (int n = 0; n < N; n++) {
    for (int i = 0; i < C; i++) {
      const float d = dout[n * C + i];
      db_ref[i] += d;
      dw_ref[i] += ((x[n * C + i] - mean[n]) * rstd[n]) * d;
    }
  }
  EXPECT_TRUE(same_bits(dw, dw_ref));
  EXPECT_TRUE(same_bits(db, db_ref));

  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), 1e-6f, N, C);
  std::vector<float> dw2 = randn(26, C), dw2_ref = dw2;
  rmsnorm_backward(dinp.data(), dw2.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
  for (int n = 0; n < N; n++) {
    for (int i = 0; i < C; i++) dw2_ref[i] += (x[n * C + i] * rstd[n]) * dout[n * C + i];
  }
  EXPECT_TRUE(same_bits(dw2, dw2_ref));
}

}  // namespace
}  // namespace zinf::model::kernels
