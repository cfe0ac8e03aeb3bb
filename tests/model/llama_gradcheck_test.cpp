// LlamaModel's fp32 forward and backward against a double-precision reference forward written
// here from Hugging Face's LlamaForCausalLM definition, with central finite differences on it;
// tied and untied heads, grouped-query, multi-query and multi-head attention.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "model_test_util.h"
#include "zinf/model/llama.h"

namespace zinf::model {
namespace {

using testing::micro_llama_config;

// Double-precision LlamaForCausalLM with direct loops; parameters flat in LocalParams order
// (LlamaModel::params(): embed, per layer [ln1, q, k, v, o, ln2, gate, up, down], norm, head).
class ReferenceLlama {
 public:
  ReferenceLlama(const LlamaConfig& c, std::span<const ParamSpec> specs) : c_(c) {
    size_t off = 0;
    for (const ParamSpec& s : specs) {
      offsets_.push_back(off);
      off += s.numel;
    }
  }

  double loss(const std::vector<double>& p, const std::vector<int32_t>& in, const std::vector<int32_t>& tgt, int B,
              int T) const {
    const int C = c_.n_embd, V = c_.vocab_size, L = c_.n_layer;
    auto P = [&](int i) { return &p[offsets_[i]]; };
    std::vector<double> x(static_cast<size_t>(B) * T * C);  // (B,T,C) residual stream
    for (int bt = 0; bt < B * T; bt++) {
      for (int i = 0; i < C; i++) x[bt * C + i] = P(0)[in[bt] * C + i];
    }
    for (int l = 0; l < L; l++) block(p, 1 + 9 * l, x, B, T);
    std::vector<double> h = rmsnorm(x, P(1 + 9 * L), B * T);
    std::vector<double> logits = linear(h, P(c_.tie_word_embeddings ? 0 : 2 + 9 * L), B * T, C, V);
    double total = 0.0;
    for (int bt = 0; bt < B * T; bt++) {
      double maxv = -1e300, sum = 0.0;
      for (int v = 0; v < V; v++) maxv = std::max(maxv, logits[bt * V + v]);
      for (int v = 0; v < V; v++) sum += std::exp(logits[bt * V + v] - maxv);
      total += maxv + std::log(sum) - logits[bt * V + tgt[bt]];
    }
    return total / (B * T);
  }

 private:
  std::vector<double> rmsnorm(const std::vector<double>& x, const double* w, int N) const {
    const int C = c_.n_embd;
    std::vector<double> out(x.size());
    for (int n = 0; n < N; n++) {
      double ms = 0.0;
      for (int i = 0; i < C; i++) ms += x[n * C + i] * x[n * C + i] / C;
      const double s = 1.0 / std::sqrt(ms + c_.rms_norm_eps);
      for (int i = 0; i < C; i++) out[n * C + i] = w[i] * (x[n * C + i] * s);
    }
    return out;
  }

  // out (N,OC) = in (N,IC) @ w^T, w (OC,IC) as torch Linear stores it
  static std::vector<double> linear(const std::vector<double>& in, const double* w, int N, int IC, int OC) {
    std::vector<double> out(static_cast<size_t>(N) * OC);
    for (int n = 0; n < N; n++) {
      for (int o = 0; o < OC; o++) {
        double s = 0.0;
        for (int i = 0; i < IC; i++) s += in[n * IC + i] * w[o * IC + i];
        out[n * OC + o] = s;
      }
    }
    return out;
  }

  // apply_rotary_pos_emb: x * cos + rotate_half(x) * sin per head, positions 0..T-1.
  void rope(std::vector<double>& x, int B, int T, int heads) const {
    const int hd = c_.n_embd / c_.n_head, half = hd / 2;
    for (int bt = 0; bt < B * T; bt++) {
      for (int h = 0; h < heads; h++) {
        double* v = &x[(static_cast<size_t>(bt) * heads + h) * hd];
        std::vector<double> out(hd);
        for (int i = 0; i < hd; i++) {
          const double f = (bt % T) * std::pow(c_.rope_theta, -2.0 * (i % half) / hd);
          const double rotated = i < half ? -v[i + half] : v[i - half];
          out[i] = v[i] * std::cos(f) + rotated * std::sin(f);
        }
        std::copy(out.begin(), out.end(), v);
      }
    }
  }

