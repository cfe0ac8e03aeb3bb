// Engine tests across ranks, run by meson under `mpirun -np 2` and `-np 3`: the cross-rank trace
// check, node-local checkpoints, and checkpoints moved between world sizes (re-partitioning).
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "zinf/config/ds_config.h"
#include "mpi_test_env.h"
#include "zinf/zero3/comm_mpi.h"
#include "zinf/model/gpt.h"
#include "zinf/zero3/engine.h"

namespace zinf::zero3 {
namespace {

using testing::comm;

constexpr int kRows = 2;  // rows per rank per step
constexpr int kT = 16;

std::unique_ptr<model::Model> tiny_model(bool recompute = false) {
  model::GptConfig c;
  c.vocab_size = 64;
  c.max_seq = kT;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.activation_checkpointing = recompute;
  return std::move(model::GptModel::create(c)).value();
}

// The global batch is kRows * W rows; `world` ranks split it (1: one rank takes all of it).
config::DsConfig ds_config(int world, bool node_local) {
  const std::string text = fmt::format(R"({{
    "train_batch_size": {}, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
    "bf16": {{"enabled": true}},
    "optimizer": {{"type": "AdamW", "params": {{"lr": 3e-3, "weight_decay": 0.01}}}},
    "zero_optimization": {{"stage": 3, "sub_group_size": 3000, "reduce_bucket_size": 2000,
                           "stage3_param_persistence_threshold": 64}},
    "checkpoint": {{"use_node_local_storage": {}}}
  }})", kRows * comm().world_size(), node_local ? "true" : "false");
  config::AutoContext ctx;
  ctx.world_size = world;
  auto ds = config::parse_ds_config(text, "engine_mpi_test", ctx);
  EXPECT_TRUE(ds.is_ok()) << ds.status().to_string();
  return ds.value();
}

// Rows of step `step` for `rank` of `world` (world 1 takes every rank's rows in rank order).
struct Batch {
  std::vector<std::int32_t> in, tg;
  MicroBatch micro(int rows) const { return MicroBatch{in, tg, rows, kT}; }
};
Batch batch(int step, int rank, int world) {
  Batch b;
  const int first = world == 1 ? 0 : rank * kRows;
  const int rows = world == 1 ? kRows * comm().world_size() : kRows;
  for (int r = first; r < first + rows; ++r) {
    for (int t = 0; t <= kT; ++t) {
      const auto v = static_cast<std::int32_t>((step * 131 + r * 17 + t * 7 + (t * t) % 5) % 64);
      if (t < kT) b.in.push_back(v);
      if (t > 0) b.tg.push_back(v);
    }
  }
  return b;
}

Result<double> step(Engine& e, int s, Communicator& c) {
  const Batch b = batch(s, c.rank(), c.world_size());
  const MicroBatch mb = b.micro(c.world_size() == 1 ? kRows * comm().world_size() : kRows);
  ZINF_ASSIGN_OR_RETURN(StepReport r, e.train_step(std::span<const MicroBatch>(&mb, 1)));
  return r.loss;
}

std::vector<std::vector<float>> weights(Engine& e) {
  std::vector<std::vector<float>> all;
  for (std::size_t p = 0; p < e.model().params().size(); ++p) {
    all.emplace_back(e.model().params()[p].numel);
    EXPECT_TRUE(e.read_full_param(p, all.back()).is_ok());
  }
  return all;
}

