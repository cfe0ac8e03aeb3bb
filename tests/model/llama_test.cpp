// LlamaModel: configuration errors and JSON, the registry, HF names and shapes, the module trace
// seen by the ParamAccess, error propagation, determinism, batch errors and a short training run.
#include "zinf/model/llama.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model_test_util.h"
#include "zinf/model/registry.h"

namespace zinf::model {
namespace {

using testing::micro_llama_config;
using testing::RecordingAccess;

std::string config_error(const LlamaConfig& c) { return validate_llama_config(c).message(); }

TEST(LlamaConfigTest, ErrorsNameTheField) {
  EXPECT_TRUE(validate_llama_config(micro_llama_config(true)).is_ok());
  EXPECT_TRUE(validate_llama_config(LlamaConfig{}).is_ok());
  LlamaConfig c = micro_llama_config(true);
  c.n_kv_head = 3;
  EXPECT_EQ(config_error(c), "n_head (4) must be divisible by n_kv_head (3)");
  c.n_kv_head = 8;
  EXPECT_EQ(config_error(c), "n_kv_head (8) must be between 1 and 4");
  c.n_kv_head = 0;
  EXPECT_NE(config_error(c).find("n_kv_head (0)"), std::string::npos);
  c = micro_llama_config(true);
  c.n_head = 8;  // head_dim 2: fine; 16 / 16 = 1 is odd
  EXPECT_TRUE(validate_llama_config(c).is_ok()) << config_error(c);
  c.n_head = 16;
  c.n_kv_head = 16;
  EXPECT_EQ(config_error(c), "head_dim (n_embd / n_head = 1) must be even for rotary embeddings");
  c = micro_llama_config(true);
  c.n_head = 3;
  EXPECT_EQ(config_error(c), "n_embd (16) must be divisible by n_head (3)");
  c = micro_llama_config(true);
  c.intermediate_size = 0;
  EXPECT_NE(config_error(c).find("intermediate_size (0)"), std::string::npos);
  c = micro_llama_config(true);
  c.rms_norm_eps = 0.0;
  EXPECT_EQ(config_error(c), "rms_norm_eps (0) must be a finite number > 0");
  c = micro_llama_config(true);
  c.rope_theta = NAN;
  EXPECT_NE(config_error(c).find("rope_theta (nan)"), std::string::npos);
  c = micro_llama_config(true);
  c.vocab_size = 0;
  EXPECT_NE(config_error(c).find("vocab_size (0)"), std::string::npos);
  c = micro_llama_config(true);
  c.max_seq = -2;
  EXPECT_NE(config_error(c).find("max_seq (-2)"), std::string::npos);
  c = micro_llama_config(true);
  c.n_layer = 0;
  auto made = LlamaModel::create(c);
  ASSERT_FALSE(made.is_ok());
  EXPECT_EQ(made.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("n_layer (0)"), std::string::npos);
}

TEST(LlamaConfigTest, JsonRoundTripsExactlyAndLeavesCheckpointingOut) {
  LlamaConfig c = micro_llama_config(false, /*checkpointing=*/true);
  c.rms_norm_eps = 1e-6;  // not exact in binary: must come back with the same bits
  c.rope_theta = 500000.0;
  const std::string text = llama_config_json(c);
  EXPECT_EQ(text,
            R"({"intermediate_size":24,"max_seq":12,"n_embd":16,"n_head":4,"n_kv_head":2,"n_layer":2,)"
            R"("rms_norm_eps":1e-06,"rope_theta":500000.0,"tie_word_embeddings":false,"type":"llama","vocab_size":37})");
  auto back = llama_config_from_json(text, "test");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  c.activation_checkpointing = false;
  EXPECT_EQ(back.value(), c);
  EXPECT_EQ(testing::make_llama(c).config_json(), text);
}

TEST(LlamaConfigTest, JsonErrorsNameTheKey) {
  const std::string good = llama_config_json(micro_llama_config(true));
  auto edited = [&](const char* key, nlohmann::json value) {
    auto j = nlohmann::json::parse(good);
    if (value.is_discarded()) {
      j.erase(key);
    } else {
      j[key] = value;
    }
    return llama_config_from_json(j.dump(), "engine.json").status().message();
  };
  const nlohmann::json erase(nlohmann::json::value_t::discarded);
  EXPECT_NE(edited("n_kv_head", erase).find("engine.json: model key \"n_kv_head\" must be an integer, found nothing"),
            std::string::npos);
  EXPECT_NE(edited("n_layer", "2").find("\"n_layer\" must be an integer, found \"2\""), std::string::npos);
  EXPECT_NE(edited("n_layer", 4294967298).find("n_layer"), std::string::npos);
  EXPECT_NE(edited("rope_theta", "big").find("\"rope_theta\" must be a number"), std::string::npos);
  EXPECT_NE(edited("tie_word_embeddings", 1).find("\"tie_word_embeddings\" must be true or false, found 1"),
            std::string::npos);
  EXPECT_NE(edited("type", "gpt").find("model type \"gpt\" is not \"llama\""), std::string::npos);
  EXPECT_NE(edited("n_kv_head", 3).find("engine.json: n_head (4) must be divisible by n_kv_head (3)"),
            std::string::npos);
  EXPECT_TRUE(llama_config_from_json(nlohmann::json::parse(good).dump(), "x").is_ok());
  EXPECT_EQ(edited("rope_theta", 10000).find("rope_theta"), std::string::npos);  // an integer is a number
  EXPECT_NE(llama_config_from_json("[1,", "engine.json").status().message().find("not a JSON object"),
            std::string::npos);
}

TEST(LlamaModelTest, RegistryBuildsItFromItsRecordedConfig) {
  EXPECT_EQ(builtin_model_types(), (std::vector<std::string>{"gpt", "llama"}));
  for (bool tied : {true, false}) {
    LlamaModel m = testing::make_llama(micro_llama_config(tied));
    auto made = make_builtin_model(m.config_json(), "ckpt/engine.json");
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    EXPECT_EQ((*made)->type(), "llama");
    EXPECT_EQ((*made)->config_json(), m.config_json());
    ASSERT_EQ((*made)->params().size(), m.params().size());
    for (size_t i = 0; i < m.params().size(); ++i) EXPECT_EQ((*made)->params()[i].name, m.params()[i].name);
  }
  auto bad = make_builtin_model(R"({"type":"llama","vocab_size":37})", "ckpt/engine.json");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("ckpt/engine.json: model key \"max_seq\""), std::string::npos)
      << bad.status().message();
}

TEST(LlamaModelTest, HuggingFaceNamesShapesAndModules) {
  LlamaConfig c = micro_llama_config(false);
  LlamaModel m = testing::make_llama(c);
  ASSERT_TRUE(validate_layout(m).is_ok()) << validate_layout(m).to_string();
  EXPECT_EQ(m.describe(), "llama: 2 layers, hidden 16, 4 heads (2 kv), intermediate 24, max positions 12, vocab 37, untied head");
  std::vector<std::string> names;
  for (const ParamSpec& p : m.params()) names.push_back(p.name);
  const std::vector<std::string> layer0 = {
      "model.layers.0.input_layernorm.weight",          "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.k_proj.weight",         "model.layers.0.self_attn.v_proj.weight",
      "model.layers.0.self_attn.o_proj.weight",         "model.layers.0.post_attention_layernorm.weight",
      "model.layers.0.mlp.gate_proj.weight",            "model.layers.0.mlp.up_proj.weight",
      "model.layers.0.mlp.down_proj.weight"};
  ASSERT_EQ(names.size(), 21u);
  EXPECT_EQ(names[0], "model.embed_tokens.weight");
  EXPECT_EQ(std::vector<std::string>(names.begin() + 1, names.begin() + 10), layer0);
  EXPECT_EQ(names[19], "model.norm.weight");
  EXPECT_EQ(names[20], "lm_head.weight");
  using Shape = std::vector<int64_t>;
  EXPECT_EQ(m.params()[0].shape, (Shape{37, 16}));
  EXPECT_EQ(m.params()[2].shape, (Shape{16, 16}));  // q_proj [out, in]
  EXPECT_EQ(m.params()[3].shape, (Shape{8, 16}));   // k_proj: 2 kv heads of 4
  EXPECT_EQ(m.params()[7].shape, (Shape{24, 16}));  // gate_proj
  EXPECT_EQ(m.params()[9].shape, (Shape{16, 24}));  // down_proj
  EXPECT_EQ(m.params()[20].shape, (Shape{37, 16}));
  EXPECT_EQ(m.num_params(), llama_num_params(c));
  EXPECT_EQ(m.num_params(), 2u * 37 * 16 + 2 * (2 * 16 * 16 + 2 * 8 * 16 + 3 * 24 * 16 + 2 * 16) + 16);

  std::vector<std::string> modules;
  for (const ModuleSpec& s : m.modules()) modules.push_back(s.name);
  ASSERT_EQ(modules.size(), 11u);
  EXPECT_EQ(modules[0], "model.embed_tokens");
  EXPECT_EQ(modules[1], "model.layers.0.input_layernorm");
  EXPECT_EQ(modules[2], "model.layers.0.self_attn");
  EXPECT_EQ(modules[3], "model.layers.0.post_attention_layernorm");
  EXPECT_EQ(modules[8], "model.layers.1.mlp");
  EXPECT_EQ(modules[9], "model.norm");
  EXPECT_EQ(modules[10], "lm_head");
  EXPECT_FALSE(m.modules()[0].backward_reads_values);
  EXPECT_EQ(m.modules()[2].params, (std::vector<int>{2, 3, 4, 5}));
  EXPECT_EQ(m.modules()[10].params, std::vector<int>{20});

  // Tied: no lm_head.weight; the head lists embed_tokens, which the embedding module owns.
  LlamaConfig tc = micro_llama_config(true);
  LlamaModel tied = testing::make_llama(tc);
  ASSERT_TRUE(validate_layout(tied).is_ok());
  EXPECT_EQ(tied.params().size(), 20u);
  EXPECT_EQ(tied.params().back().name, "model.norm.weight");
  EXPECT_EQ(tied.modules().back().params, std::vector<int>{0});
  EXPECT_EQ(tied.params()[0].module, 0);
  EXPECT_EQ(tied.num_params(), llama_num_params(tc));
  EXPECT_EQ(tied.num_params() + 37 * 16, m.num_params());
}

// Meta's Llama-2-7B and Llama-3-8B shapes: HF's parameter counts.
TEST(LlamaModelTest, ParameterCountsOfKnownModels) {
  LlamaConfig l2;
  l2.vocab_size = 32000;
  l2.max_seq = 4096;
  l2.n_layer = 32;
  l2.n_head = 32;
  l2.n_kv_head = 32;
  l2.n_embd = 4096;
  l2.intermediate_size = 11008;
  EXPECT_EQ(llama_num_params(l2), 6738415616u);
  LlamaConfig l3 = l2;
  l3.vocab_size = 128256;
  l3.n_kv_head = 8;
  l3.intermediate_size = 14336;
  l3.rope_theta = 500000.0;
  EXPECT_EQ(llama_num_params(l3), 8030261248u);
}

// The contract of params.h, as for GPT: forward in module order, backward in reverse with the
// embedding's values not fetched, checkpoint recompute of every block but the last.
std::vector<std::string> expected_trace(const LlamaModel& model) {
  const int L = model.config().n_layer;
  const int M = static_cast<int>(model.modules().size());
  std::vector<std::string> t;
  auto fwd = [&](int m, const char* ph) {
    t.push_back(fmt::format("acquire {} {}", m, ph));
    t.push_back(fmt::format("release {} {}", m, ph));
  };
  auto bwd = [&](int m, bool reads) {
    if (reads) t.push_back(fmt::format("acquire {} backward", m));
    t.push_back(fmt::format("grads {}", m));
    if (reads) t.push_back(fmt::format("release {} backward", m));
    t.push_back(fmt::format("ready {}", m));
  };
  for (int m = 0; m < M; m++) fwd(m, "forward");
  bwd(M - 1, true);
  bwd(M - 2, true);
  for (int l = L - 1; l >= 0; l--) {
    if (model.config().activation_checkpointing && l != L - 1) {
      for (int k = 0; k < 4; k++) fwd(1 + 4 * l + k, "recompute");
    }
    for (int k = 3; k >= 0; k--) bwd(1 + 4 * l + k, true);
  }
  bwd(0, false);
  return t;
}

TEST(LlamaModelTest, AccessTraceFollowsModuleOrder) {
  for (bool tied : {true, false}) {
    for (bool ckpt : {false, true}) {
      LlamaConfig c = micro_llama_config(tied, ckpt);
      c.n_layer = 3;
      LlamaModel model = testing::make_llama(c);
      Result<LocalParams> lp = LocalParams::create(model.params(), model.modules());
      ASSERT_TRUE(lp.is_ok());
      lp->init(1);
      RecordingAccess rec(&*lp);
      std::vector<int32_t> in = testing::random_tokens(1, 8, c.vocab_size);
      ASSERT_TRUE(model.forward_backward(in, in, 2, 4, rec, 1.0f).is_ok());
      EXPECT_EQ(rec.log, expected_trace(model)) << "tied " << tied << " checkpointing " << ckpt;
      EXPECT_EQ(rec.held, 0);
      rec.log.clear();
      ASSERT_TRUE(model.forward_loss(in, in, 2, 4, rec).is_ok());
      ASSERT_EQ(rec.log.size(), 2 * model.modules().size());
      for (size_t m = 0; m < model.modules().size(); m++) EXPECT_EQ(rec.log[2 * m], fmt::format("acquire {} eval", m));
    }
  }
}

TEST(LlamaModelTest, AccessErrorsPropagateAndReleaseWhatWasAcquired) {
  LlamaModel model = testing::make_llama(micro_llama_config(true, true));
  Result<LocalParams> lp = LocalParams::create(model.params(), model.modules());
  ASSERT_TRUE(lp.is_ok());
  lp->init(1);
  std::vector<int32_t> in = testing::random_tokens(1, 8, 37);
  for (int n = 0;; n++) {
    RecordingAccess rec(&*lp);
    rec.fail_at = n;
    Result<float> r = model.forward_backward(in, in, 2, 4, rec, 1.0f);
    if (r.is_ok()) {
      EXPECT_GT(n, 20);  // every acquire/grad_buffers call was made to fail once
      break;
    }
    EXPECT_EQ(r.status().code(), ErrorCode::kIoError);
    EXPECT_NE(r.status().message().find("/nvme/p.swp"), std::string::npos);
    const std::string msg = r.status().message();
    EXPECT_TRUE(std::any_of(model.modules().begin(), model.modules().end(),
                            [&](const ModuleSpec& m) { return msg.find(m.name + " ") != std::string::npos; }))
        << msg;  // names the module
    EXPECT_EQ(rec.held, 0) << "call " << n << ": " << r.status().to_string();
  }
}

TEST(LlamaModelTest, DeterministicAcrossRunsInstancesAndBufferSizes) {
  const int B = 3, T = 10;
  std::vector<int32_t> in = testing::random_tokens(3, B * T, 37), tgt = testing::random_tokens(4, B * T, 37);
  std::vector<float> first_grads;
  float first_loss = 0;
  for (int run = 0; run < 3; run++) {
    LlamaModel model = testing::make_llama(micro_llama_config(false));
    Result<LocalParams> lp = LocalParams::create(model.params(), model.modules());
    ASSERT_TRUE(lp.is_ok());
    testing::randomize(*lp, model.params(), 5);
    if (run == 2) {  // larger buffers first, then the pass at (B, T)
      std::vector<int32_t> big = testing::random_tokens(9, 4 * 12, 37);
      ASSERT_TRUE(model.forward_backward(big, big, 4, 12, *lp, 1.0f).is_ok());
      lp->zero_grads();
    }
    Result<float> loss = model.forward_backward(in, tgt, B, T, *lp, 1.0f);
    ASSERT_TRUE(loss.is_ok());
    if (run == 0) {
      first_loss = *loss;
      first_grads.assign(lp->flat_grads().begin(), lp->flat_grads().end());
      continue;
    }
    EXPECT_EQ(std::memcmp(&first_loss, &*loss, sizeof(float)), 0) << run;
    EXPECT_EQ(std::memcmp(first_grads.data(), lp->flat_grads().data(), first_grads.size() * sizeof(float)), 0) << run;
    Result<float> eval = model.forward_loss(in, tgt, B, T, *lp);
    ASSERT_TRUE(eval.is_ok());
    EXPECT_EQ(std::memcmp(&first_loss, &*eval, sizeof(float)), 0);
  }
}

TEST(LlamaModelTest, BatchAndLogitsErrors) {
  LlamaModel model = testing::make_llama(micro_llama_config(true));
  Result<LocalParams> lp = LocalParams::create(model.params(), model.modules());
  ASSERT_TRUE(lp.is_ok());
  std::vector<int32_t> ok(2 * 4, 1), bad = ok;
  bad[5] = 37;
  EXPECT_NE(model.forward_backward(bad, ok, 2, 4, *lp, 1.0f).status().message().find("inputs[5] = 37"),
            std::string::npos);
  EXPECT_NE(model.forward_loss(ok, bad, 2, 4, *lp).status().message().find("targets[5]"), std::string::npos);
  std::vector<int32_t> long_seq(13, 1);
  EXPECT_NE(model.forward_loss(long_seq, long_seq, 1, 13, *lp).status().message().find("max_seq"),
            std::string::npos);
  std::vector<float> logits(2 * 4 * 37);
  EXPECT_NE(model.forward_logits(bad, 2, 4, *lp, logits).message().find("inputs[5] = 37"), std::string::npos);
  std::vector<float> short_out(10);
  EXPECT_NE(model.forward_logits(ok, 2, 4, *lp, short_out).message().find("holds 10 floats, (B, T, vocab_size) is 296"),
            std::string::npos);
  EXPECT_EQ(model.reserve(1, 13).code(), ErrorCode::kInvalidArgument);
  EXPECT_GT(model.activation_bytes(2, 12), model.activation_bytes(2, 6));
  LlamaModel ckpt = testing::make_llama(micro_llama_config(true, true));
  EXPECT_LT(ckpt.activation_bytes(2, 12), model.activation_bytes(2, 12));
}

// The logits forward_logits returns give the loss forward_loss returns.
TEST(LlamaModelTest, LogitsAgreeWithTheLoss) {
  LlamaModel model = testing::make_llama(micro_llama_config(false));
  Result<LocalParams> lp = LocalParams::create(model.params(), model.modules());
  ASSERT_TRUE(lp.is_ok());
  testing::randomize(*lp, model.params(), 3);
  const int B = 2, T = 7, V = 37;
  std::vector<int32_t> in = testing::random_tokens(1, B * T, V), tgt = testing::random_tokens(2, B * T, V);
  std::vector<float> logits(B * T * V);
  ASSERT_TRUE(model.forward_logits(in, B, T, *lp, logits).is_ok());
  double sum = 0.0;
  for (int n = 0; n < B * T; n++) {
    double maxv = -1e300, z = 0.0;
    for (int v = 0; v < V; v++) maxv = std::max(maxv, static_cast<double>(logits[n * V + v]));
    for (int v = 0; v < V; v++) z += std::exp(logits[n * V + v] - maxv);
    sum += maxv + std::log(z) - logits[n * V + tgt[n]];
  }
  Result<float> loss = model.forward_loss(in, tgt, B, T, *lp);
  ASSERT_TRUE(loss.is_ok());
  EXPECT_NEAR(*loss, sum / (B * T), 1e-6 * *loss);
}

// 30 Adam steps on one repeated sentence from HF-style init (normal 0.02, norms 1).
TEST(LlamaModelTest, TrainingLowersTheLoss) {
  LlamaConfig c;
  c.vocab_size = 256;
  c.max_seq = 32;
  c.n_embd = 64;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.intermediate_size = 172;
  c.activation_checkpointing = true;
  LlamaModel model = testing::make_llama(c);
  Result<LocalParams> lp = LocalParams::create(model.params(), model.modules());
  ASSERT_TRUE(lp.is_ok());
  lp->init(7);
  const std::string text = "the quick brown fox jumps over the lazy dog. ";
  const int B = 4, T = 32;
  std::vector<int32_t> in(B * T), tgt(B * T);
  for (int i = 0; i < B * T; i++) {
    const size_t pos = i % T + 7 * (i / T);
    in[i] = static_cast<unsigned char>(text[pos % text.size()]);
    tgt[i] = static_cast<unsigned char>(text[(pos + 1) % text.size()]);
  }
  std::vector<float> m(lp->num_params(), 0.0f), v(lp->num_params(), 0.0f);
  float first = 0, last = 0;
  for (int step = 1; step <= 30; step++) {
    lp->zero_grads();
    Result<float> loss = model.forward_backward(in, tgt, B, T, *lp, 1.0f);
    ASSERT_TRUE(loss.is_ok());
    if (step == 1) first = *loss;
    last = *loss;
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    const float bc1 = 1.0f - std::pow(b1, step), bc2 = 1.0f - std::pow(b2, step);
    std::span<float> p = lp->flat_params();
    std::span<const float> g = lp->flat_grads();
    for (size_t i = 0; i < p.size(); i++) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      p[i] -= lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps);
    }
  }
  std::printf("llama loss %.3f -> %.3f after 30 steps\n", first, last);
  EXPECT_NEAR(first, std::log(256.0), 0.1);
  EXPECT_LT(last, 0.5f * first);
}

}  // namespace
}  // namespace zinf::model
