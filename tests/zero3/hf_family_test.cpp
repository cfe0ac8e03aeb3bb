// The Llama family (Llama 3.x with RoPE scaling, Qwen2/Qwen2.5, Qwen3, Mistral) against Hugging Face
// transformers: the fixtures of scripts/fixtures/make_family_fixtures.py (tests/model/data/hf_families)
// open as HF folders, and zinf's logits, loss and gradients match transformers'; at the real models'
// width and head layout (one layer, weights from a formula both sides compute); the rotary
// frequencies of every RoPE type against transformers' ROPE_INIT_FUNCTIONS; both spellings of the
// RoPE keys. No Python here: the expected values are in the fixtures.
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
#include "zinf/model/registry.h"
#include "zinf/zero3/hf_folder.h"
#include "zinf/zero3/safetensors.h"

namespace zinf::zero3 {
namespace {

const std::string kDir = ZINF_HF_FAMILY_DIR;

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  auto j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << path;
  return j;
}

// ---- tiny models, HF's own folders --------------------------------------------------------------

class HfFamilyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFamilyTest, LogitsLossAndGradientsMatchTransformers) {
  const std::string dir = kDir + "/" + GetParam();
  auto folder = HfFolder::open(dir);
  ASSERT_TRUE(folder.is_ok()) << folder.status().to_string();
  const nlohmann::json expected = read_json(dir + "/expected.json");
  EXPECT_EQ(folder->dtype(), expected["dtype"].get<std::string>());
  auto made = folder->make_model();
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  auto* m = dynamic_cast<model::LlamaModel*>(made.value().get());
  ASSERT_NE(m, nullptr);
  auto lp = model::LocalParams::create(m->params(), m->modules());
  ASSERT_TRUE(lp.is_ok());
  for (const model::ParamSpec& p : m->params()) {
    ASSERT_TRUE(folder->read_param(static_cast<std::size_t>(p.index), lp->param(p.index)).is_ok()) << p.name;
  }
  auto tensors = SafetensorsReader::open(dir + "/expected.safetensors");
  ASSERT_TRUE(tensors.is_ok());
  const int B = expected["B"], T = expected["T"], V = m->vocab_size();
  const auto in = expected["inputs"].get<std::vector<int32_t>>();
  const auto tgt = expected["targets"].get<std::vector<int32_t>>();

  std::vector<float> logits(static_cast<size_t>(B) * T * V), hf_logits(logits.size());
  ASSERT_TRUE(tensors->read_f32("logits", hf_logits).is_ok());
  ASSERT_TRUE(m->forward_logits(in, B, T, *lp, logits).is_ok());
  double max_diff = 0.0, max_logit = 0.0;
  for (size_t i = 0; i < logits.size(); i++) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(logits[i]) - hf_logits[i]));
    max_logit = std::max(max_logit, std::fabs(static_cast<double>(hf_logits[i])));
  }
  EXPECT_GT(max_logit, 1.0);
  EXPECT_LT(max_diff, 1e-5 * max_logit);

  auto loss = m->forward_loss(in, tgt, B, T, *lp);
  ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
  const double hf32 = expected["loss_fp32"], hf64 = expected["loss_fp64"];
  EXPECT_NEAR(*loss, hf64, 1e-6 * hf64);
  EXPECT_NEAR(*loss, hf32, 1e-6 * hf32);

  auto trained = m->forward_backward(in, tgt, B, T, *lp, 1.0f);
  ASSERT_TRUE(trained.is_ok()) << trained.status().to_string();
  double worst_grad = 0.0;
  for (const model::ParamSpec& p : m->params()) {
    std::vector<float> hf_grad(p.numel);
    ASSERT_TRUE(tensors->read_f32("grad." + p.name, hf_grad).is_ok()) << p.name;
    std::span<const float> g = lp->grad(p.index);
    double gmax = 0.0, diff = 0.0;
    for (size_t i = 0; i < p.numel; i++) {
      gmax = std::max(gmax, std::fabs(static_cast<double>(hf_grad[i])));
      diff = std::max(diff, std::fabs(static_cast<double>(g[i]) - hf_grad[i]));
    }
    ASSERT_GT(gmax, 0.0) << p.name;
    worst_grad = std::max(worst_grad, diff / gmax);
    EXPECT_LT(diff, 3e-5 * gmax) << p.name;
  }
  std::printf("%s (%s) vs transformers %s: max |logit diff| %.3g (max |logit| %.3g), loss %.9g vs fp32 %.9g (rel %.3g) "
              "/ fp64 %.9g (rel %.3g), worst grad diff / max|grad| %.3g\n",
              GetParam().c_str(), m->describe().c_str(), expected["transformers"].get<std::string>().c_str(), max_diff,
              max_logit, *loss, hf32, std::fabs(*loss - hf32) / hf32, hf64, std::fabs(*loss - hf64) / hf64, worst_grad);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfFamilyTest,
                         ::testing::Values("llama32_tiny", "qwen2_tiny", "qwen3_tiny", "mistral_tiny", "mistral_nemo_tiny"),
                         [](const auto& info) { return info.param; });

