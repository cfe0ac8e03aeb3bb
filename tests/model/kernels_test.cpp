// The model's fast kernels (OpenBLAS, blocked sgemm attention) against plain scalar references.
#include "model/kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "model/attention_core.h"

#include "model_test_util.h"

namespace zinf::model::kernels {
namespace {

std::vector<float> randn(uint64_t seed, size_t n, double scale = 1.0) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = static_cast<float>(scale * testing::test_normal(seed, i));
  return v;
}

// |a - b| within rel * max|b| (sums of fp32 products in a different order).
void expect_close(const std::vector<float>& a, const std::vector<float>& b, double rel) {
  ASSERT_EQ(a.size(), b.size());
  double maxb = 0.0;
  for (float x : b) maxb = std::max(maxb, static_cast<double>(std::fabs(x)));
  for (size_t i = 0; i < a.size(); i++) ASSERT_NEAR(a[i], b[i], rel * maxb) << i;
}

TEST(KernelsTest, MatmulForwardMatchesReference) {
  const int N = 37, C = 48, OC = 29;
  std::vector<float> inp = randn(1, N * C), w = randn(2, OC * C), b = randn(3, OC);
  for (const float* bias : std::vector<const float*>{b.data(), nullptr}) {
    std::vector<float> fast(N * OC), ref(N * OC);
    matmul_forward(fast.data(), inp.data(), w.data(), bias, N, C, OC);
    matmul_forward_reference(ref.data(), inp.data(), w.data(), bias, N, C, OC);
    expect_close(fast, ref, 1e-5);
  }
}

TEST(KernelsTest, MatmulBackwardMatchesLoops) {
  const int N = 23, C = 17, OC = 31;
  std::vector<float> inp = randn(1, N * C), w = randn(2, OC * C), dout = randn(3, N * OC);
  std::vector<float> dinp(N * C), dw = randn(4, OC * C), db = randn(5, OC);
  std::vector<float> dw_ref = dw, db_ref = db, dinp_ref(N * C, 0.0f);
  matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
  for (int n = 0; n < N; n++) {
    for (int o = 0; o < OC; o++) {
      const float d = dout[n * OC + o];
      db_ref[o] += d;
      for (int i = 0; i < C; i++) {
        dinp_ref[n * C + i] += d * w[o * C + i];
        dw_ref[o * C + i] += d * inp[n * C + i];
      }
    }
  }
  expect_close(dinp, dinp_ref, 1e-5);
  expect_close(dw, dw_ref, 1e-5);  // accumulated onto the old values
  expect_close(db, db_ref, 1e-6);
}

TEST(KernelsTest, AttentionForwardMatchesDirectLoops) {
  for (auto [B, T, C, NH] :
       {std::tuple{2, 13, 24, 3}, std::tuple{1, 1, 8, 2}, std::tuple{1, 64, 64, 4}}) {
    std::vector<float> qkv = randn(7, static_cast<size_t>(B) * T * 3 * C);
    std::vector<float> out(static_cast<size_t>(B) * T * C), ref(out.size());
    std::vector<float> lse(static_cast<size_t>(B) * NH * T);
    std::vector<float> scratch(attention_scratch_floats());
    attention_forward(out.data(), lse.data(), qkv.data(), scratch.data(), B, T, C, NH);
    attention_forward_reference(ref.data(), qkv.data(), B, T, C, NH);
    expect_close(out, ref, 1e-5);
    // The first query of every head sees only itself: lse = its own scaled score.
    const int hs = C / NH;
    for (int h = 0; h < NH; h++) {
      double s = 0.0;
      for (int i = 0; i < hs; i++) s += qkv[h * hs + i] * qkv[C + h * hs + i];
      EXPECT_NEAR(lse[h * T], s / std::sqrt(hs), 1e-5 * (1 + std::fabs(s)));
    }
  }
}

// Loss L = sum(out * w) for fixed w; its gradient through attention_backward against central
// differences of attention_forward in fp32 (h = 1e-2 on O(1) inputs: error ~1e-4 relative).
TEST(KernelsTest, AttentionBackwardMatchesFiniteDifferences) {
  const int B = 2, T = 6, C = 8, NH = 2;
  std::vector<float> qkv = randn(11, B * T * 3 * C), w = randn(12, B * T * C);
  std::vector<float> out(B * T * C), lse(B * NH * T), scratch(attention_scratch_floats());
  auto loss = [&](const std::vector<float>& x) {
    attention_forward(out.data(), lse.data(), x.data(), scratch.data(), B, T, C, NH);
    double s = 0.0;
    for (size_t i = 0; i < out.size(); i++) s += static_cast<double>(out[i]) * w[i];
    return s;
  };
  loss(qkv);
  std::vector<float> dqkv(qkv.size());
  attention_backward(dqkv.data(), w.data(), qkv.data(), out.data(), lse.data(), scratch.data(), B, T, C, NH);
  const float h = 1e-2f;
  for (size_t i = 0; i < qkv.size(); i++) {
    std::vector<float> x = qkv;
    x[i] += h;
    const double lp = loss(x);
    x[i] -= 2 * h;
    const double lm = loss(x);
    ASSERT_NEAR(dqkv[i], (lp - lm) / (2 * h), 2e-3) << i;
  }
}

// T around the 64-row block (one partial block, exactly one, one plus a row, several with a
// partial last one) and head sizes below, at and above the 8-wide sum lanes.
constexpr int kBlockedTs[] = {1, 7, 63, 64, 65, 200, 257};
constexpr std::tuple<int, int, int> kBlockedShapes[] = {{2, 24, 3}, {1, 64, 1}, {1, 40, 2}};  // B, C, NH

// |a - b| within tol everywhere.
void expect_within(const std::vector<float>& a, const std::vector<float>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); i++) ASSERT_NEAR(a[i], b[i], tol) << i;
}

