// The model's fp32 forward and backward against a double-precision reference forward written
// here from the GPT-2 definition, with central finite differences on that reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

#include "model_test_util.h"
#include "zinf/model/gpt.h"

namespace zinf::model {
namespace {

using testing::micro_config;

// Double-precision GPT-2 forward with direct loops; parameters flat in LocalParams order.
class ReferenceGpt {
 public:
  ReferenceGpt(const GptConfig& c, std::span<const ParamSpec> specs) : c_(c) {
    size_t off = 0;
    for (const ParamSpec& s : specs) {
      offsets_.push_back(off);
      off += s.numel;
    }
  }

  double loss(const std::vector<double>& p, const std::vector<int32_t>& in,
              const std::vector<int32_t>& tgt, int B, int T) const {
    const int C = c_.n_embd;
    const int V = c_.vocab_size;
    std::vector<double> x(static_cast<size_t>(B) * T * C);  // (B,T,C) residual stream
    const double* wte = &p[offsets_[0]];
    const double* wpe = &p[offsets_[1]];
    for (int bt = 0; bt < B * T; bt++) {
      for (int i = 0; i < C; i++) {
        x[bt * C + i] = wte[in[bt] * C + i] + wpe[(bt % T) * C + i];
      }
    }
    for (int l = 0; l < c_.n_layer; l++) block(p, 2 + 12 * l, x, B, T);
    const int lnf = 2 + 12 * c_.n_layer;
    std::vector<double> h = layernorm(x, &p[offsets_[lnf]], &p[offsets_[lnf + 1]], B * T);
    double total = 0.0;
    for (int bt = 0; bt < B * T; bt++) {
      std::vector<double> logits(V);
      double maxv = -1e300;
      for (int v = 0; v < V; v++) {
        double s = 0.0;
        for (int i = 0; i < C; i++) s += h[bt * C + i] * wte[v * C + i];
        logits[v] = s;
        maxv = std::max(maxv, s);
      }
      double sum = 0.0;
      for (int v = 0; v < V; v++) sum += std::exp(logits[v] - maxv);
      total += maxv + std::log(sum) - logits[tgt[bt]];
    }
    return total / (B * T);
  }

 private:
  std::vector<double> layernorm(const std::vector<double>& x, const double* w, const double* b,
                                int N) const {
    const int C = c_.n_embd;
    std::vector<double> out(x.size());
    for (int n = 0; n < N; n++) {
      double m = 0.0, v = 0.0;
      for (int i = 0; i < C; i++) m += x[n * C + i] / C;
      for (int i = 0; i < C; i++) v += (x[n * C + i] - m) * (x[n * C + i] - m) / C;
      const double s = 1.0 / std::sqrt(v + 1e-5);
      for (int i = 0; i < C; i++) out[n * C + i] = (x[n * C + i] - m) * s * w[i] + b[i];
    }
    return out;
  }

  // out (N,OC) = in (N,IC) @ w^T + b
  static std::vector<double> linear(const std::vector<double>& in, const double* w, const double* b,
                                    int N, int IC, int OC) {
    std::vector<double> out(static_cast<size_t>(N) * OC);
    for (int n = 0; n < N; n++) {
      for (int o = 0; o < OC; o++) {
        double s = b[o];
        for (int i = 0; i < IC; i++) s += in[n * IC + i] * w[o * IC + i];
        out[n * OC + o] = s;
      }
    }
    return out;
  }

