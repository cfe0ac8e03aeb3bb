// The Llama kernels against plain double-precision references written here from the HF
// definitions (RMSNorm, rotate_half RoPE, SwiGLU, repeat_kv attention), and their backwards
// against central differences of those references.
#include "model/llama_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "model/attention_core.h"
#include "model/kernels.h"
#include "model_test_util.h"

namespace zinf::model::kernels {
namespace {

std::vector<float> randn(uint64_t seed, size_t n, double scale = 1.0, double mean = 0.0) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = static_cast<float>(mean + scale * testing::test_normal(seed, i));
  return v;
}

double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

// |a - b| within rel * max|b|.
void expect_close(const std::vector<float>& a, const std::vector<double>& b, double rel) {
  ASSERT_EQ(a.size(), b.size());
  double maxb = 0.0;
  for (double x : b) maxb = std::max(maxb, std::fabs(x));
  ASSERT_GT(maxb, 0.0);
  for (size_t i = 0; i < a.size(); i++) ASSERT_NEAR(a[i], b[i], rel * maxb) << i;
}

// Gradient of sum(f(x) * w) at x by central differences of a double function.
std::vector<double> fd_grad(const std::function<std::vector<double>(const std::vector<double>&)>& f,
                            std::vector<double> x, const std::vector<float>& w) {
  const double h = 1e-6;
  auto dot = [&](const std::vector<double>& y) {
    double s = 0.0;
    for (size_t i = 0; i < y.size(); i++) s += y[i] * w[i];
    return s;
  };
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = dot(f(x));
    x[i] = keep - h;
    const double down = dot(f(x));
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// HF LlamaRMSNorm in double: weight * (x / sqrt(mean(x^2) + eps)).
std::vector<double> rmsnorm_ref(const std::vector<double>& x, const std::vector<double>& w, double eps, int N,
                                int C) {
  std::vector<double> out(x.size());
  for (int n = 0; n < N; n++) {
    double ss = 0.0;
    for (int i = 0; i < C; i++) ss += x[n * C + i] * x[n * C + i];
    const double s = 1.0 / std::sqrt(ss / C + eps);
    for (int i = 0; i < C; i++) out[n * C + i] = w[i] * (x[n * C + i] * s);
  }
  return out;
}

TEST(LlamaKernelsTest, RmsNormForwardAndBackwardMatchDoubleReference) {
  const int N = 7, C = 24;
  const float eps = 1e-5f;
  std::vector<float> x = randn(1, N * C, 1.5, 0.3), w = randn(2, C, 0.2, 1.0), dout = randn(3, N * C);
  x[5 * C + 3] = 0.0f;  // a zero in a row changes nothing special
  std::vector<float> out(N * C), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), eps, N, C);
  expect_close(out, rmsnorm_ref(to_double(x), to_double(w), eps, N, C), 2e-7);

  std::vector<float> dx = randn(4, N * C), dw = randn(5, C);  // both accumulate
  const std::vector<float> dx0 = dx, dw0 = dw;
  rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
  std::vector<double> gx = fd_grad([&](const std::vector<double>& xx) { return rmsnorm_ref(xx, to_double(w), eps, N, C); },
                                   to_double(x), dout);
  std::vector<double> gw = fd_grad([&](const std::vector<double>& ww) { return rmsnorm_ref(to_double(x), ww, eps, N, C); },
                                   to_double(w), dout);
  for (size_t i = 0; i < gx.size(); i++) gx[i] += dx0[i];
  for (size_t i = 0; i < gw.size(); i++) gw[i] += dw0[i];
  expect_close(dx, gx, 1e-6);
  expect_close(dw, gw, 1e-6);
}