double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Blocked forward (online softmax over 64-key blocks) against llm.c's direct loops. The sums run
// in another order and exp is a polynomial: 1e-5 of the largest output.
TEST(KernelsTest, BlockedAttentionForwardMatchesReferenceAcrossBlockBoundaries) {
  for (int T : kBlockedTs) {
    for (auto [B, C, NH] : kBlockedShapes) {
      SCOPED_TRACE(::testing::Message() << "T=" << T << " B=" << B << " C=" << C << " NH=" << NH);
      std::vector<float> qkv = randn(21 + T, static_cast<size_t>(B) * T * 3 * C);
      std::vector<float> out(static_cast<size_t>(B) * T * C), ref(out.size()), lse(static_cast<size_t>(B) * NH * T);
      std::vector<float> scratch(attention_scratch_floats());
      attention_forward(out.data(), lse.data(), qkv.data(), scratch.data(), B, T, C, NH);
      attention_forward_reference(ref.data(), qkv.data(), B, T, C, NH);
      expect_close(out, ref, 1e-5);
      // lse against the full path's (which takes max and log-sum over the whole row at once).
      std::vector<float> out_full(out.size()), lse_full(lse.size()), full_scratch(attention_full_scratch_floats(T));
      attention_forward_full(out_full.data(), lse_full.data(), qkv.data(), full_scratch.data(), B, T, C, NH);
      expect_close(lse, lse_full, 1e-5);
    }
  }
}

// Blocked backward (P rebuilt from lse block by block, dK/dV accumulated over query blocks)
// against scalar loops that form each row's softmax and its gradient directly: within 2e-5 of
// the largest v gradient (at T = 1 the q and k gradients are exactly 0 in the reference and
// rounding-sized in the blocked kernel, so they cannot set their own scale).
TEST(KernelsTest, BlockedAttentionBackwardMatchesReferenceAcrossBlockBoundaries) {
  for (int T : kBlockedTs) {
    for (auto [B, C, NH] : kBlockedShapes) {
      SCOPED_TRACE(::testing::Message() << "T=" << T << " B=" << B << " C=" << C << " NH=" << NH);
      const size_t n = static_cast<size_t>(B) * T * C;
      std::vector<float> qkv = randn(31 + T, 3 * n), dout = randn(32 + T, n);
      std::vector<float> out(n), lse(static_cast<size_t>(B) * NH * T), scratch(attention_scratch_floats());
      attention_forward(out.data(), lse.data(), qkv.data(), scratch.data(), B, T, C, NH);
      std::vector<float> dqkv(3 * n, NAN), ref(3 * n, NAN);  // overwritten, never read
      attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), scratch.data(), B, T, C, NH);
      attention_backward_reference(ref.data(), dout.data(), qkv.data(), B, T, C, NH);
      std::vector<float> dv_ref;
      for (size_t row = 0; row < static_cast<size_t>(B) * T; row++) {
        dv_ref.insert(dv_ref.end(), ref.begin() + row * 3 * C + 2 * C, ref.begin() + (row + 1) * 3 * C);
      }
      ASSERT_GT(max_abs(dv_ref), 0.1);
      expect_within(dqkv, ref, 2e-5 * max_abs(dv_ref));
    }
  }
}

// Same inputs, same bits: twice on one pool, and on pools of 1, 2 and 3 threads (tasks go to
// whichever thread is free, so this also catches a result that depends on the lane).
TEST(KernelsTest, BlockedAttentionBitsIndependentOfRunAndThreadCount) {
  const int B = 2, T = 200, C = 128, NH = 2;  // large enough for attention_worth_threads
  ASSERT_TRUE(detail::attention_worth_threads(B, NH, T, C / NH));
  const size_t n = static_cast<size_t>(B) * T * C;
  std::vector<float> qkv = randn(41, 3 * n), dout = randn(42, n);
  std::vector<std::vector<float>> results;
  for (size_t threads : {1, 2, 2, 3}) {
    ThreadPool pool(threads, false);
    std::vector<float> scratch(pool.threads() * detail::kAttnLaneFloats);
    std::vector<float> out(n), lse(static_cast<size_t>(B) * NH * T), dqkv(3 * n);
    detail::attention_forward_on(pool, out.data(), lse.data(), qkv.data(), scratch.data(), B, T, C, NH);
    detail::attention_backward_on(pool, dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), scratch.data(),
                                  B, T, C, NH);
    out.insert(out.end(), lse.begin(), lse.end());
    out.insert(out.end(), dqkv.begin(), dqkv.end());
    results.push_back(std::move(out));
  }
  for (size_t i = 1; i < results.size(); i++) EXPECT_TRUE(same_bits(results[0], results[i])) << "run " << i;
}

