// The host-memory budget (EngineOptions::host_memory_budget): a budget too small is refused before
// any work, naming the numbers; a budget makes the pools and the live limit smaller and the run
// stays under them; the process's peak RSS stays under the budget; the losses do not change.
#include <malloc.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "sanitizers.h"
#include "temp_dir.h"
#include "zero3/host_budget.h"
#include "zero3/model_partition.h"
#include "zinf/config/ds_config.h"
#include "zinf/model/gpt.h"
#include "zinf/zero3/comm.h"
#include "zinf/zero3/engine.h"

namespace zinf::zero3 {
namespace {

using zinf::testing::TempDir;

constexpr int kB = 2, kT = 64;

std::unique_ptr<model::Model> gpt(int layers, int width) {
  model::GptConfig c;
  c.vocab_size = 256;
  c.max_seq = kT;
  c.n_layer = layers;
  c.n_head = 4;
  c.n_embd = width;
  return std::move(model::GptModel::create(c)).value();
}

// Everything on NVMe with the reference's default buffers, live budget and buckets (which a
// small model leaves mostly unused, so a budget has something to lower).
config::DsConfig nvme_config(const std::string& nvme, const std::string& zinf_block = "") {
  const std::string text = fmt::format(R"({{
    "train_micro_batch_size_per_gpu": {B}, "gradient_accumulation_steps": 1, "bf16": {{"enabled": true}},
    "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3}}}},
    "zero_optimization": {{"stage": 3,
      "offload_param": {{"device": "nvme", "nvme_path": "{p}"}},
      "offload_optimizer": {{"device": "nvme", "nvme_path": "{p}", "pipeline_read": true, "pipeline_write": true}}}},
    "aio": {{"block_size": 262144, "queue_depth": 8}}{zinf}
  }})",
                                       fmt::arg("B", kB), fmt::arg("p", nvme), fmt::arg("zinf", zinf_block));
  auto ds = config::parse_ds_config(text, "budget_test", config::AutoContext{});
  EXPECT_TRUE(ds.is_ok()) << ds.status().to_string();
  return ds.value();
}

std::uint64_t status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string k;
  while (in >> k) {
    if (k == key) {
      std::uint64_t v = 0;
      in >> v;
      return v * 1024;
    }
    std::getline(in, k);
  }
  return 0;
}

// Resets VmHWM to the RSS now (Linux 4.0+); false where the kernel refuses.
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

// The least (MiB) that fit_host_budget's refusal names for `request` at a budget of 1 MiB; 0 when
// it does not refuse or names no MiB figure.
double least_named_mib(HostBudgetRequest request) {
  request.budget = std::uint64_t{1} << 20;
  auto refused = fit_host_budget(request);
  if (refused.is_ok()) return 0;
  const std::string m = refused.status().message();
  const std::size_t at = m.find("is below the ");
  if (at == std::string::npos || m.find(" MiB this run needs", at) == std::string::npos) return 0;
  return std::stod(m.substr(at + 13));
}

struct Run {
  std::vector<float> losses;
  std::vector<StepReport> reports;
  HostBudgetReport budget;
};

Result<Run> train(std::unique_ptr<model::Model> m, const config::DsConfig& ds, std::uint64_t budget, int steps) {
  auto comm = make_local_communicator();
  EngineOptions options{ds, 5, ""};
  options.host_memory_budget = budget;
  options.budget_seq = kT;
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::create(std::move(m), options, *comm));
  Run run;
  run.budget = e->host_budget();
  std::vector<std::int32_t> tokens(kB * kT + 1);
  for (int step = 0; step < steps; ++step) {
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>((step * 31 + i * i) % 256);
    const MicroBatch mb{std::span<const std::int32_t>(tokens.data(), kB * kT),
                        std::span<const std::int32_t>(tokens.data() + 1, kB * kT), kB, kT};
    ZINF_ASSIGN_OR_RETURN(StepReport r, e->train_step(std::span<const MicroBatch>(&mb, 1)));
    run.losses.push_back(static_cast<float>(r.loss));
    run.reports.push_back(r);
  }
  return run;
}