  void block(const std::vector<double>& p, int base, std::vector<double>& x, int B, int T) const {
    const int C = c_.n_embd;
    const int NH = c_.n_head;
    const int hs = C / NH;
    const int N = B * T;
    auto P = [&](int k) { return &p[offsets_[base + k]]; };
    std::vector<double> ln1 = layernorm(x, P(0), P(1), N);
    std::vector<double> qkv = linear(ln1, P(2), P(3), N, C, 3 * C);
    std::vector<double> y(static_cast<size_t>(N) * C, 0.0);
    for (int b = 0; b < B; b++) {
      for (int h = 0; h < NH; h++) {
        for (int t = 0; t < T; t++) {
          std::vector<double> att(t + 1);
          double maxv = -1e300, sum = 0.0;
          for (int u = 0; u <= t; u++) {
            double s = 0.0;
            for (int i = 0; i < hs; i++) {
              s +=
                  qkv[(b * T + t) * 3 * C + h * hs + i] * qkv[(b * T + u) * 3 * C + C + h * hs + i];
            }
            att[u] = s / std::sqrt(static_cast<double>(hs));
            maxv = std::max(maxv, att[u]);
          }
          for (int u = 0; u <= t; u++) sum += (att[u] = std::exp(att[u] - maxv));
          for (int u = 0; u <= t; u++) {
            for (int i = 0; i < hs; i++) {
              y[(b * T + t) * C + h * hs + i] +=
                  att[u] / sum * qkv[(b * T + u) * 3 * C + 2 * C + h * hs + i];
            }
          }
        }
      }
    }
    std::vector<double> proj = linear(y, P(4), P(5), N, C, C);
    for (size_t i = 0; i < x.size(); i++) x[i] += proj[i];
    std::vector<double> ln2 = layernorm(x, P(6), P(7), N);
    std::vector<double> fc = linear(ln2, P(8), P(9), N, C, 4 * C);
    const double k = std::sqrt(2.0 / std::numbers::pi);
    for (double& v : fc) v = 0.5 * v * (1.0 + std::tanh(k * (v + 0.044715 * v * v * v)));
    std::vector<double> out = linear(fc, P(10), P(11), N, 4 * C, C);
    for (size_t i = 0; i < x.size(); i++) x[i] += out[i];
  }

