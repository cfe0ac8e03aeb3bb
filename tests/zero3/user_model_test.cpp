// The engine with a model it has never seen: the example's TokenMlp (examples/mlp) trains with
// the same results in memory, on CPU and on NVMe; its checkpoints resume bit-identically and
// consolidate without the model's code; a checkpoint of another model is refused by name; and a
// checkpoint from before the Model interface (no parameter list) still loads and consolidates.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine_harness.h"
#include "temp_dir.h"
#include "token_mlp.h"
#include "zinf/config/ds_config.h"
#include "zinf/model/local_params.h"
#include "zinf/model/gpt.h"
#include "zinf/zero3/checkpoint.h"
#include "zinf/zero3/engine.h"
#include "zinf/zero3/safetensors.h"

namespace zinf::zero3 {
namespace {

using zinf::testing::TempDir;
namespace testing = zinf::zero3::testing;

using testing::EngineRun;
using testing::ds_config;
using testing::kB;
using testing::kT;
using testing::weights;

constexpr int kVocab = 40;

std::unique_ptr<model::Model> mlp(int hidden = 12) {
  return std::move(example::TokenMlp::create({.vocab = kVocab, .embed = 6, .hidden = hidden, .layers = 2, .max_seq = kT}))
      .value();
}

Result<std::vector<double>> train(Engine& e, int from, int to) { return testing::train(e, from, to, kVocab); }

TEST(UserModelTest, TrainsIdenticallyInMemoryOnCpuAndOnNvme) {
  std::vector<std::vector<double>> losses;
  std::vector<std::vector<std::vector<float>>> final;
  for (const char* device : {"none", "cpu", "nvme"}) {
    TempDir nvme;
    EngineRun run(mlp(), ds_config(device, nvme.path()));
    ASSERT_NE(run.engine, nullptr);
    auto l = train(*run.engine, 0, 6);
    ASSERT_TRUE(l.is_ok()) << device << ": " << l.status().to_string();
    losses.push_back(l.value());
    final.push_back(weights(*run.engine));
  }
  EXPECT_LT(losses[0][4], losses[0][0]);  // the same batch, four updates later
  for (std::size_t k = 1; k < losses.size(); ++k) {
    EXPECT_EQ(losses[k], losses[0]);
    EXPECT_EQ(final[k], final[0]);
  }
}

// fp32 (no bf16/fp16 block) with offload_param on NVMe: the partitions on NVMe are the fp32
// master weights, written after each step; the run matches fp32 in memory bit for bit.
TEST(UserModelTest, Fp32TrainsWithParametersOnNvme) {
  std::vector<std::vector<double>> losses;
  std::vector<std::vector<std::vector<float>>> final;
  for (const char* device : {"none", "nvme"}) {
    TempDir nvme;
    EngineRun run(mlp(), ds_config(device, nvme.path(), /*bf16=*/false));
    ASSERT_NE(run.engine, nullptr) << device;
    EXPECT_NE(run.engine->describe().find(std::string(device) == "nvme" ? "parameters: nvme (fp32" : "parameters: memory (fp32"),
              std::string::npos)
        << run.engine->describe();
    auto l = train(*run.engine, 0, 6);
    ASSERT_TRUE(l.is_ok()) << device << ": " << l.status().to_string();
    losses.push_back(l.value());
    final.push_back(weights(*run.engine));
  }
  EXPECT_EQ(losses[1], losses[0]);
  EXPECT_EQ(final[1], final[0]);
  EXPECT_LT(losses[0][4], losses[0][0]);
}

// sub_group_size 0 (found in real configs) is the reference's "one parameter per sub-group":
// here one partition group (a module's parameters) per sub-group, on NVMe as in memory.
TEST(UserModelTest, SubGroupSizeZeroGivesOneSubGroupPerModule) {
  std::vector<std::vector<double>> losses;
  for (const char* device : {"none", "nvme"}) {
    TempDir nvme;
    EngineRun run(mlp(), ds_config(device, nvme.path(), true, /*sub_group_size=*/0));
    ASSERT_NE(run.engine, nullptr);
    EXPECT_NE(run.engine->describe().find("| 4 sub-groups |"), std::string::npos) << run.engine->describe();
    auto l = train(*run.engine, 0, 3);
    ASSERT_TRUE(l.is_ok()) << l.status().to_string();
    losses.push_back(l.value());
  }
  EXPECT_EQ(losses[1], losses[0]);
}

TEST(UserModelTest, CheckpointsResumeBitIdenticallyAndConsolidateWithoutTheModel) {
  TempDir nvme, ckpt;
  const auto ds = ds_config("nvme", nvme.path());
  std::vector<double> straight;
  {
    EngineRun run(mlp(), ds);
    ASSERT_NE(run.engine, nullptr);
    auto first = train(*run.engine, 0, 3);
    ASSERT_TRUE(first.is_ok());
    ASSERT_TRUE(run.engine->save_checkpoint(ckpt.path(), "step3", "{\"mine\": 1}").is_ok());
    auto rest = train(*run.engine, 3, 6);
    ASSERT_TRUE(rest.is_ok());
    straight = rest.value();
  }
  // engine.json records what the model said of itself.
  std::ifstream f(ckpt.path() + "/step3/engine.json");
  std::stringstream text;
  text << f.rdbuf();
  const auto j = nlohmann::json::parse(text.str());
  EXPECT_EQ(j["model"]["type"], "token_mlp");
  EXPECT_EQ(j["params"].size(), 7u);
  EXPECT_EQ(j["modules"][3]["name"], "head");

  EngineRun resumed(mlp(), ds);
  ASSERT_NE(resumed.engine, nullptr);
  auto client = resumed.engine->load_checkpoint(ckpt.path(), "");
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  EXPECT_EQ(client.value(), "{\"mine\": 1}");
  const auto at_save = weights(*resumed.engine);
  auto rest = train(*resumed.engine, 3, 6);
  ASSERT_TRUE(rest.is_ok());
  EXPECT_EQ(rest.value(), straight);

  // Consolidation knows nothing of TokenMlp: it reads the parameter list from engine.json.
  const std::string st = ckpt.file("mlp.safetensors");
  ASSERT_TRUE(consolidate_checkpoint(ckpt.path(), st).is_ok());
  auto reader = SafetensorsReader::open(st);
  ASSERT_TRUE(reader.is_ok());
  for (std::size_t p = 0; p < at_save.size(); ++p) {
    std::vector<float> w(at_save[p].size());
    const std::string name = resumed.engine->model().params()[p].name;
    ASSERT_TRUE(reader->read_f32(name, w).is_ok()) << name;
    EXPECT_EQ(w, at_save[p]) << name;
  }
}

TEST(UserModelTest, ACheckpointOfAnotherModelIsRefusedByName) {
  TempDir nvme, ckpt;
  const auto ds = ds_config("cpu", nvme.path());
  {
    EngineRun run(mlp(12), ds);
    ASSERT_TRUE(train(*run.engine, 0, 1).is_ok());
    ASSERT_TRUE(run.engine->save_checkpoint(ckpt.path(), "a", "{}").is_ok());
  }
  EngineRun other(mlp(13), ds);
  const auto before = weights(*other.engine);
  auto loaded = other.engine->load_checkpoint(ckpt.path(), "a");
  ASSERT_FALSE(loaded.is_ok());
  EXPECT_EQ(loaded.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(loaded.status().message().find("checkpoint has model"), std::string::npos) << loaded.status().message();
  EXPECT_NE(loaded.status().message().find("\"hidden\":12"), std::string::npos) << loaded.status().message();
  EXPECT_NE(loaded.status().message().find("\"hidden\":13"), std::string::npos) << loaded.status().message();
  EXPECT_EQ(weights(*other.engine), before);  // nothing was touched
}

TEST(UserModelTest, CheckpointReaderGivesTheWeightsTheEngineComputesWith) {
  TempDir nvme, ckpt;
  EngineRun run(mlp(), ds_config("cpu", nvme.path(), /*bf16=*/false));  // fp32: computes with the masters
  ASSERT_TRUE(train(*run.engine, 0, 3).is_ok());
  ASSERT_TRUE(run.engine->save_checkpoint(ckpt.path(), "a", "{}").is_ok());
  const auto rows = testing::batch(9, kVocab);
  const MicroBatch mb = testing::micro_batch(rows[0]);
  auto engine_loss = run.engine->eval_loss(mb);
  ASSERT_TRUE(engine_loss.is_ok());

  auto reader = CheckpointReader::open(ckpt.path());
  ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
  EXPECT_EQ(reader->folder(), ckpt.path() + "/a");
  EXPECT_EQ(nlohmann::json::parse(reader->model_config_json())["type"], "token_mlp");
  auto m = mlp();
  auto lp = model::LocalParams::create(m->params(), m->modules());
  ASSERT_TRUE(lp.is_ok());
  ASSERT_EQ(reader->params().size(), m->params().size());
  for (std::size_t p = 0; p < m->params().size(); ++p) {
    EXPECT_EQ(reader->params()[p].name, m->params()[p].name);
    ASSERT_TRUE(reader->read_param(p, lp->param(static_cast<int>(p))).is_ok());
  }
  auto local_loss = m->forward_loss(mb.inputs, mb.targets, kB, kT, *lp);
  ASSERT_TRUE(local_loss.is_ok());
  EXPECT_EQ(static_cast<double>(local_loss.value()), engine_loss.value());
  std::vector<float> wrong(3);
  EXPECT_EQ(reader->read_param(0, wrong).code(), ErrorCode::kInvalidArgument);
}

// Rewrites engine.json of tag `tag` with `edit` applied.
template <typename Edit>
void edit_engine_json(const std::string& dir, const std::string& tag, Edit&& edit) {
  const std::string path = dir + "/" + tag + "/engine.json";
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  auto j = nlohmann::json::parse(text.str());
  edit(j);
  std::ofstream(path) << j.dump(2);
}

TEST(UserModelTest, GptCheckpointsWithoutAParameterListStillLoadAndConsolidate) {
  TempDir nvme, ckpt;
  const auto ds = ds_config("cpu", nvme.path());
  model::GptConfig c;
  c.vocab_size = 40;
  c.max_seq = kT;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 8;
  auto gpt = [&] { return std::unique_ptr<model::Model>(std::move(model::GptModel::create(c)).value()); };
  std::vector<std::vector<float>> saved;
  {
    EngineRun run(gpt(), ds);
    ASSERT_TRUE(train(*run.engine, 0, 2).is_ok());
    ASSERT_TRUE(run.engine->save_checkpoint(ckpt.path(), "old", "{}").is_ok());
    saved = weights(*run.engine);
  }
  // As the previous release wrote it: dimensions only, no "type", "params" or "modules".
  edit_engine_json(ckpt.path(), "old", [](nlohmann::json& j) {
    j.erase("params");
    j.erase("modules");
    j["model"].erase("type");
  });
  EngineRun run(gpt(), ds);
  auto loaded = run.engine->load_checkpoint(ckpt.path(), "old");
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(weights(*run.engine), saved);
  ASSERT_TRUE(consolidate_checkpoint(ckpt.path(), ckpt.file("old.safetensors")).is_ok());
}

TEST(UserModelTest, AUserModelCheckpointWithoutItsParameterListIsAClearError) {
  TempDir nvme, ckpt;
  const auto ds = ds_config("cpu", nvme.path());
  {
    EngineRun run(mlp(), ds);
    ASSERT_TRUE(run.engine->save_checkpoint(ckpt.path(), "a", "{}").is_ok());
  }
  edit_engine_json(ckpt.path(), "a", [](nlohmann::json& j) { j.erase("params"); j.erase("modules"); });
  Status s = consolidate_checkpoint(ckpt.path(), ckpt.file("x.safetensors"));
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported);
  EXPECT_NE(s.message().find("model type \"token_mlp\" is not one zinf builds"), std::string::npos) << s.message();

  edit_engine_json(ckpt.path(), "a", [](nlohmann::json& j) {
    j["params"] = nlohmann::json::array({{{"name", "embed.weight"}, {"shape", {40, "6"}}, {"module", 0}}});
    j["modules"] = nlohmann::json::array();
  });
  s = consolidate_checkpoint(ckpt.path(), ckpt.file("x.safetensors"));
  EXPECT_EQ(s.code(), ErrorCode::kCorruption);
  EXPECT_NE(s.message().find("params[0] ('embed.weight') has shape [40,\"6\"]"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace zinf::zero3