// A folder every rank sees: rank 0 makes it and broadcasts its name; rank 0 removes it.
class SharedDir {
 public:
  SharedDir() {
    std::vector<char> name(512, '\0');
    if (comm().rank() == 0) {
      const char* base = std::getenv("ZINF_TEST_TMPDIR");
      std::string templ = std::string(base != nullptr ? base : "/tmp") + "/engine_mpi.XXXXXX";
      EXPECT_NE(::mkdtemp(templ.data()), nullptr);
      std::strncpy(name.data(), templ.c_str(), name.size() - 1);
    }
    EXPECT_TRUE(comm().broadcast(std::as_writable_bytes(std::span<char>(name)), 0).is_ok());
    path_ = name.data();
  }
  ~SharedDir() {
    (void)comm().barrier();
    std::error_code ec;
    if (comm().rank() == 0) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The device-resident path on the host device (gathers into device memory, then the all-gather;
// gradients reduce-scattered from device memory) gives the host path's bits on W ranks, with and
// without activation checkpointing, under random stream delays.
TEST(EngineMpiTest, HostDeviceMatchesTheHostPath) {
  for (const bool recompute : {false, true}) {
    std::vector<double> losses[2];
    std::vector<std::vector<float>> final_weights[2];
    for (int on_device = 0; on_device < 2; ++on_device) {
      EngineOptions options{ds_config(comm().world_size(), false), 5, ""};
      if (on_device == 1) {
        options.device.kind = EngineDevice::Kind::kHostDevice;
        options.device.seed = 3 + static_cast<std::uint64_t>(comm().rank());
        options.device.max_delay_us = 200;
        options.device.poison_new_blocks = true;
      }
      auto e = Engine::create(tiny_model(recompute), options, comm());
      ASSERT_TRUE(e.is_ok()) << e.status().to_string();
      for (int s = 0; s < 4; ++s) {
        auto loss = step(*e.value(), s, comm());
        ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
        losses[on_device].push_back(loss.value());
      }
      final_weights[on_device] = weights(*e.value());
    }
    EXPECT_EQ(losses[0], losses[1]) << "activation checkpointing " << recompute;
    EXPECT_EQ(final_weights[0], final_weights[1]) << "activation checkpointing " << recompute;
  }
}

TEST(EngineMpiTest, RanksThatRecordDifferentTracesFailTogether) {
  // Rank 1 recomputes blocks in backward, the others do not: their module traces part in the
  // first backward. Every rank must get the error, at the same collective, and no hang.
  auto engine = Engine::create(tiny_model(comm().rank() == 1), EngineOptions{ds_config(comm().world_size(), false), 5, ""},
                               comm());
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  auto r = step(**engine, 0, comm());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kAborted) << r.status().to_string();
  EXPECT_NE(r.status().message().find("disagree on the module trace"), std::string::npos) << r.status().message();
  // Each rank names the event it is at: rank 1 a recompute, the others a backward.
  EXPECT_NE(r.status().message().find(comm().rank() == 1 ? "for recompute" : "for backward"), std::string::npos)
      << r.status().message();
  // The ranks left at the same collective: the communicator is still in step.
  EXPECT_TRUE(comm().barrier().is_ok());
}

TEST(EngineMpiTest, NodeLocalCheckpointResumesBitIdentically) {
  SharedDir dir;
  const config::DsConfig ds = ds_config(comm().world_size(), true);
  std::vector<double> straight;
  {
    auto e = Engine::create(tiny_model(), EngineOptions{ds, 5, ""}, comm());
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
    for (int s = 0; s < 3; ++s) ASSERT_TRUE(step(**e, s, comm()).is_ok());
    Status saved = (*e)->save_checkpoint(dir.path(), "t3", "{}");
    ASSERT_TRUE(saved.is_ok()) << saved.to_string();
    for (int s = 3; s < 6; ++s) straight.push_back(step(**e, s, comm()).value());
  }
  // One node here: its first rank wrote engine.json, marked node-local, beside every rank's file.
  std::ifstream f(dir.path() + "/t3/engine.json");
  const auto j = nlohmann::json::parse(f, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_TRUE(j.value("node_local", false));
  for (int r = 0; r < comm().world_size(); ++r) EXPECT_TRUE(std::filesystem::exists(fmt::format("{}/t3/rank{}.state", dir.path(), r)));
  auto e = Engine::create(tiny_model(), EngineOptions{ds, 99, ""}, comm());
  ASSERT_TRUE(e.is_ok());
  auto loaded = (*e)->load_checkpoint(dir.path(), "");
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  for (int s = 3; s < 6; ++s) {
    auto loss = step(**e, s, comm());
    ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
    EXPECT_EQ(loss.value(), straight[static_cast<std::size_t>(s - 3)]) << "step " << s;
  }
}

// W ranks save; one rank alone loads that into a 1-rank engine (re-partitioned) and must see the
// same weights, continue, and save; the W ranks load that back and must see its weights. The
// step after each move matches the other side's step to a summation-order tolerance.
TEST(EngineMpiTest, CheckpointsMoveBetweenWorldSizes) {
  SharedDir dir;
  const int world = comm().world_size();
  auto e = Engine::create(tiny_model(), EngineOptions{ds_config(world, false), 5, ""}, comm());
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(step(**e, s, comm()).is_ok());
  ASSERT_TRUE((*e)->save_checkpoint(dir.path() + "/w", "t3", "{}").is_ok());
  const auto w_weights = weights(**e);
  const double w_loss3 = step(**e, 3, comm()).value();

  std::vector<double> one_side(2, 0.0);  // rank 0's 1-rank loss at step 3, and at step 4 after its save
  if (comm().rank() == 0) {
    auto local = make_local_communicator();
    auto one = Engine::create(tiny_model(), EngineOptions{ds_config(1, false), 77, ""}, *local);
    ASSERT_TRUE(one.is_ok()) << one.status().to_string();
    auto loaded = (*one)->load_checkpoint(dir.path() + "/w", "");
    ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
    EXPECT_EQ(weights(**one), w_weights) << "re-partitioning from " << world << " ranks to 1 changed the weights";
    one_side[0] = step(**one, 3, *local).value();
    ASSERT_TRUE((*one)->save_checkpoint(dir.path() + "/one", "t4", "{}").is_ok());
    one_side[1] = step(**one, 4, *local).value();
  }
  ASSERT_TRUE(comm().all_reduce_sum(one_side).is_ok());
  // Same global batch and state: only the order of float sums differs (each rank sums its rows).
  EXPECT_NEAR(one_side[0], w_loss3, 1e-5 * w_loss3);

  auto back = Engine::create(tiny_model(), EngineOptions{ds_config(world, false), 88, ""}, comm());
  ASSERT_TRUE(back.is_ok());
  auto loaded = (*back)->load_checkpoint(dir.path() + "/one", "");
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ((*back)->counters().steps, 4);
  const double back_loss4 = step(**back, 4, comm()).value();
  EXPECT_NEAR(back_loss4, one_side[1], 1e-5 * one_side[1]);
}

}  // namespace
}  // namespace zinf::zero3