// ---- real width: formula weights -----------------------------------------------------------------

// make_family_fixtures.py's formula_uniform / formula_weight, bit for bit.
uint64_t fnv1a(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char b : text) h = (h ^ b) * 0x100000001b3ull;
  return h;
}

void formula_weight(const model::ParamSpec& p, std::span<float> out) {
  const uint64_t seed = fnv1a(p.name);
  auto ends = [&](std::string_view e) { return p.name.size() >= e.size() && p.name.ends_with(e); };
  float scale = 0.0f, offset = 0.0f;
  if (ends("norm.weight")) {
    scale = 0.2f;
    offset = 1.0f;
  } else if (ends("embed_tokens.weight")) {
    scale = 0.5f;
  } else if (ends(".bias")) {
    scale = 0.3f;
  } else {
    scale = static_cast<float>(1.5 * std::sqrt(3.0) / std::sqrt(static_cast<double>(p.shape[1])));
  }
  for (size_t i = 0; i < out.size(); i++) {
    uint64_t z = seed + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(static_cast<int64_t>(z >> 40) - (1 << 23)) / static_cast<float>(1 << 23);
    out[i] = offset != 0.0f ? offset + u * scale : u * scale;
  }
}

class HfRealWidthTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfRealWidthTest, LossLogitsAndGradientSamplesMatchTransformers) {
  const std::string path = kDir + "/real_width/" + GetParam() + ".json";
  const nlohmann::json f = read_json(path);
  ASSERT_TRUE(f.is_object()) << path;
  auto config = model_config_from_hf(f["config"].dump(), path);
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  auto made = model::make_builtin_model(config.value(), path);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  model::Model& m = *made.value();
  auto lp = model::LocalParams::create(m.params(), m.modules());
  ASSERT_TRUE(lp.is_ok());
  for (const model::ParamSpec& p : m.params()) formula_weight(p, lp->param(p.index));
  const int B = f["B"], T = f["T"], V = m.vocab_size();
  const auto in = f["inputs"].get<std::vector<int32_t>>();
  const auto tgt = f["targets"].get<std::vector<int32_t>>();
  auto* llama = dynamic_cast<model::LlamaModel*>(&m);
  ASSERT_NE(llama, nullptr);

  std::vector<float> logits(static_cast<size_t>(B) * T * V);
  ASSERT_TRUE(llama->forward_logits(in, B, T, *lp, logits).is_ok());
  const double max_logit = f["max_abs_logit"];
  const auto vocab = f["logit_vocab_sample"].get<std::vector<int>>();
  double max_diff = 0.0;
  for (int t = 0; t < T; t++) {
    for (size_t k = 0; k < vocab.size(); k++) {
      const double hf = f["logits_sampled"][t][k];
      max_diff = std::max(max_diff, std::fabs(logits[static_cast<size_t>(t) * V + vocab[k]] - hf));
    }
  }
  EXPECT_LT(max_diff, 1e-5 * max_logit);

  auto loss = m.forward_loss(in, tgt, B, T, *lp);
  ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
  const double hf32 = f["loss_fp32"], hf64 = f["loss_fp64"];
  EXPECT_NEAR(*loss, hf64, 1e-5 * hf64);
  auto trained = m.forward_backward(in, tgt, B, T, *lp, 1.0f);
  ASSERT_TRUE(trained.is_ok()) << trained.status().to_string();
  double worst = 0.0;
  for (const model::ParamSpec& p : m.params()) {
    const nlohmann::json& g = f["grads"][p.name];
    ASSERT_TRUE(g.is_object()) << p.name << " has no gradient sample";
    const double gmax = g["max_abs"];
    std::span<const float> mine = lp->grad(p.index);
    for (size_t k = 0; k < g["index"].size(); k++) {
      const size_t i = g["index"][k];
      const double d = std::fabs(mine[i] - g["value"][k].get<double>());
      worst = std::max(worst, d / gmax);
      EXPECT_LT(d, 1e-4 * gmax) << p.name << "[" << i << "]";
    }
  }
  std::printf("%s (%s): max |sampled logit diff| %.3g (max |logit| %.3g), loss %.9g vs fp32 %.9g / fp64 %.9g (rel %.3g), "
              "worst sampled grad diff / max|grad| %.3g\n",
              GetParam().c_str(), m.describe().c_str(), max_diff, max_logit, *loss, hf32, hf64,
              std::fabs(*loss - hf64) / hf64, worst);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfRealWidthTest,
                         ::testing::Values("llama32_1b", "qwen25_05b", "qwen3_06b", "mistral_7b"),
                         [](const auto& info) { return info.param; });