// HF apply_rotary_pos_emb on one (B,T,n_heads*hd) tensor: x * cos + rotate_half(x) * sin with
// cos = cat(cos(f), cos(f)), f = t * theta^(-2i/hd), rotate_half(x) = cat(-x2, x1).
std::vector<double> rope_ref(const std::vector<double>& x, int B, int T, int n_heads, int hd, double theta) {
  std::vector<double> out(x.size());
  const int half = hd / 2;
  for (int bt = 0; bt < B * T; bt++) {
    const int t = bt % T;
    for (int h = 0; h < n_heads; h++) {
      const double* xh = &x[(static_cast<size_t>(bt) * n_heads + h) * hd];
      double* oh = &out[(static_cast<size_t>(bt) * n_heads + h) * hd];
      std::vector<double> rot(hd), cosv(hd), sinv(hd);
      for (int i = 0; i < half; i++) {
        rot[i] = -xh[i + half];
        rot[i + half] = xh[i];
        const double f = t * std::pow(theta, -2.0 * i / hd);
        cosv[i] = cosv[i + half] = std::cos(f);
        sinv[i] = sinv[i + half] = std::sin(f);
      }
      for (int i = 0; i < hd; i++) oh[i] = xh[i] * cosv[i] + rot[i] * sinv[i];
    }
  }
  return out;
}

TEST(LlamaKernelsTest, RopeMatchesRotateHalfReferenceAndBackwardIsItsTranspose) {
  const int B = 2, T = 11, NH = 3, hd = 8;
  const double theta = 500.0;
  std::vector<float> cosv(T * hd / 2), sinv(T * hd / 2);
  rope_tables(cosv.data(), sinv.data(), T, hd, theta);
  EXPECT_EQ(cosv[0], 1.0f);  // position 0 is the identity
  EXPECT_EQ(sinv[hd / 2 - 1], 0.0f);
  EXPECT_FLOAT_EQ(cosv[3 * hd / 2 + 1], static_cast<float>(std::cos(3 * std::pow(theta, -2.0 / hd))));
  const std::vector<float> x = randn(11, B * T * NH * hd);
  std::vector<float> y = x;
  rope_forward(y.data(), cosv.data(), sinv.data(), B, T, NH, hd);
  expect_close(y, rope_ref(to_double(x), B, T, NH, hd, theta), 3e-7);

  // Backward: <rope(x), g> = <x, rope_backward(g)> for any g, and it undoes the rotation.
  const std::vector<float> g = randn(12, x.size());
  std::vector<float> gx = g;
  rope_backward(gx.data(), cosv.data(), sinv.data(), B, T, NH, hd);
  double lhs = 0.0, rhs = 0.0;
  for (size_t i = 0; i < x.size(); i++) {
    lhs += static_cast<double>(y[i]) * g[i];
    rhs += static_cast<double>(x[i]) * gx[i];
  }
  EXPECT_NEAR(lhs, rhs, 1e-5 * std::fabs(lhs) + 1e-5);
  std::vector<float> back = y;
  rope_backward(back.data(), cosv.data(), sinv.data(), B, T, NH, hd);
  expect_close(back, to_double(x), 3e-7);
}