TEST(HostBudget, TooSmallIsRefusedBeforeAnyWorkNamingTheNumbers) {
  TempDir nvme;
  const config::DsConfig ds = nvme_config(nvme.path());
  auto comm = make_local_communicator();
  EngineOptions options{ds, 5, ""};
  options.host_memory_budget = std::uint64_t{64} << 20;
  options.budget_seq = kT;
  auto e = Engine::create(gpt(2, 128), options, *comm);
  ASSERT_FALSE(e.is_ok());
  const std::string msg = e.status().message();
  EXPECT_EQ(e.status().code(), ErrorCode::kResourceExhausted) << msg;
  EXPECT_NE(msg.find("host memory budget 64.0 MiB is below the "), std::string::npos) << msg;
  EXPECT_NE(msg.find(fmt::format("activations for {} x {}", kB, kT)), std::string::npos) << msg;
  EXPECT_NE(msg.find("the math libraries' work buffers"), std::string::npos) << msg;
  // Before any work: no swap folder was made.
  EXPECT_FALSE(std::filesystem::exists(nvme.file("zinf_swap"))) << "swap files made before the refusal";

  // The least named is the threshold: at it the run fits, a byte under it does not.
  auto model = gpt(2, 128);
  ASSERT_TRUE(model->set_compute_precision(model::ComputePrecision::kBf16).is_ok());
  auto plan = model_partition_plan(model->params(), model->modules().size(), 1);
  ASSERT_TRUE(plan.is_ok());
  const swap::PartitionLayout layout = swap::PartitionLayout::build(
      layout_partitions(model->params(), model->modules(), plan.value()), static_cast<std::uint64_t>(ds.zero.sub_group_size));
  HostBudgetRequest request{*model, ds, plan.value(), layout, 2, kB, kT, std::uint64_t{64} << 20, std::uint64_t{100} << 20};
  const double mib = least_named_mib(request);
  ASSERT_GT(mib, 0.0) << fit_host_budget(request).status().to_string();
  request.budget = static_cast<std::uint64_t>((mib + 0.1) * 1048576);
  EXPECT_TRUE(fit_host_budget(request).is_ok()) << "the least named (" << mib << " MiB) does not fit";
  request.budget = static_cast<std::uint64_t>((mib - 0.1) * 1048576);
  EXPECT_FALSE(fit_host_budget(request).is_ok()) << "less than the least named fits";
}

// The model's bf16 weight copies (2 bytes a parameter of its products' matrices) are a knob, not
// part of the least: a budget with no room for them is accepted, keeps fewer (a notice says how
// many), and tells the model; a generous one keeps them all.
TEST(HostBudget, WeightCopiesAreLoweredBeforeTheBudgetIsRefused) {
  TempDir nvme;
  const config::DsConfig ds = nvme_config(nvme.path());
  auto model = gpt(4, 512);
  if (!model->set_compute_precision(model::ComputePrecision::kBf16).is_ok() || model->weight_copy_bytes() == 0) {
    GTEST_SKIP() << "no bf16 products here: no weight copies";
  }
  const std::uint64_t copies = model->weight_copy_bytes();
  auto plan = model_partition_plan(model->params(), model->modules().size(), 1);
  ASSERT_TRUE(plan.is_ok());
  const swap::PartitionLayout layout = swap::PartitionLayout::build(
      layout_partitions(model->params(), model->modules(), plan.value()), static_cast<std::uint64_t>(ds.zero.sub_group_size));
  HostBudgetRequest request{*model, ds, plan.value(), layout, 2, kB, kT, std::uint64_t{1} << 40, std::uint64_t{100} << 20};
  auto generous = fit_host_budget(request);
  ASSERT_TRUE(generous.is_ok()) << generous.status().to_string();
  EXPECT_EQ(generous->weight_copy_bytes, UINT64_MAX) << "all of them fit";
  // The least, found as the refusal names it: no room for copies there.
  request.budget = std::uint64_t{1} << 20;
  const std::string m = fit_host_budget(request).status().message();
  EXPECT_EQ(m.find("weight copies"), std::string::npos) << "the copies are not part of the least: " << m;
  const double mib = least_named_mib(request);
  ASSERT_GT(mib, 0.0) << m;
  request.budget = static_cast<std::uint64_t>((mib + 0.1) * 1048576);
  auto tight = fit_host_budget(request);
  ASSERT_TRUE(tight.is_ok()) << tight.status().to_string();
  EXPECT_LT(tight->weight_copy_bytes, copies);
  bool noticed = false;
  for (const std::string& n : tight->notices) noticed |= n.find("bf16 weight copies") != std::string::npos;
  EXPECT_TRUE(noticed) << "no notice names the copies";

  // Through the engine: the model is told. Sized from this process's RSS now (the engine measures
  // its own at the start), with half the copies' bytes above the least.
  if (zinf::testing::kAsan) GTEST_SKIP() << "ASan's shadow memory is RSS no budget counts";
  request.in_use = process_rss_bytes() + (std::uint64_t{8} << 20);
  const auto least = static_cast<std::uint64_t>(least_named_mib(request) * 1048576);
  ASSERT_GT(least, 0u);
  auto comm = make_local_communicator();
  EngineOptions options{ds, 5, ""};
  options.host_memory_budget = least + copies / 2;
  options.budget_seq = kT;
  auto e = Engine::create(gpt(4, 512), options, *comm);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  EXPECT_LT(e.value()->model().weight_copy_bytes(), copies);
}