  GptConfig c_;
  std::vector<size_t> offsets_;
};

struct Fixture {
  GptModel model;
  LocalParams params;
  std::vector<int32_t> in, tgt;
};

Fixture make(bool ckpt, int B, int T) {
  GptModel model = testing::make_gpt(micro_config(ckpt));
  Result<LocalParams> lp = LocalParams::create(model.params(), model.modules());
  EXPECT_TRUE(lp.is_ok());
  testing::randomize(*lp, model.params(), 7);
  const int V = model.config().vocab_size;
  return Fixture{std::move(model), std::move(lp).value(), testing::random_tokens(1, B * T, V),
                 testing::random_tokens(2, B * T, V)};
}

TEST(GradCheckTest, BackwardMatchesFiniteDifferencesOfDoubleReference) {
  const int B = 2, T = 9;
  Fixture f = make(false, B, T);
  Result<float> loss = f.model.forward_backward(f.in, f.tgt, B, T, f.params);
  ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();

  ReferenceGpt ref(f.model.config(), f.model.params());
  std::vector<double> p(f.params.flat_params().begin(), f.params.flat_params().end());
  const double ref_loss = ref.loss(p, f.in, f.tgt, B, T);
  // fp32 forward against double: relative 1e-5 is ~100 fp32 ulps over a few thousand ops.
  EXPECT_NEAR(*loss, ref_loss, 1e-5 * ref_loss);
  EXPECT_GT(ref_loss, 1.0);  // far from init: a loss with real gradients

  // Four random elements of every parameter tensor (wpe only from the rows T uses).
  // Central differences in double with h = 1e-5: truncation ~h^2 ~ 1e-10, rounding ~1e-16/h ~
  // 1e-11, so the reference gradient is exact to ~1e-9 and the tolerance covers fp32 only:
  // gradients are sums of a few thousand fp32 products, so their error is a few hundred fp32
  // ulps (~1e-7 each) of the tensor's largest gradient. Observed worst: 3e-7 to 6e-7 (printed
  // below); 1e-5 leaves a 20x margin while a wrong term (errors of 1e-2 and up) cannot pass.
  const double h = 1e-5;
  size_t checked = 0;
  double worst = 0.0;
  std::vector<size_t> offsets;
  size_t off = 0;
  for (const ParamSpec& s : f.model.params()) {
    offsets.push_back(off);
    off += s.numel;
  }
  for (const ParamSpec& s : f.model.params()) {
    std::span<const float> g = f.params.grad(s.index);
    float gmax = 0.0f;
    for (float x : g) gmax = std::max(gmax, std::fabs(x));
    ASSERT_GT(gmax, 0.0f) << s.name;
    const size_t range = s.name == "wpe.weight" ? static_cast<size_t>(T) * s.shape[1] : s.numel;
    for (int k = 0; k < 4; k++) {
      const size_t e = detail::below(detail::hash3(99, s.index, k), range);
      double& v = p[offsets[s.index] + e];
      const double saved = v;
      v = saved + h;
      const double lp = ref.loss(p, f.in, f.tgt, B, T);
      v = saved - h;
      const double lm = ref.loss(p, f.in, f.tgt, B, T);
      v = saved;
      const double fd = (lp - lm) / (2 * h);
      const double err = std::fabs(g[e] - fd) / gmax;
      worst = std::max(worst, err);
      EXPECT_LT(err, 1e-5) << s.name << "[" << e << "] analytic " << g[e] << " fd " << fd;
      checked++;
    }
  }
  EXPECT_EQ(checked, 4 * f.model.params().size());
  std::printf("checked %zu elements, worst |analytic - fd| / max|grad| = %.3g\n", checked, worst);

  // Rows of wpe past T get no gradient at all.
  std::span<const float> gwpe = f.params.grad(1);
  for (size_t i = static_cast<size_t>(T) * f.model.config().n_embd; i < gwpe.size(); i++) {
    ASSERT_EQ(gwpe[i], 0.0f) << i;
  }
}

std::vector<float> grads_of(Fixture& f, int B, int T, float scale, float* loss_out) {
  f.params.zero_grads();
  Result<float> loss = f.model.forward_backward(f.in, f.tgt, B, T, f.params, scale);
  EXPECT_TRUE(loss.is_ok()) << loss.status().to_string();
  *loss_out = loss.is_ok() ? *loss : NAN;
  return std::vector<float>(f.params.flat_grads().begin(), f.params.flat_grads().end());
}

TEST(GradCheckTest, CheckpointingIsBitIdentical) {
  for (auto [B, T] : {std::pair{2, 9}, std::pair{3, 12}, std::pair{1, 1}}) {
    Fixture plain = make(false, B, T);
    Fixture ckpt = make(true, B, T);
    float l1 = 0, l2 = 0;
    std::vector<float> g1 = grads_of(plain, B, T, 1.0f, &l1);
    std::vector<float> g2 = grads_of(ckpt, B, T, 1.0f, &l2);
    EXPECT_EQ(std::memcmp(&l1, &l2, sizeof(float)), 0) << B << "x" << T;
    ASSERT_EQ(g1.size(), g2.size());
    EXPECT_EQ(std::memcmp(g1.data(), g2.data(), g1.size() * sizeof(float)), 0) << B << "x" << T;
  }
}

TEST(GradCheckTest, PowerOfTwoLossScaleScalesGradientsExactly) {
  const int B = 2, T = 9;
  Fixture f = make(false, B, T);
  float l1 = 0, l2 = 0;
  std::vector<float> g1 = grads_of(f, B, T, 1.0f, &l1);
  std::vector<float> g2 = grads_of(f, B, T, 1024.0f, &l2);
  EXPECT_EQ(l1, l2);  // the loss itself is unscaled
  for (size_t i = 0; i < g1.size(); i++) ASSERT_EQ(g1[i] * 1024.0f, g2[i]) << i;
}

TEST(GradCheckTest, GradientsAccumulateAcrossCalls) {
  const int B = 2, T = 9;
  Fixture f = make(false, B, T);
  float loss = 0;
  std::vector<float> once = grads_of(f, B, T, 1.0f, &loss);
  ASSERT_TRUE(f.model.forward_backward(f.in, f.tgt, B, T, f.params).is_ok());  // adds again
  std::span<const float> twice = f.params.flat_grads();
  float gmax = 0.0f;
  for (float g : once) gmax = std::max(gmax, std::fabs(g));
  // The second pass adds in a different order than a fresh sum; near-zero elements that are
  // sums of cancelling terms differ by a few ulps of the largest gradient.
  for (size_t i = 0; i < once.size(); i++) {
    ASSERT_NEAR(twice[i], 2.0f * once[i], 1e-5f * std::fabs(once[i]) + 1e-6f * gmax) << i;
  }
}

}  // namespace
}  // namespace zinf::model