std::vector<double> swiglu_ref(const std::vector<double>& gate, const std::vector<double>& up) {
  std::vector<double> out(gate.size());
  for (size_t i = 0; i < gate.size(); i++) out[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
  return out;
}

TEST(LlamaKernelsTest, SwigluForwardAndBackwardMatchDoubleReference) {
  const size_t n = 300;
  std::vector<float> gate = randn(21, n, 3.0), up = randn(22, n), dout = randn(23, n);
  gate[0] = -100.0f;  // exp overflows to inf: silu must still be ~0, not NaN
  gate[1] = 100.0f;
  std::vector<float> out(n);
  swiglu_forward(out.data(), gate.data(), up.data(), n);
  expect_close(out, swiglu_ref(to_double(gate), to_double(up)), 3e-7);

  std::vector<float> dgate = dout, dup(n);  // dgate aliases dout
  swiglu_backward(dgate.data(), dup.data(), dgate.data(), gate.data(), up.data(), n);
  const auto gg = fd_grad([&](const std::vector<double>& g) { return swiglu_ref(g, to_double(up)); },
                          to_double(gate), dout);
  const auto gu = fd_grad([&](const std::vector<double>& u) { return swiglu_ref(to_double(gate), u); },
                          to_double(up), dout);
  expect_close(dgate, gg, 1e-6);
  expect_close(dup, gu, 1e-6);
  EXPECT_FALSE(std::isnan(dgate[0]));
}

TEST(LlamaKernelsTest, EmbeddingGathersAndScattersInRowOrder) {
  const int V = 5, C = 3;
  const std::vector<int32_t> tok = {4, 0, 4, 2};
  std::vector<float> table = randn(31, V * C), out(tok.size() * C);
  embedding_forward(out.data(), tok.data(), table.data(), tok.size(), C);
  for (size_t n = 0; n < tok.size(); n++) {
    for (int i = 0; i < C; i++) ASSERT_EQ(out[n * C + i], table[tok[n] * C + i]);
  }
  std::vector<float> dtable(V * C, 1.0f), dout = randn(32, tok.size() * C);
  embedding_backward(dtable.data(), dout.data(), tok.data(), tok.size(), C);
  for (int i = 0; i < C; i++) {
    EXPECT_EQ(dtable[4 * C + i], (1.0f + dout[i]) + dout[2 * C + i]);  // row order, onto the old value
    EXPECT_EQ(dtable[0 * C + i], 1.0f + dout[C + i]);
    EXPECT_EQ(dtable[1 * C + i], 1.0f);
  }
}

// Direct double attention with repeat_kv: query head h reads kv head h / (NH / NKV).
std::vector<double> gqa_ref(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                            const GqaShape& s) {
  const int qw = s.NH * s.hs, kvw = s.NKV * s.hs, group = s.NH / s.NKV;
  std::vector<double> out(q.size(), 0.0);
  for (int b = 0; b < s.B; b++) {
    for (int h = 0; h < s.NH; h++) {
      const int g = h / group;
      for (int t = 0; t < s.T; t++) {
        std::vector<double> att(t + 1);
        double maxv = -1e300, sum = 0.0;
        for (int u = 0; u <= t; u++) {
          double d = 0.0;
          for (int i = 0; i < s.hs; i++) d += q[(b * s.T + t) * qw + h * s.hs + i] * k[(b * s.T + u) * kvw + g * s.hs + i];
          att[u] = d / std::sqrt(static_cast<double>(s.hs));
          maxv = std::max(maxv, att[u]);
        }
        for (int u = 0; u <= t; u++) sum += (att[u] = std::exp(att[u] - maxv));
        for (int u = 0; u <= t; u++) {
          for (int i = 0; i < s.hs; i++) {
            out[(b * s.T + t) * qw + h * s.hs + i] += att[u] / sum * v[(b * s.T + u) * kvw + g * s.hs + i];
          }
        }
      }
    }
  }
  return out;
}

TEST(LlamaKernelsTest, GqaAttentionForwardMatchesReferences) {
  for (GqaShape s : {GqaShape{2, 13, 4, 2, 6}, GqaShape{1, 1, 2, 1, 4}, GqaShape{1, 40, 6, 6, 8},
                     GqaShape{2, 9, 8, 1, 4}}) {
    const size_t nq = static_cast<size_t>(s.B) * s.T * s.NH * s.hs, nkv = nq / s.NH * s.NKV;
    std::vector<float> q = randn(41, nq), k = randn(42, nkv), v = randn(43, nkv);
    std::vector<float> out(nq), ref(nq), lse(static_cast<size_t>(s.B) * s.NH * s.T);
    std::vector<float> scratch(gqa_attention_scratch_floats());
    gqa_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), scratch.data(), s);
    gqa_attention_forward_reference(ref.data(), q.data(), k.data(), v.data(), s);
    expect_close(out, to_double(ref), 1e-6);
    expect_close(out, gqa_ref(to_double(q), to_double(k), to_double(v), s), 1e-6);
    // The first query of head h sees only key 0 of its kv head: lse = its own scaled score.
    for (int h = 0; h < s.NH; h++) {
      double d = 0.0;
      for (int i = 0; i < s.hs; i++) d += static_cast<double>(q[h * s.hs + i]) * k[(h / (s.NH / s.NKV)) * s.hs + i];
      EXPECT_NEAR(lse[static_cast<size_t>(h) * s.T], d / std::sqrt(s.hs), 1e-5 * (1 + std::fabs(d)));
    }
  }
}