// The GPU check's Llama-shaped (b) model: bench/gpu/llama32_3b_config.json is Llama 3.2 3B's
// config.json, so the model zinf builds from it (--model-config, without weights) has that
// model's 3,212,749,824 parameters and shapes. Its folder form reads config.json in the folder.
TEST(HfModelConfigTest, TheGpuChecksLlama3bConfigBuildsLlama32_3b) {
  auto json = model_config_from_hf_file(std::string(ZINF_BENCH_GPU_DIR) + "/llama32_3b_config.json");
  ASSERT_TRUE(json.is_ok()) << json.status().to_string();
  auto m = model::make_builtin_model(json.value(), "llama32_3b_config.json");
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  std::size_t n = 0;
  for (const model::ParamSpec& p : m.value()->params()) n += p.numel;
  EXPECT_EQ(n, 3'212'749'824u);
  EXPECT_EQ(m.value()->hidden_size(), 3072);
  const auto* llama = dynamic_cast<const model::LlamaModel*>(m.value().get());
  ASSERT_NE(llama, nullptr);
  EXPECT_EQ(llama->config().n_layer, 28);
  EXPECT_EQ(llama->config().n_kv_head, 8);

  auto folder = model_config_from_hf_file(kDir + "/llama32_tiny");
  ASSERT_TRUE(folder.is_ok()) << folder.status().to_string();
  auto missing = model_config_from_hf_file(kDir + "/no_such_folder/config.json");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("no_such_folder/config.json"), std::string::npos) << missing.status().message();
}