TEST(HostBudget, ConfigKeyReadsSizesAndBytes) {
  TempDir nvme;
  EXPECT_EQ(nvme_config(nvme.path(), R"(, "zinf": {"host_memory_budget": "1.5GiB"})").zinf.host_memory_budget,
            std::uint64_t{3} << 29);
  EXPECT_EQ(nvme_config(nvme.path(), R"(, "zinf": {"host_memory_budget": 123456789})").zinf.host_memory_budget,
            123456789u);
  auto bad = config::parse_ds_config(R"({"train_batch_size": 1, "zinf": {"host_memory_budget": "lots"}})", "t", config::AutoContext{});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("zinf.host_memory_budget"), std::string::npos) << bad.status().message();
  auto unknown = config::parse_ds_config(R"({"train_batch_size": 1, "zinf": {"host_memory": 1}})", "t", config::AutoContext{});
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_NE(unknown.status().message().find("zinf.host_memory"), std::string::npos) << unknown.status().message();
}

using zinf::testing::kAsan;
// The tests below measure this process's RSS against a budget; ASan's shadow memory and
// quarantine add hundreds of MiB that no budget counts (the release build runs them).
#define ZINF_SKIP_UNDER_ASAN() \
  if (kAsan) GTEST_SKIP() << "ASan's shadow memory and quarantine are RSS no budget counts"

// The budget lowers the pools and the live limit, the run stays under what it computed, and the
// losses are the unbudgeted run's.
TEST(HostBudget, SizesPoolsAndLiveLimitAndKeepsTheLosses) {
  ZINF_SKIP_UNDER_ASAN();
  TempDir a, b;
  constexpr int kSteps = 3;
  auto free_run = train(gpt(4, 256), nvme_config(a.path()), 0, kSteps);
  ASSERT_TRUE(free_run.is_ok()) << free_run.status().to_string();
  std::uint64_t free_pinned = 0, free_live = 0;
  for (const StepReport& r : free_run->reports) {
    free_pinned = std::max(free_pinned, r.pinned_bytes);
    free_live = std::max(free_live, r.live_high_water);
  }
  // Room for the fixed terms and a little more: the pools and the live limit must shrink.
  const std::uint64_t budget = status_kib("VmRSS:") + (std::uint64_t{110} << 20);
  auto run = train(gpt(4, 256), nvme_config(b.path()), budget, kSteps);
  ASSERT_TRUE(run.is_ok()) << run.status().to_string();
  const HostBudgetReport& hb = run->budget;
  EXPECT_EQ(hb.budget, budget);
  std::cout << hb.summary << "\n";
  EXPECT_LE(hb.planned, budget);
  EXPECT_LT(hb.pinned_bound, free_pinned) << hb.summary;
  EXPECT_LT(hb.live_bound, free_live) << hb.summary;
  for (const StepReport& r : run->reports) {
    EXPECT_LE(r.pinned_high_water, hb.pinned_bound) << "step " << r.step << ": " << hb.summary;
    EXPECT_LE(r.pinned_bytes, hb.pinned_bound) << "step " << r.step;
    EXPECT_LE(r.live_high_water, hb.live_bound) << "step " << r.step;
  }
  ASSERT_EQ(run->losses.size(), free_run->losses.size());
  for (std::size_t i = 0; i < run->losses.size(); ++i) {
    EXPECT_EQ(run->losses[i], free_run->losses[i]) << "step " << i + 1 << ": a budget changed the loss";
  }
}