  void block(const std::vector<double>& p, int base, std::vector<double>& x, int B, int T) const {
    const int C = c_.n_embd, NH = c_.n_head, NKV = c_.n_kv_head, hd = C / NH, KV = NKV * hd;
    const int I = c_.intermediate_size, N = B * T;
    auto P = [&](int k) { return &p[offsets_[base + k]]; };
    std::vector<double> h = rmsnorm(x, P(0), N);
    std::vector<double> q = linear(h, P(1), N, C, C), k = linear(h, P(2), N, C, KV), v = linear(h, P(3), N, C, KV);
    rope(q, B, T, NH);
    rope(k, B, T, NKV);
    std::vector<double> y(static_cast<size_t>(N) * C, 0.0);
    for (int b = 0; b < B; b++) {
      for (int head = 0; head < NH; head++) {
        const int g = head / (NH / NKV);  // repeat_kv
        for (int t = 0; t < T; t++) {
          std::vector<double> att(t + 1);
          double maxv = -1e300, sum = 0.0;
          for (int u = 0; u <= t; u++) {
            double s = 0.0;
            for (int i = 0; i < hd; i++) s += q[(b * T + t) * C + head * hd + i] * k[(b * T + u) * KV + g * hd + i];
            att[u] = s / std::sqrt(static_cast<double>(hd));
            maxv = std::max(maxv, att[u]);
          }
          for (int u = 0; u <= t; u++) sum += (att[u] = std::exp(att[u] - maxv));
          for (int u = 0; u <= t; u++) {
            for (int i = 0; i < hd; i++) {
              y[(b * T + t) * C + head * hd + i] += att[u] / sum * v[(b * T + u) * KV + g * hd + i];
            }
          }
        }
      }
    }
    std::vector<double> o = linear(y, P(4), N, C, C);
    for (size_t i = 0; i < x.size(); i++) x[i] += o[i];
    h = rmsnorm(x, P(5), N);
    std::vector<double> gate = linear(h, P(6), N, C, I), up = linear(h, P(7), N, C, I);
    for (size_t i = 0; i < gate.size(); i++) gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
    std::vector<double> down = linear(gate, P(8), N, I, C);
    for (size_t i = 0; i < x.size(); i++) x[i] += down[i];
  }