// Loss sum(out * w); gradients of q, k and v against central differences of the double
// reference. Two query heads per kv head: dk and dv sum over both.
TEST(LlamaKernelsTest, GqaAttentionBackwardMatchesFiniteDifferences) {
  for (GqaShape s : {GqaShape{2, 6, 4, 2, 4}, GqaShape{1, 5, 3, 1, 2}, GqaShape{1, 4, 2, 2, 4}}) {
    const size_t nq = static_cast<size_t>(s.B) * s.T * s.NH * s.hs, nkv = nq / s.NH * s.NKV;
    std::vector<float> q = randn(51, nq), k = randn(52, nkv), v = randn(53, nkv), w = randn(54, nq);
    std::vector<float> out(nq), lse(static_cast<size_t>(s.B) * s.NH * s.T), scratch(gqa_attention_scratch_floats());
    gqa_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), scratch.data(), s);
    std::vector<float> dq(nq, NAN), dk(nkv, NAN), dv(nkv, NAN);  // overwritten, never read
    gqa_attention_backward(dq.data(), dk.data(), dv.data(), w.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                           scratch.data(), s);
    const auto Q = to_double(q), K = to_double(k), Vv = to_double(v);
    expect_close(dq, fd_grad([&](const std::vector<double>& x) { return gqa_ref(x, K, Vv, s); }, Q, w), 1e-5);
    expect_close(dk, fd_grad([&](const std::vector<double>& x) { return gqa_ref(Q, x, Vv, s); }, K, w), 1e-5);
    expect_close(dv, fd_grad([&](const std::vector<double>& x) { return gqa_ref(Q, K, x, s); }, Vv, w), 1e-5);
    EXPECT_GT(max_abs(dk), 0.0);
  }
}

// The blocked kernels across block boundaries (64 rows; 32 at head size 128) and GQA ratios
// (1, 2, 3 and 4 query heads per kv head) against the scalar loops: forward to 1e-5 of the largest value, backward to 2e-5
// of the largest v gradient (other summation order, polynomial exp; at T = 1 the q and k
// gradients are exactly 0 in the reference and rounding-sized here).
TEST(LlamaKernelsTest, BlockedGqaAttentionMatchesReferencesAcrossBlockBoundaries) {
  for (int T : {1, 7, 63, 64, 65, 200, 257}) {
    for (GqaShape s : {GqaShape{1, T, 4, 1, 16}, GqaShape{2, T, 4, 2, 8}, GqaShape{1, T, 6, 2, 12},
                       GqaShape{1, T, 2, 2, 64}, GqaShape{1, T, 2, 1, 128}}) {
      SCOPED_TRACE(::testing::Message() << "T=" << T << " NH=" << s.NH << " NKV=" << s.NKV << " hs=" << s.hs);
      const size_t nq = static_cast<size_t>(s.B) * s.T * s.NH * s.hs, nkv = nq / s.NH * s.NKV;
      std::vector<float> q = randn(71 + T, nq), k = randn(72 + T, nkv), v = randn(73 + T, nkv), dout = randn(74 + T, nq);
      std::vector<float> out(nq), ref(nq), lse(static_cast<size_t>(s.B) * s.NH * s.T);
      std::vector<float> scratch(gqa_attention_scratch_floats());
      gqa_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), scratch.data(), s);
      gqa_attention_forward_reference(ref.data(), q.data(), k.data(), v.data(), s);
      expect_close(out, to_double(ref), 1e-5);
      std::vector<float> dq(nq, NAN), dk(nkv, NAN), dv(nkv, NAN);  // overwritten, never read
      std::vector<float> dq_ref(nq), dk_ref(nkv), dv_ref(nkv);
      gqa_attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(),
                             lse.data(), scratch.data(), s);
      gqa_attention_backward_reference(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.data(), q.data(), k.data(),
                                       v.data(), s);
      const double tol = 2e-5 * max_abs(dv_ref);
      ASSERT_GT(tol, 0.0);
      for (auto [got, want] : {std::pair{&dq, &dq_ref}, std::pair{&dk, &dk_ref}, std::pair{&dv, &dv_ref}}) {
        for (size_t i = 0; i < got->size(); i++) ASSERT_NEAR((*got)[i], (*want)[i], tol) << i;
      }
    }
  }
}