// Everything on NVMe under a budget: the process's peak RSS (VmHWM, reset before) stays under it,
// where the same run without a budget grows past it.
TEST(HostBudget, PeakRssStaysUnderTheBudget) {
  ZINF_SKIP_UNDER_ASAN();
  if (!reset_peak_rss()) GTEST_SKIP() << "this kernel cannot reset VmHWM (/proc/self/clear_refs 5)";
  constexpr int kSteps = 2;
  constexpr std::uint64_t kRoom = std::uint64_t{150} << 20;  // over the RSS before the run
  TempDir a, b;
  ::malloc_trim(0);  // what earlier tests freed goes back: the RSS before is this process's own
  ASSERT_TRUE(reset_peak_rss());
  const std::uint64_t before = status_kib("VmRSS:");
  const std::uint64_t budget = before + kRoom;
  auto run = train(gpt(6, 384), nvme_config(a.path()), budget, kSteps);
  ASSERT_TRUE(run.is_ok()) << run.status().to_string();
  const std::uint64_t peak = status_kib("VmHWM:");
  EXPECT_LE(peak, budget) << "peak RSS " << (peak >> 20) << " MiB over the budget of " << (budget >> 20)
                          << " MiB (RSS before " << (before >> 20) << " MiB); " << run->budget.summary;

  // The same run without a budget grows by more than the room it had.
  ::malloc_trim(0);
  ASSERT_TRUE(reset_peak_rss());
  const std::uint64_t before_free = status_kib("VmRSS:");
  auto free_run = train(gpt(6, 384), nvme_config(b.path()), 0, kSteps);
  ASSERT_TRUE(free_run.is_ok()) << free_run.status().to_string();
  const std::uint64_t free_growth = status_kib("VmHWM:") - before_free;
  EXPECT_GT(free_growth, kRoom) << "the run fits the budget without one: the test shows nothing";
  std::cout << fmt::format("[ budget   ] RSS {} MiB, budget {} MiB more: peak {} MiB (growth {} MiB); without the "
                           "budget the run grew by {} MiB\n",
                           before >> 20, kRoom >> 20, peak >> 20, (peak - before) >> 20, free_growth >> 20);
  ASSERT_EQ(run->losses.size(), free_run->losses.size());
  for (std::size_t i = 0; i < run->losses.size(); ++i) EXPECT_EQ(run->losses[i], free_run->losses[i]);
}

TEST(HostBudget, LargerMicroBatchThanSizedIsRefused) {
  TempDir nvme;
  auto comm = make_local_communicator();
  EngineOptions options{nvme_config(nvme.path()), 5, ""};
  options.host_memory_budget = std::uint64_t{4} << 30;
  options.budget_seq = kT / 2;
  auto e = Engine::create(gpt(2, 128), options, *comm);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  std::vector<std::int32_t> tokens(kB * kT + 1, 1);
  const MicroBatch mb{std::span<const std::int32_t>(tokens.data(), kB * kT),
                      std::span<const std::int32_t>(tokens.data() + 1, kB * kT), kB, kT};
  auto r = (*e)->train_step(std::span<const MicroBatch>(&mb, 1));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("host memory budget"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace zinf::zero3
