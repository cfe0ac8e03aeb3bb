// LlamaModel against Hugging Face transformers: the tiny random LlamaForCausalLM fixtures
// (tests/model/data/llama_tiny, made by scripts/fixtures/make_llama_fixture.py) load by HF name
// from HF's own model.safetensors, and zinf's logits, mean loss and gradients match the ones
// transformers computed. No Python here: the expected values are in the fixture.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zinf/model/llama.h"
#include "zinf/model/local_params.h"
#include "zinf/zero3/safetensors.h"

namespace zinf::zero3 {
namespace {

using model::LlamaConfig;
using model::LlamaModel;
using model::LocalParams;

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  auto j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << path;
  return j;
}

// HF config.json -> LlamaConfig, field by field (transformers 5 nests rope_theta in
// rope_parameters). The fixture must be a plain Llama: no biases, SiLU, default head_dim.
LlamaConfig from_hf(const nlohmann::json& hf) {
  LlamaConfig c;
  c.vocab_size = hf.at("vocab_size").get<int>();
  c.max_seq = hf.at("max_position_embeddings").get<int>();
  c.n_layer = hf.at("num_hidden_layers").get<int>();
  c.n_head = hf.at("num_attention_heads").get<int>();
  c.n_kv_head = hf.at("num_key_value_heads").get<int>();
  c.n_embd = hf.at("hidden_size").get<int>();
  c.intermediate_size = hf.at("intermediate_size").get<int>();
  c.rms_norm_eps = hf.at("rms_norm_eps").get<double>();
  c.rope_theta = hf.contains("rope_parameters") ? hf["rope_parameters"].at("rope_theta").get<double>()
                                                : hf.at("rope_theta").get<double>();
  c.tie_word_embeddings = hf.at("tie_word_embeddings").get<bool>();
  EXPECT_EQ(hf.at("hidden_act"), "silu");
  EXPECT_EQ(hf.at("attention_bias"), false);
  EXPECT_EQ(hf.at("mlp_bias"), false);
  EXPECT_EQ(hf.at("head_dim").get<int>(), c.n_embd / c.n_head);
  return c;
}

struct Loaded {
  std::unique_ptr<LlamaModel> model;
  LocalParams params;
  nlohmann::json expected;
  SafetensorsReader expected_tensors;
};

// Builds the model from config.json and loads HF's weights by name into LocalParams.
Loaded load(const std::string& variant) {
  const std::string dir = std::string(ZINF_LLAMA_FIXTURE_DIR) + "/" + variant;
  const LlamaConfig c = from_hf(read_json(dir + "/config.json"));
  auto m = LlamaModel::create(c);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  auto lp = LocalParams::create((*m)->params(), (*m)->modules());
  EXPECT_TRUE(lp.is_ok());
  auto weights = SafetensorsReader::open(dir + "/model.safetensors");
  EXPECT_TRUE(weights.is_ok()) << weights.status().to_string();
  // Exactly HF's tensors: every zinf parameter by its HF name and shape, nothing left over.
  EXPECT_EQ(weights->entries().size(), (*m)->params().size());
  for (const model::ParamSpec& p : (*m)->params()) {
    const SafetensorsEntry* e = weights->find(p.name);
    EXPECT_NE(e, nullptr) << p.name;
    if (e == nullptr) continue;
    EXPECT_EQ(e->shape, p.shape) << p.name;
    EXPECT_TRUE(weights->read_f32(p.name, lp->param(p.index)).is_ok()) << p.name;
  }
  auto expected = SafetensorsReader::open(dir + "/expected.safetensors");
  EXPECT_TRUE(expected.is_ok()) << expected.status().to_string();
  return Loaded{std::move(m).value(), std::move(lp).value(), read_json(dir + "/expected.json"),
                std::move(expected).value()};
}

class LlamaHfTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaHfTest, LogitsLossAndGradientsMatchTransformers) {
  Loaded f = load(GetParam());
  ASSERT_NE(f.model, nullptr);
  EXPECT_EQ(f.model->config().tie_word_embeddings, f.expected["tie_word_embeddings"].get<bool>());
  const int B = f.expected["B"], T = f.expected["T"], V = f.model->vocab_size();
  const auto in = f.expected["inputs"].get<std::vector<int32_t>>();
  const auto tgt = f.expected["targets"].get<std::vector<int32_t>>();

  // Logits: fp32 against HF's fp32, all (B, T, V) of them.
  std::vector<float> logits(static_cast<size_t>(B) * T * V), hf_logits(logits.size());
  ASSERT_TRUE(f.expected_tensors.read_f32("logits", hf_logits).is_ok());
  ASSERT_TRUE(f.model->forward_logits(in, B, T, f.params, logits).is_ok());
  double max_diff = 0.0, max_logit = 0.0;
  for (size_t i = 0; i < logits.size(); i++) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(logits[i]) - hf_logits[i]));
    max_logit = std::max(max_logit, std::fabs(static_cast<double>(hf_logits[i])));
  }
  // fp32 against fp32 with different summation orders. Measured: 1e-5 and 5e-6 (1.1e-6 and
  // 0.9e-6 of the largest logit), the size of HF's own fp32-vs-fp64 difference that the fixture
  // records (8e-6, 4e-6); a wrong RoPE pairing or frequency moves logits by 1e-1 and more.
  EXPECT_LT(max_diff, 1e-5 * max_logit);
  EXPECT_GT(max_logit, 1.0);  // logits that mean something

  // Mean loss: within 1e-4 relative (measured 8e-8 against HF fp32, 2e-8 against fp64).
  auto loss = f.model->forward_loss(in, tgt, B, T, f.params);
  ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
  const double hf32 = f.expected["loss_fp32"], hf64 = f.expected["loss_fp64"];
  EXPECT_NEAR(*loss, hf32, 1e-4 * hf32);
  EXPECT_NEAR(*loss, hf64, 1e-4 * hf64);

  // Gradients of the mean loss against torch autograd's, per tensor relative to its largest.
  auto trained = f.model->forward_backward(in, tgt, B, T, f.params, 1.0f);
  ASSERT_TRUE(trained.is_ok()) << trained.status().to_string();
  EXPECT_EQ(*trained, *loss);
  double worst_grad = 0.0;
  for (const model::ParamSpec& p : f.model->params()) {
    std::vector<float> hf_grad(p.numel);
    ASSERT_TRUE(f.expected_tensors.read_f32("grad." + p.name, hf_grad).is_ok()) << p.name;
    std::span<const float> g = f.params.grad(p.index);
    double gmax = 0.0, diff = 0.0;
    for (size_t i = 0; i < p.numel; i++) {
      gmax = std::max(gmax, std::fabs(static_cast<double>(hf_grad[i])));
      diff = std::max(diff, std::fabs(static_cast<double>(g[i]) - hf_grad[i]));
    }
    ASSERT_GT(gmax, 0.0) << p.name;
    worst_grad = std::max(worst_grad, diff / gmax);
    EXPECT_LT(diff, 3e-5 * gmax) << p.name;  // measured worst 2.8e-6
  }
  std::printf("%s vs transformers %s: max |logit diff| %.3g (max |logit| %.3g), loss %.9g vs fp32 %.9g "
              "(rel %.3g) / fp64 %.9g (rel %.3g), worst grad diff / max|grad| %.3g\n",
              GetParam().c_str(), f.expected["transformers"].get<std::string>().c_str(), max_diff, max_logit, *loss,
              hf32, std::fabs(*loss - hf32) / hf32, hf64, std::fabs(*loss - hf64) / hf64, worst_grad);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LlamaHfTest, ::testing::Values("tied", "untied"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace zinf::zero3