  LlamaConfig c_;
  std::vector<size_t> offsets_;
};

struct Fixture {
  LlamaModel model;
  LocalParams params;
  std::vector<int32_t> in, tgt;
};

Fixture make(const LlamaConfig& c, int B, int T) {
  LlamaModel model = testing::make_llama(c);
  Result<LocalParams> lp = LocalParams::create(model.params(), model.modules());
  EXPECT_TRUE(lp.is_ok());
  testing::randomize(*lp, model.params(), 7);
  return Fixture{std::move(model), std::move(lp).value(), testing::random_tokens(1, B * T, c.vocab_size),
                 testing::random_tokens(2, B * T, c.vocab_size)};
}

struct Variant {
  const char* name;
  bool tied;
  int n_kv_head;
};

class LlamaGradCheckTest : public ::testing::TestWithParam<Variant> {};

TEST_P(LlamaGradCheckTest, BackwardMatchesFiniteDifferencesOfDoubleReference) {
  const int B = 2, T = 9;
  LlamaConfig c = micro_llama_config(GetParam().tied);
  c.n_kv_head = GetParam().n_kv_head;
  Fixture f = make(c, B, T);
  Result<float> loss = f.model.forward_backward(f.in, f.tgt, B, T, f.params, 1.0f);
  ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();

  ReferenceLlama ref(c, f.model.params());
  std::vector<double> p(f.params.flat_params().begin(), f.params.flat_params().end());
  const double ref_loss = ref.loss(p, f.in, f.tgt, B, T);
  EXPECT_NEAR(*loss, ref_loss, 1e-5 * ref_loss);  // fp32 against double
  EXPECT_GT(ref_loss, 1.0);

  // Four random elements of every tensor. Central differences in double with h = 1e-5 are
  // exact to ~1e-9; the tolerance (1e-5 of the tensor's largest gradient) covers fp32 sums of a
  // few thousand products, while a wrong term (errors of 1e-2 and up) cannot pass.
  const double h = 1e-5;
  std::vector<size_t> offsets;
  size_t off = 0;
  for (const ParamSpec& s : f.model.params()) {
    offsets.push_back(off);
    off += s.numel;
  }
  double worst = 0.0;
  for (const ParamSpec& s : f.model.params()) {
    std::span<const float> g = f.params.grad(s.index);
    float gmax = 0.0f;
    for (float x : g) gmax = std::max(gmax, std::fabs(x));
    ASSERT_GT(gmax, 0.0f) << s.name;
    for (int k = 0; k < 4; k++) {
      const size_t e = detail::below(detail::hash3(99, s.index, k), s.numel);
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
    }
  }
  std::printf("%s: %zu tensors, worst |analytic - fd| / max|grad| = %.3g\n", GetParam().name,
              f.model.params().size(), worst);
}

INSTANTIATE_TEST_SUITE_P(Heads, LlamaGradCheckTest,
                         ::testing::Values(Variant{"gqa_tied", true, 2}, Variant{"gqa_untied", false, 2},
                                           Variant{"mqa_untied", false, 1}, Variant{"mha_tied", true, 4}),
                         [](const auto& info) { return std::string(info.param.name); });

std::vector<float> grads_of(Fixture& f, int B, int T, float scale, float* loss_out) {
  f.params.zero_grads();
  Result<float> loss = f.model.forward_backward(f.in, f.tgt, B, T, f.params, scale);
  EXPECT_TRUE(loss.is_ok()) << loss.status().to_string();
  *loss_out = loss.is_ok() ? *loss : NAN;
  return std::vector<float>(f.params.flat_grads().begin(), f.params.flat_grads().end());
}

TEST(LlamaGradTest, CheckpointingIsBitIdentical) {
  for (bool tied : {true, false}) {
    for (auto [B, T] : {std::pair{2, 9}, std::pair{3, 12}, std::pair{1, 1}}) {
      Fixture plain = make(micro_llama_config(tied, false), B, T);
      Fixture ckpt = make(micro_llama_config(tied, true), B, T);
      float l1 = 0, l2 = 0;
      std::vector<float> g1 = grads_of(plain, B, T, 1.0f, &l1);
      std::vector<float> g2 = grads_of(ckpt, B, T, 1.0f, &l2);
      EXPECT_EQ(std::memcmp(&l1, &l2, sizeof(float)), 0) << B << "x" << T;
      ASSERT_EQ(g1.size(), g2.size());
      EXPECT_EQ(std::memcmp(g1.data(), g2.data(), g1.size() * sizeof(float)), 0) << B << "x" << T << " tied " << tied;
    }
  }
}

// The family variants (Qwen2's q/k/v biases, Llama's attention_bias, Qwen3's q/k norms with a
// head_dim above hidden/heads, a Mistral-Nemo-like head_dim below it): checkpointing changes no
// bit, and a second instance gives the same bits.
TEST(LlamaGradTest, FamilyVariantsCheckpointBitIdentical) {
  struct Variant {
    const char* name;
    LlamaFamily family;
    bool qkv_bias, o_bias, qk_norm;
    int head_dim;
  };
  for (const Variant& v : {Variant{"qwen2", LlamaFamily::kQwen2, true, false, false, 0},
                           Variant{"llama_bias", LlamaFamily::kLlama, true, true, false, 0},
                           Variant{"qwen3", LlamaFamily::kQwen3, false, false, true, 6},
                           Variant{"nemo", LlamaFamily::kMistral, false, false, false, 2}}) {
    const int B = 2, T = 9;
    auto config = [&](bool ckpt) {
      LlamaConfig c = micro_llama_config(false, ckpt);
      c.family = v.family;
      c.qkv_bias = v.qkv_bias;
      c.o_bias = v.o_bias;
      c.qk_norm = v.qk_norm;
      c.head_dim = v.head_dim;
      return c;
    };
    ASSERT_TRUE(validate_llama_config(config(false)).is_ok()) << v.name << ": " << validate_llama_config(config(false)).to_string();
    Fixture plain = make(config(false), B, T), again = make(config(false), B, T), ckpt = make(config(true), B, T);
    float l1 = 0, l2 = 0, l3 = 0;
    std::vector<float> g1 = grads_of(plain, B, T, 1.0f, &l1);
    std::vector<float> g2 = grads_of(ckpt, B, T, 1.0f, &l2);
    std::vector<float> g3 = grads_of(again, B, T, 1.0f, &l3);
    EXPECT_TRUE(std::isfinite(l1)) << v.name;
    EXPECT_EQ(std::memcmp(&l1, &l2, sizeof(float)), 0) << v.name;
    ASSERT_EQ(g1.size(), g2.size());
    EXPECT_EQ(std::memcmp(g1.data(), g2.data(), g1.size() * sizeof(float)), 0) << v.name;
    EXPECT_EQ(std::memcmp(g1.data(), g3.data(), g1.size() * sizeof(float)), 0) << v.name;
  }
}

TEST(LlamaGradTest, PowerOfTwoLossScaleScalesGradientsExactly) {
  const int B = 2, T = 9;
  Fixture f = make(micro_llama_config(true), B, T);
  float l1 = 0, l2 = 0;
  std::vector<float> g1 = grads_of(f, B, T, 1.0f, &l1);
  std::vector<float> g2 = grads_of(f, B, T, 1024.0f, &l2);
  EXPECT_EQ(l1, l2);  // the loss itself is unscaled
  for (size_t i = 0; i < g1.size(); i++) ASSERT_EQ(g1[i] * 1024.0f, g2[i]) << i;
}

TEST(LlamaGradTest, GradientsAccumulateAcrossCalls) {
  const int B = 2, T = 9;
  Fixture f = make(micro_llama_config(false), B, T);
  float loss = 0;
  std::vector<float> once = grads_of(f, B, T, 1.0f, &loss);
  ASSERT_TRUE(f.model.forward_backward(f.in, f.tgt, B, T, f.params, 1.0f).is_ok());  // adds again
  std::span<const float> twice = f.params.flat_grads();
  float gmax = 0.0f;
  for (float g : once) gmax = std::max(gmax, std::fabs(g));
  for (size_t i = 0; i < once.size(); i++) {
    ASSERT_NEAR(twice[i], 2.0f * once[i], 1e-5f * std::fabs(once[i]) + 1e-6f * gmax) << i;
  }
}

}  // namespace
}  // namespace zinf::model
