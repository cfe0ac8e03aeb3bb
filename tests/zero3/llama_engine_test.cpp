// LlamaModel under the ZeRO-3 engine: a tiny Llama (grouped-query attention, tied or untied head)
// trains with identical results in memory, on CPU and on NVMe, with or without activation
// checkpointing; its checkpoints resume bit-identically, record the model so the registry
// rebuilds it, and consolidate to a safetensors file with Hugging Face's tensor names.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine_harness.h"
#include "temp_dir.h"
#include "zinf/config/ds_config.h"
#include "zinf/model/llama.h"
#include "zinf/model/registry.h"
#include "zinf/zero3/checkpoint.h"
#include "zinf/zero3/engine.h"
#include "zinf/zero3/safetensors.h"

namespace zinf::zero3 {
namespace {

using zinf::testing::TempDir;
namespace testing = zinf::zero3::testing;

using testing::kB;
using testing::kT;
constexpr int kVocab = 40;

model::LlamaConfig tiny(bool tied, bool checkpointing = false) {
  model::LlamaConfig c;
  c.vocab_size = kVocab;
  c.max_seq = kT;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 16;
  c.intermediate_size = 24;
  c.tie_word_embeddings = tied;
  c.activation_checkpointing = checkpointing;
  return c;
}

std::unique_ptr<model::Model> llama(const model::LlamaConfig& c) {
  return std::move(model::LlamaModel::create(c)).value();
}

using testing::EngineRun;
using testing::ds_config;
using testing::weights;

Result<std::vector<double>> train(Engine& e, int from, int to) { return testing::train(e, from, to, kVocab); }

class LlamaEngineTest : public ::testing::TestWithParam<bool> {};  // tied head

TEST_P(LlamaEngineTest, TrainsIdenticallyInMemoryOnCpuAndOnNvmeWithOrWithoutCheckpointing) {
  const bool tied = GetParam();
  std::vector<std::vector<double>> losses;
  std::vector<std::vector<std::vector<float>>> final;
  for (auto [device, ckpt] : {std::pair{"none", false}, std::pair{"cpu", false}, std::pair{"nvme", false},
                              std::pair{"nvme", true}}) {
    TempDir nvme;
    EngineRun run(llama(tiny(tied, ckpt)), ds_config(device, nvme.path()));
    ASSERT_NE(run.engine, nullptr);
    auto l = train(*run.engine, 0, 6);
    ASSERT_TRUE(l.is_ok()) << device << ": " << l.status().to_string();
    losses.push_back(l.value());
    final.push_back(weights(*run.engine));
  }
  EXPECT_LT(losses[0][4], losses[0][0] - 0.1);  // the same batch, four updates later
  for (std::size_t k = 1; k < losses.size(); ++k) {
    EXPECT_EQ(losses[k], losses[0]) << k;
    EXPECT_EQ(final[k], final[0]) << k;
  }
  std::printf("llama tied=%d: loss %.4f -> %.4f (step 0 -> 4, same batch)\n", tied, losses[0][0], losses[0][4]);
}

TEST_P(LlamaEngineTest, CheckpointsResumeBitIdenticallyAndConsolidateWithHfNames) {
  const bool tied = GetParam();
  TempDir nvme, ckpt;
  const auto ds = ds_config("nvme", nvme.path());
  std::vector<double> straight;
  {
    EngineRun run(llama(tiny(tied)), ds);
    ASSERT_NE(run.engine, nullptr);
    ASSERT_TRUE(train(*run.engine, 0, 3).is_ok());
    ASSERT_TRUE(run.engine->save_checkpoint(ckpt.path(), "step3", "{}").is_ok());
    auto rest = train(*run.engine, 3, 6);
    ASSERT_TRUE(rest.is_ok());
    straight = rest.value();
  }
  // engine.json records the architecture; the registry rebuilds the same model from it.
  std::ifstream f(ckpt.path() + "/step3/engine.json");
  std::stringstream text;
  text << f.rdbuf();
  const auto j = nlohmann::json::parse(text.str());
  EXPECT_EQ(j["model"]["type"], "llama");
  EXPECT_EQ(j["model"]["tie_word_embeddings"], tied);
  auto rebuilt = model::make_builtin_model(j["model"].dump(), "engine.json");
  ASSERT_TRUE(rebuilt.is_ok()) << rebuilt.status().to_string();
  EXPECT_EQ((*rebuilt)->config_json(), llama(tiny(tied))->config_json());

  // Resume into a model with activation checkpointing: a run-time choice, not part of the model.
  EngineRun resumed(llama(tiny(tied, /*checkpointing=*/true)), ds);
  ASSERT_NE(resumed.engine, nullptr);
  auto client = resumed.engine->load_checkpoint(ckpt.path(), "");
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  const auto at_save = weights(*resumed.engine);
  auto rest = train(*resumed.engine, 3, 6);
  ASSERT_TRUE(rest.is_ok());
  EXPECT_EQ(rest.value(), straight);

  // Consolidated weights carry HF LlamaForCausalLM's names: a tied model has no lm_head.weight.
  const std::string st = ckpt.file("llama.safetensors");
  ASSERT_TRUE(consolidate_checkpoint(ckpt.path(), st).is_ok());
  auto reader = SafetensorsReader::open(st);
  ASSERT_TRUE(reader.is_ok());
  EXPECT_EQ(reader->entries().size(), tied ? 20u : 21u);
  EXPECT_EQ(reader->find("lm_head.weight") != nullptr, !tied);
  ASSERT_NE(reader->find("model.layers.1.self_attn.k_proj.weight"), nullptr);
  EXPECT_EQ(reader->find("model.layers.1.self_attn.k_proj.weight")->shape, (std::vector<std::int64_t>{8, 16}));
  for (std::size_t p = 0; p < at_save.size(); ++p) {
    std::vector<float> w(at_save[p].size());
    const std::string name = resumed.engine->model().params()[p].name;
    ASSERT_TRUE(reader->read_f32(name, w).is_ok()) << name;
    EXPECT_EQ(w, at_save[p]) << name;
  }
}

TEST(LlamaEngineTest, ACheckpointOfAnotherLlamaIsRefusedByName) {
  TempDir nvme, ckpt;
  const auto ds = ds_config("cpu", nvme.path());
  {
    EngineRun run(llama(tiny(true)), ds);
    ASSERT_NE(run.engine, nullptr);
    ASSERT_TRUE(train(*run.engine, 0, 1).is_ok());
    ASSERT_TRUE(run.engine->save_checkpoint(ckpt.path(), "a", "{}").is_ok());
  }
  EngineRun other(llama(tiny(false)), ds);
  ASSERT_NE(other.engine, nullptr);
  auto loaded = other.engine->load_checkpoint(ckpt.path(), "a");
  ASSERT_FALSE(loaded.is_ok());
  EXPECT_NE(loaded.status().message().find("\"tie_word_embeddings\":true"), std::string::npos)
      << loaded.status().message();
}

INSTANTIATE_TEST_SUITE_P(Head, LlamaEngineTest, ::testing::Values(true, false),
                         [](const auto& info) { return std::string(info.param ? "tied" : "untied"); });

}  // namespace
}  // namespace zinf::zero3
