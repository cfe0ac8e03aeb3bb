// Test helper: a small ZeRO-3 engine run for any model: a ds_config with state on one device,
// deterministic micro-batches of (kB, kT) tokens, a train loop, the full weights.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "zinf/config/ds_config.h"
#include "zinf/zero3/comm.h"
#include "zinf/zero3/engine.h"

namespace zinf::zero3::testing {

constexpr int kB = 2, kT = 8;

// Parameters offloaded to `device` ("none", "cpu" or "nvme"), optimizer state likewise (NVMe
// parameters keep optimizer state on NVMe); bf16 or fp32; small buckets and sub-groups so that
// modules span several. lr 1e-2 learns the two batches within a few steps.
inline config::DsConfig ds_config(const std::string& device, const std::string& nvme, bool bf16 = true,
                                  int sub_group_size = 300, double lr = 1e-2) {
  const std::string offload_param =
      device == "nvme"
          ? fmt::format(R"({{"device": "nvme", "nvme_path": "{}", "buffer_count": 3, "buffer_size": 1024, "max_in_cpu": 0}})",
                        nvme)
          : R"({"device": "none"})";
  const std::string offload_optimizer = device == "none" ? R"({"device": "none"})"
                                          : fmt::format(R"({{"device": "{}", "nvme_path": "{}"}})", device, nvme);
  const std::string text = fmt::format(R"({{
    "train_micro_batch_size_per_gpu": {B}, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
    {precision}
    "optimizer": {{"type": "AdamW", "params": {{"lr": {lr}, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}}}},
    "zero_optimization": {{"stage": 3, "sub_group_size": {sg}, "reduce_bucket_size": 200,
      "stage3_prefetch_bucket_size": 500, "stage3_param_persistence_threshold": 16,
      "offload_param": {offload_param}, "offload_optimizer": {offload_optimizer}}},
    "aio": {{"block_size": 65536, "queue_depth": 4}}
  }})",
                                       fmt::arg("B", kB), fmt::arg("offload_param", offload_param), fmt::arg("offload_optimizer", offload_optimizer),
                                       fmt::arg("precision", bf16 ? R"("bf16": {"enabled": true},)" : ""),
                                       fmt::arg("sg", sub_group_size), fmt::arg("lr", lr));
  auto ds = config::parse_ds_config(text, "engine_harness", config::AutoContext{});
  EXPECT_TRUE(ds.is_ok()) << ds.status().to_string();
  return ds.value();
}

// Two micro-batches of kT+1-token rows for `step`, a function of the step alone (two
// alternating batches, so that a few steps visibly learn them). Ids in [0, vocab).
inline std::vector<std::vector<std::int32_t>> batch(int step, int vocab) {
  std::vector<std::vector<std::int32_t>> rows(2, std::vector<std::int32_t>(kB * kT + 1));
  for (int g = 0; g < 2; ++g) {
    for (std::size_t i = 0; i < rows[g].size(); ++i) {
      rows[g][i] = static_cast<std::int32_t>(((step % 2) * 7 + g * 3 + i * i) % static_cast<std::size_t>(vocab));
    }
  }
  return rows;
}

// The micro-batch of a row: inputs are its first kB*kT ids, targets the next ones.
inline MicroBatch micro_batch(const std::vector<std::int32_t>& row) {
  return {std::span<const std::int32_t>(row.data(), kB * kT), std::span<const std::int32_t>(row.data() + 1, kB * kT),
          kB, kT};
}

// Steps [from, to); the losses.
inline Result<std::vector<double>> train(Engine& e, int from, int to, int vocab) {
  std::vector<double> losses;
  for (int step = from; step < to; ++step) {
    const auto rows = batch(step, vocab);
    std::vector<MicroBatch> micro;
    for (const auto& r : rows) micro.push_back(micro_batch(r));
    ZINF_ASSIGN_OR_RETURN(StepReport rep, e.train_step(micro));
    losses.push_back(rep.loss);
  }
  return losses;
}

// Every parameter's full fp32 value.
inline std::vector<std::vector<float>> weights(Engine& e) {
  std::vector<std::vector<float>> out;
  for (std::size_t p = 0; p < e.model().params().size(); ++p) {
    out.emplace_back(e.model().params()[p].numel);
    EXPECT_TRUE(e.read_full_param(p, out.back()).is_ok());
  }
  return out;
}

// An engine on a world-size-1 communicator (seed 11).
struct EngineRun {
  std::unique_ptr<Communicator> comm = make_local_communicator();
  std::unique_ptr<Engine> engine;
  EngineRun(std::unique_ptr<model::Model> m, const config::DsConfig& ds,
            EngineDevice::Kind device = EngineDevice::Kind::kHostMemory) {
    EngineOptions options{ds, 11, ""};
    options.device.kind = device;
    auto e = Engine::create(std::move(m), options, *comm);
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    if (e.is_ok()) engine = std::move(e).value();
  }
};

}  // namespace zinf::zero3::testing