// The GPU check's 7B (b) model: bench/gpu/llama2_7b_config.json has Llama 2 7B's shapes
// (6,738,415,616 parameters: 32 x 4096, 32 heads of 128, SwiGLU 11008, vocabulary 32000, untied).
TEST(HfModelConfigTest, TheGpuChecks7bConfigBuildsLlama2_7b) {
  auto json = model_config_from_hf_file(std::string(ZINF_BENCH_GPU_DIR) + "/llama2_7b_config.json");
  ASSERT_TRUE(json.is_ok()) << json.status().to_string();
  auto m = model::make_builtin_model(json.value(), "llama2_7b_config.json");
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  std::size_t n = 0;
  for (const model::ParamSpec& p : m.value()->params()) n += p.numel;
  EXPECT_EQ(n, 6'738'415'616u);
  const auto* llama = dynamic_cast<const model::LlamaModel*>(m.value().get());
  ASSERT_NE(llama, nullptr);
  EXPECT_EQ(llama->config().n_layer, 32);
  EXPECT_EQ(llama->config().n_kv_head, 32);
}

// ---- RoPE ----------------------------------------------------------------------------------------

TEST(RopeScalingTest, FrequenciesMatchTransformers) {
  const nlohmann::json ref = read_json(kDir + "/rope_reference.json");
  ASSERT_TRUE(ref.contains("cases"));
  for (const nlohmann::json& c : ref["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    model::LlamaConfig l;
    l.head_dim = c["head_dim"];
    l.n_head = 4;
    l.n_kv_head = 4;
    l.n_embd = 4 * l.head_dim;
    l.head_dim = 0;
    l.max_seq = c["max_position_embeddings"];
    const nlohmann::json& rp = c["rope_parameters"];
    l.rope_theta = rp["rope_theta"];
    auto scaling = model::rope_scaling_from_json_text(rp.dump(), "rope_parameters");
    ASSERT_TRUE(scaling.is_ok()) << scaling.status().to_string();
    l.rope_scaling = scaling.value();
    ASSERT_TRUE(model::validate_llama_config(l).is_ok()) << model::validate_llama_config(l).to_string();
    const model::RopeFrequencies r = model::rope_frequencies(l, c["seq_len"]);
    const auto hf = c["inv_freq"].get<std::vector<double>>();
    ASSERT_EQ(r.inv_freq.size(), hf.size());
    double worst = 0.0;
    for (size_t i = 0; i < hf.size(); i++) worst = std::max(worst, std::fabs(r.inv_freq[i] - hf[i]) / hf[i]);
    // transformers computes in fp32: theta^(2i/d) rounded, then 1/x rounded, then the scaling.
    EXPECT_LT(worst, 2e-6);
    EXPECT_NEAR(r.attention_factor, c["attention_factor"].get<double>(), 1e-12);
  }
}

// The same model from transformers 4's rope_scaling (with "type" or "rope_type") and transformers 5's
// rope_parameters; an unknown type is refused by name.
TEST(RopeScalingTest, BothSpellingsOfTheKeys) {
  const nlohmann::json base = {{"model_type", "llama"},         {"vocab_size", 64},
                               {"hidden_size", 32},             {"intermediate_size", 48},
                               {"num_hidden_layers", 1},        {"num_attention_heads", 4},
                               {"num_key_value_heads", 2},      {"max_position_embeddings", 1024}};
  const nlohmann::json scaling = {{"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                  {"original_max_position_embeddings", 128}};
  nlohmann::json t4 = base, t4_old = base, t5 = base;
  t4["rope_theta"] = 500000.0;
  t4["rope_scaling"] = scaling;
  t4["rope_scaling"]["rope_type"] = "llama3";
  t4_old["rope_theta"] = 500000.0;
  t4_old["rope_scaling"] = scaling;
  t4_old["rope_scaling"]["type"] = "llama3";
  t5["rope_parameters"] = scaling;
  t5["rope_parameters"]["rope_type"] = "llama3";
  t5["rope_parameters"]["rope_theta"] = 500000.0;
  auto a = model_config_from_hf(t4.dump(), "t4"), b = model_config_from_hf(t4_old.dump(), "t4 old"),
       c = model_config_from_hf(t5.dump(), "t5");
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(a.value(), c.value());
  EXPECT_EQ(b.value(), c.value());
  auto l = model::llama_config_from_json(c.value(), "x");
  ASSERT_TRUE(l.is_ok());
  EXPECT_EQ(l->rope_scaling.type, model::RopeType::kLlama3);
  EXPECT_EQ(l->rope_scaling.original_max_position_embeddings, 128);
  EXPECT_EQ(l->rope_theta, 500000.0);

  nlohmann::json unknown = t5;
  unknown["rope_parameters"]["rope_type"] = "longrope";
  auto bad = model_config_from_hf(unknown.dump(), "cfg.json");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("cfg.json: \"rope_parameters\": \"rope_type\" is \"longrope\""), std::string::npos)
      << bad.status().message();
  nlohmann::json no_original = t5;
  no_original["rope_parameters"].erase("original_max_position_embeddings");
  auto bad2 = model_config_from_hf(no_original.dump(), "cfg.json");
  ASSERT_FALSE(bad2.is_ok());
  EXPECT_NE(bad2.status().message().find("original_max_position_embeddings"), std::string::npos) << bad2.status().message();
}

// Sliding windows: Mistral's applies; Qwen's only when use_sliding_window (or layer_types) says so;
// a window zinf trains must not pass it.
TEST(HfFamilyConfigTest, SlidingWindowsAndFamilies) {
  const nlohmann::json base = {{"vocab_size", 64},         {"hidden_size", 32},           {"intermediate_size", 48},
                               {"num_hidden_layers", 2},   {"num_attention_heads", 4},    {"num_key_value_heads", 2},
                               {"max_position_embeddings", 256}};
  nlohmann::json mistral = base, qwen2 = base, qwen2_sliding = base;
  mistral["model_type"] = "mistral";
  mistral["sliding_window"] = 64;
  qwen2["model_type"] = "qwen2";
  qwen2["sliding_window"] = 64;
  qwen2["use_sliding_window"] = false;
  qwen2_sliding = qwen2;
  qwen2_sliding["use_sliding_window"] = true;
  qwen2_sliding["max_window_layers"] = 1;
  for (auto [j, window] : {std::pair{mistral, 64}, std::pair{qwen2, 0}, std::pair{qwen2_sliding, 64}}) {
    auto z = model_config_from_hf(j.dump(), "cfg");
    ASSERT_TRUE(z.is_ok()) << z.status().to_string();
    auto l = model::llama_config_from_json(z.value(), "x");
    ASSERT_TRUE(l.is_ok()) << l.status().to_string();
    EXPECT_EQ(l->sliding_window, window) << j.dump();
  }
  auto z = model_config_from_hf(mistral.dump(), "cfg");
  auto m = model::make_builtin_model(z.value(), "cfg");
  ASSERT_TRUE(m.is_ok());
  const Status too_long = (*m)->reserve(1, 65);
  ASSERT_FALSE(too_long.is_ok());
  EXPECT_NE(too_long.message().find("above the model's sliding_window (64)"), std::string::npos) << too_long.message();
  EXPECT_TRUE((*m)->reserve(1, 64).is_ok());

  nlohmann::json dropout = base;
  dropout["model_type"] = "qwen3";
  dropout["attention_dropout"] = 0.1;
  auto refused = model_config_from_hf(dropout.dump(), "cfg");
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("\"attention_dropout\" is 0.1"), std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace zinf::zero3