// Same bits twice and on pools of 1, 2 and 3 threads, with kv heads shared by query heads.
TEST(LlamaKernelsTest, BlockedGqaAttentionBitsIndependentOfRunAndThreadCount) {
  const GqaShape s{2, 150, 4, 2, 32};
  ASSERT_TRUE(detail::attention_worth_threads(s.B, s.NH, s.T, s.hs));
  const size_t nq = static_cast<size_t>(s.B) * s.T * s.NH * s.hs, nkv = nq / s.NH * s.NKV;
  std::vector<float> q = randn(81, nq), k = randn(82, nkv), v = randn(83, nkv), dout = randn(84, nq);
  std::vector<std::vector<float>> results;
  for (size_t threads : {1, 2, 2, 3}) {
    ThreadPool pool(threads, false);
    std::vector<float> scratch(pool.threads() * detail::kAttnLaneFloats);
    std::vector<float> out(nq), lse(static_cast<size_t>(s.B) * s.NH * s.T), dq(nq), dk(nkv), dv(nkv);
    detail::gqa_attention_forward_on(pool, out.data(), lse.data(), q.data(), k.data(), v.data(), scratch.data(), s);
    detail::gqa_attention_backward_on(pool, dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                                      v.data(), out.data(), lse.data(), scratch.data(), s);
    for (const auto* part : {&lse, &dq, &dk, &dv}) out.insert(out.end(), part->begin(), part->end());
    results.push_back(std::move(out));
  }
  for (size_t i = 1; i < results.size(); i++) {
    ASSERT_EQ(results[i].size(), results[0].size());
    EXPECT_EQ(std::memcmp(results[0].data(), results[i].data(), results[0].size() * sizeof(float)), 0) << "run " << i;
  }
}

// With one query head per kv head the kernel is plain multi-head attention: GPT's kernel on the
// same q, k, v packed as [q | k | v] gives the same output.
TEST(LlamaKernelsTest, GqaWithOneHeadPerGroupIsGptAttention) {
  const int B = 2, T = 10, NH = 4, hs = 6, C = NH * hs;
  std::vector<float> q = randn(61, B * T * C), k = randn(62, B * T * C), v = randn(63, B * T * C);
  std::vector<float> qkv(B * T * 3 * C);
  for (int bt = 0; bt < B * T; bt++) {
    for (int i = 0; i < C; i++) {
      qkv[bt * 3 * C + i] = q[bt * C + i];
      qkv[bt * 3 * C + C + i] = k[bt * C + i];
      qkv[bt * 3 * C + 2 * C + i] = v[bt * C + i];
    }
  }
  std::vector<float> out(B * T * C), gpt(B * T * C), lse(B * NH * T), lse_gpt(B * NH * T);
  std::vector<float> scratch(gqa_attention_scratch_floats());
  gqa_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), scratch.data(), GqaShape{B, T, NH, NH, hs});
  attention_forward(gpt.data(), lse_gpt.data(), qkv.data(), scratch.data(), B, T, C, NH);
  expect_close(out, to_double(gpt), 1e-6);
  expect_close(lse, to_double(lse_gpt), 1e-6);
}

}  // namespace
}  // namespace zinf::model::kernels
