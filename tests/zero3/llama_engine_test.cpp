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

constexpr int kB = 2, kT = 8, kVocab = 40;

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

// Parameters offloaded to `device` ("none", "cpu" or "nvme"), optimizer state likewise (NVMe
// parameters keep optimizer state on NVMe). Small buckets so that modules span several.
config::DsConfig ds_config(const std::string& device, const std::string& nvme) {
  const std::string op = device == "nvme" ? fmt::format(
                                                R"({{"device": "nvme", "nvme_path": "{}", "buffer_count": 3, "buffer_size": 1024, "max_in_cpu": 0}})",
                                                nvme)
                                          : R"({"device": "none"})";
  const std::string oo = device == "none" ? R"({"device": "none"})"
                                          : fmt::format(R"({{"device": "{}", "nvme_path": "{}"}})", device, nvme);
  const std::string text = fmt::format(R"({{
    "train_micro_batch_size_per_gpu": {B}, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
    "bf16": {{"enabled": true}},
    "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}}}},
    "zero_optimization": {{"stage": 3, "sub_group_size": 300, "reduce_bucket_size": 200,
      "stage3_prefetch_bucket_size": 500, "stage3_param_persistence_threshold": 16,
      "offload_param": {op}, "offload_optimizer": {oo}}},
    "aio": {{"block_size": 65536, "queue_depth": 4}}
  }})",
                                       fmt::arg("B", kB), fmt::arg("op", op), fmt::arg("oo", oo));
  auto ds = config::parse_ds_config(text, "llama_engine_test", config::AutoContext{});
  EXPECT_TRUE(ds.is_ok()) << ds.status().to_string();
  return ds.value();
}

// Two micro-batches for `step`, a function of the step alone (two alternating batches).
std::vector<std::vector<std::int32_t>> batch(int step) {
  std::vector<std::vector<std::int32_t>> rows(2, std::vector<std::int32_t>(kB * kT + 1));
  for (int g = 0; g < 2; ++g) {
    for (std::size_t i = 0; i < rows[g].size(); ++i) {
      rows[g][i] = static_cast<std::int32_t>(((step % 2) * 7 + g * 3 + i * i) % kVocab);
    }
  }
  return rows;
}

Result<std::vector<double>> train(Engine& e, int from, int to) {
  std::vector<double> losses;
  for (int step = from; step < to; ++step) {
    const auto rows = batch(step);
    std::vector<MicroBatch> micro;
    for (const auto& r : rows) {
      micro.push_back({std::span<const std::int32_t>(r.data(), kB * kT),
                       std::span<const std::int32_t>(r.data() + 1, kB * kT), kB, kT});
    }
    ZINF_ASSIGN_OR_RETURN(StepReport rep, e.train_step(micro));
    losses.push_back(rep.loss);
  }
  return losses;
}

std::vector<std::vector<float>> weights(Engine& e) {
  std::vector<std::vector<float>> out;
  for (std::size_t p = 0; p < e.model().params().size(); ++p) {
    out.emplace_back(e.model().params()[p].numel);
    EXPECT_TRUE(e.read_full_param(p, out.back()).is_ok());
  }
  return out;
}

struct EngineRun {
  std::unique_ptr<Communicator> comm = make_local_communicator();
  std::unique_ptr<Engine> engine;
  EngineRun(std::unique_ptr<model::Model> m, const config::DsConfig& ds) {
    auto e = Engine::create(std::move(m), EngineOptions{ds, 11, ""}, *comm);
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    if (e.is_ok()) engine = std::move(e).value();
  }
};

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