// The full (T, T) path kept for the benchmark computes the same attention.
TEST(KernelsTest, FullMatrixAttentionAgreesWithBlocked) {
  const int B = 2, T = 130, C = 32, NH = 2;
  const size_t n = static_cast<size_t>(B) * T * C;
  std::vector<float> qkv = randn(51, 3 * n), dout = randn(52, n);
  std::vector<float> out(n), lse(static_cast<size_t>(B) * NH * T), dqkv(3 * n);
  std::vector<float> out_f(n), lse_f(lse.size()), dqkv_f(3 * n);
  std::vector<float> scratch(attention_scratch_floats()), full(attention_full_scratch_floats(T));
  attention_forward(out.data(), lse.data(), qkv.data(), scratch.data(), B, T, C, NH);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), scratch.data(), B, T, C, NH);
  attention_forward_full(out_f.data(), lse_f.data(), qkv.data(), full.data(), B, T, C, NH);
  attention_backward_full(dqkv_f.data(), dout.data(), qkv.data(), lse_f.data(), full.data(), B, T, C, NH);
  expect_close(out, out_f, 1e-5);
  expect_close(dqkv, dqkv_f, 2e-5);
}

TEST(KernelsTest, SoftmaxCrossEntropyMatchesDouble) {
  const int N = 5, V = 300;
  std::vector<float> logits = randn(21, N * V, 3.0);
  std::vector<int32_t> tgt = {0, 299, 17, 150, 3};
  std::vector<float> probs = logits, losses(N);
  softmax_xent_forward(probs.data(), losses.data(), tgt.data(), N, V);
  for (int n = 0; n < N; n++) {
    double maxv = -1e300, sum = 0.0, psum = 0.0;
    for (int v = 0; v < V; v++) maxv = std::max(maxv, static_cast<double>(logits[n * V + v]));
    for (int v = 0; v < V; v++) sum += std::exp(logits[n * V + v] - maxv);
    EXPECT_NEAR(losses[n], maxv + std::log(sum) - logits[n * V + tgt[n]], 1e-5);
    for (int v = 0; v < V; v++) psum += probs[n * V + v];
    EXPECT_NEAR(psum, 1.0, 1e-5);
  }
  softmax_xent_backward(probs.data(), tgt.data(), 0.5f, N, V);
  for (int n = 0; n < N; n++) {
    double dsum = 0.0;
    for (int v = 0; v < V; v++) dsum += probs[n * V + v];
    EXPECT_NEAR(dsum, 0.0, 1e-6);  // rows of (p - onehot) sum to zero
    EXPECT_LT(probs[n * V + tgt[n]], 0.0f);
  }
}

TEST(KernelsTest, GeluBackwardMatchesFiniteDifferences) {
  std::vector<float> x = randn(31, 200, 3.0), y(200), dx(200), ones(200, 1.0f);
  gelu_backward(dx.data(), x.data(), ones.data(), x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const float h = 1e-2f;
    float a = x[i] + h, b = x[i] - h, ya, yb;
    gelu_forward(&ya, &a, 1);
    gelu_forward(&yb, &b, 1);
    ASSERT_NEAR(dx[i], (ya - yb) / (2 * h), 1e-3) << x[i];
  }
  // GELU(x) ~ x for large x, ~0 for very negative x, 0 at 0.
  float in[3] = {0.0f, 10.0f, -10.0f}, out[3];
  gelu_forward(out, in, 3);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_NEAR(out[1], 10.0f, 1e-5);
  EXPECT_NEAR(out[2], 0.0f, 1e-5);
}

TEST(KernelsTest, LayerNormForwardNormalises) {
  const int N = 4, C = 64;
  std::vector<float> x = randn(41, N * C, 5.0), w(C, 1.0f), b(C, 0.0f), out(N * C), mean(N),
                     rstd(N);
  for (float& v : x) v += 3.0f;
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  for (int n = 0; n < N; n++) {
    double m = 0.0, v = 0.0;
    for (int i = 0; i < C; i++) m += out[n * C + i];
    for (int i = 0; i < C; i++) v += out[n * C + i] * out[n * C + i];
    EXPECT_NEAR(m / C, 0.0, 1e-5);
    EXPECT_NEAR(v / C, 1.0, 1e-3);
  }
}

}  // namespace
}  // namespace zinf::model::kernels
