// The planner: memory predicted from the engine's own sizing (checked against a real engine's
// high-water marks), the search's drops and ranking, the shortfall when nothing fits, and a
// written config that parses back. No timings are asserted (bench/plan_accuracy.sh measures them).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "engine_harness.h"
#include "zero3/host_budget.h"
#include "zinf/model/gpt.h"
#include "zinf/model/registry.h"
#include "zinf/zero3/hf_folder.h"
#include "zinf/swap/pinned_pool.h"
#include "zinf/zero3/plan.h"

namespace zinf::zero3 {
namespace {

model::GptConfig tiny_gpt() {
  model::GptConfig c;
  c.vocab_size = 64;
  c.max_seq = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  return c;
}

std::unique_ptr<model::Model> make_gpt(const model::GptConfig& base, bool recompute) {
  model::GptConfig c = base;
  c.activation_checkpointing = recompute;
  auto m = model::GptModel::create(c);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return std::move(m).value();
}

class PlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("zinf_plan_test." + std::to_string(::getpid()) + "." +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A machine with fixed roofs (no probe) and `host` bytes, the temporary folder as its drive.
  Machine machine(std::uint64_t host, std::uint64_t disk_free = std::uint64_t{1} << 40) const {
    Machine m;
    m.host_available = host;
    m.host_source = "test";
    m.matmul_gflops = {50, "test", true};
    m.memory_gbps = {20, "test", true};
    m.nvme_read_gbps = {2, "test", true};
    m.nvme_write_gbps = {1, "test", true};
    m.drives.push_back({dir_.string(), disk_free});
    return m;
  }

  PlanRequest request(const model::GptConfig& c) const {
    PlanRequest r;
    r.make_model = [c](bool recompute) -> Result<std::unique_ptr<model::Model>> { return make_gpt(c, recompute); };
    r.seq = c.max_seq;
    r.train_batch = 4;
    return r;
  }

  std::filesystem::path dir_;
};

// The first term whose name starts with `prefix`; 0 when none does.
std::uint64_t term_of(const std::vector<MemoryTerm>& terms, const std::string& prefix) {
  for (const MemoryTerm& t : terms) {
    if (t.name.rfind(prefix, 0) == 0) return t.bytes;
  }
  return 0;
}
std::uint64_t term(const MemoryPrediction& m, const std::string& prefix) { return term_of(m.host, prefix); }

TEST_F(PlanTest, MemoryUsesTheSwapLayersPoolSizing) {
  const config::DsConfig ds = testing::ds_config("nvme", dir_.string());
  auto m = make_gpt(tiny_gpt(), false);
  auto mem = predict_memory(*m, ds, testing::kB, testing::kT);
  ASSERT_TRUE(mem.is_ok()) << mem.status().to_string();
  // The parameter pool: offload_param's 3 x 1024 bf16 elements, as PoolBudget sizes it.
  const swap::PoolBudget param_pool{"offload_param", 3, 1024, 2};
  EXPECT_EQ(term(*mem, "parameter pinned pool"), param_pool.bytes());
  EXPECT_GT(term(*mem, "optimizer pinned pool"), 0u);
  EXPECT_EQ(term(*mem, "optimizer state in memory"), 0u);
  // Two slots of master + two states, and the gradients (the engine keeps them on NVMe with the
  // optimizer there: no fp32 gradient partitions in memory, one pinned store buffer).
  EXPECT_GT(mem->disk_optimizer, (2 * 12 + 4) * m->num_params());
  EXPECT_GE(mem->disk_params, 2 * m->num_params());
  EXPECT_EQ(term(*mem, "fp32 gradient partitions"), 0u);
  EXPECT_GT(term(*mem, "gradient store buffer"), 0u);
  EXPECT_LT(term(*mem, "gradient store buffer"), 4 * mem->shard_elements + (std::uint64_t{4} << 20) + 1);
  EXPECT_EQ(mem->pinned_bytes(), term(*mem, "parameter pinned pool") + term(*mem, "optimizer pinned pool") +
                                     term(*mem, "gradient store buffer"));

  const config::DsConfig in_memory = testing::ds_config("cpu", dir_.string());
  auto cpu = predict_memory(*m, in_memory, testing::kB, testing::kT);
  ASSERT_TRUE(cpu.is_ok());
  EXPECT_EQ(cpu->disk_bytes(), 0u);
  EXPECT_EQ(term(*cpu, "fp32 gradient partitions"), 4 * cpu->shard_elements);
  EXPECT_GE(term(*cpu, "optimizer state in memory"), 12 * m->num_params());
  EXPECT_EQ(term(*cpu, "activations"), m->activation_bytes(testing::kB, testing::kT));
}

// zinf train --device cuda (ComputeOn::kGpu) against the peak RSS of real GPU runs
// (docs/gpu-runs/2026-11-28-run30/31/32/33-*, an H200 machine): within 10% above, never below. The
// GPU's workspace is left out here (the tests/gpu runs know it), which lowers the CUDA records'
// term by tens of MiB. GPT-2 (run 31: 625.7 MiB) is left out: the CUDA process base is the 1.3B's (883.9 MiB),
// 0.27 GiB above GPT-2's, which no plan turns on.
TEST(PlanGpuMemoryTest, GpuRunsPeakRssIsPredictedWithinTenPercentAndNeverBelow) {
  const std::string dir = ZINF_BENCH_GPU_DIR;
  struct RssRecord {
    const char* model;   // a GPT preset, or an HF config.json under bench/gpu
    const char* config;  // under bench/gpu
    double peak_rss_mib;
  };
  const RssRecord runs[] = {
      {"1.3b", "a_1p3b_gpu.json", 883.9},                                                  // everything on the GPU
      {"1.3b", "b_1p3b_offload_cpu_resident.json", 24038.6},                               // params + optimizer on the CPU
      {"1.3b", "b_1p3b_offload_cpu_ga8.json", 24036.9},                                    // the same, 8 micro-batches (run 33)
      {"2.7b", "b_2p7b_offload_cpu_resident.json", 47284.7},
      {"llama32_3b_config.json", "b_llama3b_offload_cpu_resident.json", 58975.3},
      {"llama2_7b_config.json", "b_llama7b_offload_cpu_resident.json", 118153.4},
      {"llama2_7b_config.json", "a_llama7b_plan.json", 993.1},  // the plan's winner, all on the GPU (run 32)
  };
  for (const RssRecord& run : runs) {
    SCOPED_TRACE(std::string(run.model) + ", " + run.config);
    const std::string model = run.model;
    std::unique_ptr<model::Model> m;
    if (model.ends_with(".json")) {
      auto json = model_config_from_hf_file(dir + "/" + model);
      ASSERT_TRUE(json.is_ok()) << json.status().to_string();
      auto made = model::make_builtin_model(json.value(), model);
      ASSERT_TRUE(made.is_ok()) << made.status().to_string();
      m = std::move(made).value();
    } else {
      auto c = model::gpt_preset(model, 50257);
      ASSERT_TRUE(c.is_ok());
      auto made = model::GptModel::create(c.value());
      ASSERT_TRUE(made.is_ok());
      m = std::move(made).value();
    }
    auto ds = config::load_ds_config(dir + "/" + run.config, config::AutoContext{});
    ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
    auto mem = predict_memory(*m, ds.value(), 4, 2048, ComputeOn::kGpu);
    ASSERT_TRUE(mem.is_ok()) << mem.status().to_string();
    const double predicted = static_cast<double>(mem->host_bytes()) / (1 << 20);
    std::printf("%s: predicted %.1f MiB, measured %.1f MiB: %.3f\n", run.config, predicted, run.peak_rss_mib,
                predicted / run.peak_rss_mib);
    EXPECT_GE(predicted, run.peak_rss_mib);
    EXPECT_LE(predicted, 1.10 * run.peak_rss_mib);
    if (ds->zero.offload_param.device != config::OffloadDevice::kNone) {
      // On the host the same run would also hold activations and gathered values.
      auto host = predict_memory(*m, ds.value(), 4, 2048);
      ASSERT_TRUE(host.is_ok());
      EXPECT_GT(host->host_bytes(), mem->host_bytes());
    }
  }
}

// A GPU run's bytes against the room on its GPU: fits, may not fit (within the prediction's 15%),
// does not fit (the message names the need, the room, the largest term and what to change). The
// state on the GPU is 18 bytes a parameter with AdamW in bf16 (master, two states, gradients,
// the bf16 copy), whatever the workspace.
TEST(PlanGpuMemoryTest, AGpuRunThatCannotFitItsGpuIsToldWhatToChange) {
  auto c = model::gpt_preset("1.3b", 50257);
  ASSERT_TRUE(c.is_ok());
  auto m = model::GptModel::create(c.value());
  ASSERT_TRUE(m.is_ok());
  auto ds = config::load_ds_config(std::string(ZINF_BENCH_GPU_DIR) + "/a_1p3b_gpu.json", config::AutoContext{});
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  const std::uint64_t workspace = std::uint64_t{3} << 30;
  auto mem = predict_memory(*m.value(), ds.value(), 4, 2048, ComputeOn::kGpu, GpuRun{workspace, 0});
  ASSERT_TRUE(mem.is_ok()) << mem.status().to_string();
  EXPECT_GE(term_of(mem->gpu_terms, "training state"), 18 * m.value()->num_params());
  EXPECT_EQ(term_of(mem->gpu_terms, "the model's activations"), workspace);
  EXPECT_EQ(term_of(mem->gpu_terms, "gathered parameters"), 0u) << "the model reads the bf16 copy in place";
  EXPECT_EQ(check_gpu_fit(mem.value(), ds.value(), mem->gpu, "GPU 0").verdict, GpuFit::Verdict::kFits);
  const GpuFit close = check_gpu_fit(mem.value(), ds.value(), mem->gpu * 9 / 10, "GPU 0");
  EXPECT_EQ(close.verdict, GpuFit::Verdict::kMayNotFit) << close.message;
  const GpuFit short_fit = check_gpu_fit(mem.value(), ds.value(), mem->gpu / 2, "GPU 0: test");
  ASSERT_EQ(short_fit.verdict, GpuFit::Verdict::kDoesNotFit);
  for (const char* part : {"a_1p3b_gpu.json", "GiB of GPU memory", "GPU 0: test", "training state", "short",
                           "offload_optimizer and offload_param device cpu"}) {
    EXPECT_NE(short_fit.message.find(part), std::string::npos) << part << " missing: " << short_fit.message;
  }
}

// The engine's own high-water marks of a real run stay within the prediction: the gathered
// elements (live_high_water) under the "live" and "persistent" terms.
TEST_F(PlanTest, PredictionCoversARealRunsHighWater) {
  for (const std::string device : {"none", "cpu", "nvme"}) {
    SCOPED_TRACE(device);
    const config::DsConfig ds = testing::ds_config(device, dir_.string());
    auto described = make_gpt(tiny_gpt(), false);
    auto mem = predict_memory(*described, ds, testing::kB, testing::kT);
    ASSERT_TRUE(mem.is_ok()) << mem.status().to_string();
    auto comm = make_local_communicator();
    EngineOptions eo;
    eo.ds = ds;
    auto engine = Engine::create(make_gpt(tiny_gpt(), false), eo, *comm);
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    std::uint64_t live = 0;
    for (int step = 0; step < 3; ++step) {
      const auto rows = testing::batch(step, 64);
      std::vector<MicroBatch> micro;
      for (const auto& r : rows) micro.push_back(testing::micro_batch(r));
      auto rep = (*engine)->train_step(micro);
      ASSERT_TRUE(rep.is_ok()) << rep.status().to_string();
      live = std::max(live, rep->live_high_water);
    }
    EXPECT_LE(4 * live, term(*mem, "gathered parameters, live") + term(*mem, "gathered parameters, persistent"));
    EXPECT_GT(mem->host_bytes(), kProcessBaseBytes);
  }
}

// The time model's NVMe bytes are the engine's: for every optimizer-on-NVMe candidate's config,
// a real engine's bytes per step (optimizer tier and gradient store) equal the planner's count.
TEST_F(PlanTest, NvmeTrafficIsTheEnginesBytesPerStep) {
  PlanRequest r = request(tiny_gpt());
  r.micro_batch = testing::kB;  // the harness's two micro-batches of kB rows
  r.train_batch = 2 * testing::kB;
  auto plan = make_plan(r, machine(std::uint64_t{8} << 30));
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  int checked = 0;
  for (const Candidate& c : plan->fitting) {
    if (c.optimizer_device != config::OffloadDevice::kNvme || c.activation_checkpointing) continue;
    SCOPED_TRACE(c.label());
    auto ds = config::parse_ds_config(c.ds_config, "planned", config::AutoContext{});
    ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
    auto comm = make_local_communicator();
    EngineOptions eo;
    eo.ds = ds.value();
    auto engine = Engine::create(make_gpt(tiny_gpt(), false), eo, *comm);
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    ASSERT_TRUE(testing::train(**engine, 0, 2, 64).is_ok());
    const std::uint64_t before = (*engine)->bytes_moved();
    ASSERT_TRUE(testing::train(**engine, 2, 3, 64).is_ok());
    EXPECT_DOUBLE_EQ(static_cast<double>((*engine)->bytes_moved() - before), c.nvme_bytes);
    EXPECT_GT(c.grad_io_s, 0);
    if (++checked == 2) break;  // a keep-everything and a lean one are enough
  }
  EXPECT_EQ(checked, 2);
}

// NVMe time is the engine's bytes over the drive's rate: halving the drive's roofs doubles every
// candidate's NVMe terms and leaves the rest as they were. (With compute this fast nothing hides
// the gradient store's writes; GradientWritesHideUnderBackward has the other side.)
TEST_F(PlanTest, NvmeTimeScalesWithTheDrivesRate) {
  const PlanRequest r = request(tiny_gpt());
  Machine fast = machine(std::uint64_t{8} << 30);
  fast.matmul_gflops.value = 1e9;
  fast.memory_gbps.value = 1e9;
  Machine slow = fast;
  slow.nvme_read_gbps.value /= 2;
  slow.nvme_write_gbps.value /= 2;
  auto a = make_plan(r, fast);
  auto b = make_plan(r, slow);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  ASSERT_EQ(a->fitting.size(), b->fitting.size());
  int nvme = 0;
  for (const Candidate& c : a->fitting) {
    const Candidate* d = nullptr;
    for (const Candidate& e : b->fitting) d = e.label() == c.label() ? &e : d;
    ASSERT_NE(d, nullptr) << c.label();
    EXPECT_DOUBLE_EQ(d->compute_s, c.compute_s);
    EXPECT_NEAR(d->grad_io_s, 2 * c.grad_io_s, 1e-9);
    EXPECT_NEAR(d->optimizer_io_s, 2 * c.optimizer_io_s, 1e-12);
    EXPECT_NEAR(d->param_io_s, 2 * c.param_io_s, 1e-12);
    if (c.optimizer_device == config::OffloadDevice::kNvme) {
      ++nvme;
      EXPECT_GT(c.grad_io_s, 0) << c.label();
    }
  }
  EXPECT_GT(nvme, 0);
}

// The gradient store's writes run under the next module's backward, and its reads of the sums
// so far ahead of their accumulation beside them (grad_store.h): with a slow matrix rate the
// backward covers both and only the last partition's write shows; with compute as good as free
// every write and read shows.
TEST_F(PlanTest, GradientWritesHideUnderBackward) {
  const PlanRequest r = request(tiny_gpt());
  Machine slow_compute = machine(std::uint64_t{8} << 30);
  slow_compute.matmul_gflops.value = 1e-3;
  Machine free_compute = slow_compute;
  free_compute.matmul_gflops.value = 1e9;
  free_compute.memory_gbps.value = 1e9;
  auto hidden = make_plan(r, slow_compute);
  auto shown = make_plan(r, free_compute);
  ASSERT_TRUE(hidden.is_ok() && shown.is_ok());
  int nvme = 0;
  for (const Candidate& c : shown->fitting) {
    if (c.optimizer_device != config::OffloadDevice::kNvme) continue;
    const Candidate* h = nullptr;
    for (const Candidate& e : hidden->fitting) h = e.label() == c.label() ? &e : h;
    ASSERT_NE(h, nullptr) << c.label();
    SCOPED_TRACE(c.label());
    ++nvme;
    const double write_roof = free_compute.nvme_write_gbps.value * 1e9;
    // Only the last partition's write.
    const double last = 4.0 * static_cast<double>(c.memory.largest_partition) / (0.3 * write_roof);
    EXPECT_NEAR(h->grad_io_s, last, 1e-12 + 1e-9 * h->grad_io_s);
    // Every write and, after the first micro-step, every read.
    const double grads = 4.0 * static_cast<double>(c.memory.shard_elements);
    const double gas = static_cast<double>(c.grad_accum);
    const double all = gas * grads / (0.3 * write_roof) +
                       (gas - 1.0) * grads / (0.65 * free_compute.nvme_read_gbps.value * 1e9) + last;
    EXPECT_NEAR(c.grad_io_s, all, 1e-6 * all);
  }
  EXPECT_GT(nvme, 0);
}

TEST_F(PlanTest, KeepEverythingLeavesRoomForTheSpareCopies) {
  auto plan = make_plan(request(tiny_gpt()), machine(std::uint64_t{8} << 30));
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  auto m = make_gpt(tiny_gpt(), false);
  std::uint64_t largest = 0;
  for (const model::ModuleSpec& mod : m->modules()) {
    std::uint64_t owned = 0;
    for (int p : mod.params) {
      const model::ParamSpec& ps = m->params()[static_cast<std::size_t>(p)];
      if (&m->modules()[static_cast<std::size_t>(ps.module)] == &mod) owned += ps.numel;
    }
    largest = std::max(largest, owned);
  }
  int keep = 0, lean = 0;
  for (const Candidate& c : plan->fitting) {
    const auto live = static_cast<std::uint64_t>(c.max_live_parameters);
    if (live >= m->num_params()) {
      ++keep;
      EXPECT_GE(live, m->num_params() + largest) << c.label();
    } else {
      ++lean;
      EXPECT_EQ(live, 2 * largest) << c.label();
    }
  }
  EXPECT_GT(keep, 0);
  EXPECT_GT(lean, 0);
}

TEST_F(PlanTest, RanksFittingCandidatesAndWritesAConfigThatParses) {
  const PlanRequest r = request(tiny_gpt());
  auto plan = make_plan(r, machine(std::uint64_t{8} << 30));
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  ASSERT_FALSE(plan->fitting.empty());
  for (std::size_t i = 1; i < plan->fitting.size(); ++i) EXPECT_LE(plan->fitting[i - 1].step_s, plan->fitting[i].step_s);
  const Candidate& w = plan->fitting.front();
  // Plenty of memory: the winner keeps everything in memory.
  EXPECT_EQ(w.optimizer_device, config::OffloadDevice::kCpu);
  EXPECT_EQ(w.micro_batch * w.grad_accum, 4);
  EXPECT_FALSE(plan->why_winner.empty());
  EXPECT_GT(w.step_s, 0);
  auto ds = config::parse_ds_config(w.ds_config, "written", config::AutoContext{});
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  EXPECT_EQ(ds->batch.train_batch_size, 4);
  EXPECT_TRUE(ds->bf16.enabled);
  // The assumed terms are named (the test's roofs are all "measured").
  EXPECT_FALSE(plan->assumptions.empty());
}

// A measured run's breakdown scales the prediction: twice the predicted passes and optimizer
// time measured for the winner's config gives the winner twice the predicted step.
TEST_F(PlanTest, CalibrationScalesTheWinnersPrediction) {
  PlanRequest r = request(tiny_gpt());
  const Machine m = machine(std::uint64_t{8} << 30);
  auto plan = make_plan(r, m);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  const Candidate w = plan->fitting.front();
  auto ran = config::parse_ds_config(w.ds_config, "ran", config::AutoContext{});
  ASSERT_TRUE(ran.is_ok());
  const double passes = w.compute_s + w.gather_s + w.param_io_exposed_s + w.grad_io_s;
  auto k = calibrate(r, m, *ran, 2 * passes, 2 * (w.step_s - passes), "run.jsonl");
  ASSERT_TRUE(k.is_ok()) << k.status().to_string();
  EXPECT_NEAR(k->passes, 2.0, 1e-9);
  EXPECT_NEAR(k->optimizer, 2.0, 1e-9);
  EXPECT_NE(k->source.find("run.jsonl"), std::string::npos);
  r.calibration = *k;
  auto again = make_plan(r, m);
  ASSERT_TRUE(again.is_ok());
  EXPECT_NEAR(again->fitting.front().step_s, 2 * w.step_s, 1e-9 * w.step_s);
  EXPECT_EQ(again->calibration, k->source);
  EXPECT_FALSE(calibrate(r, m, *ran, 0, 1, "empty.jsonl").is_ok());
}

// Large enough that keeping the optimizer state in memory needs much more host memory than NVMe.
model::GptConfig eight_layer_gpt() {
  model::GptConfig c = tiny_gpt();
  c.n_layer = 8;
  c.n_embd = 256;
  c.n_head = 4;
  c.vocab_size = 4096;
  return c;
}

TEST_F(PlanTest, TightMemoryPicksNvmeAndDropsTheRestWithTheReason) {
  const model::GptConfig c = eight_layer_gpt();
  const PlanRequest r = request(c);
  auto m = make_gpt(c, false);
  // A budget between the smallest NVMe-optimizer candidate and the smallest one that keeps the
  // optimizer state in memory (both as the planner predicts them on a roomy machine).
  auto roomy = make_plan(r, machine(std::uint64_t{64} << 30));
  ASSERT_TRUE(roomy.is_ok()) << roomy.status().to_string();
  std::uint64_t nvme = UINT64_MAX, in_memory = UINT64_MAX;
  for (const Candidate& d : roomy->fitting) {
    std::uint64_t& least = d.optimizer_device == config::OffloadDevice::kNvme ? nvme : in_memory;
    least = std::min(least, d.memory.host_bytes());
  }
  ASSERT_LT(nvme, in_memory) << "NVMe state must need less host memory than state in memory";
  const std::uint64_t host = nvme + (in_memory - nvme) / 2;
  auto plan = make_plan(r, machine(static_cast<std::uint64_t>(static_cast<double>(host) / r.host_fraction)));
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  ASSERT_FALSE(plan->fitting.empty()) << plan->shortfall;
  EXPECT_EQ(plan->fitting.front().optimizer_device, config::OffloadDevice::kNvme);
  bool named = false;
  for (const Candidate& d : plan->dropped) named = named || d.why_not.find("host memory: needs") != std::string::npos;
  EXPECT_TRUE(named);
}

// The fastest candidate needs 95% of the host memory: the default share (0.9) drops it, and the
// winner's explanation names it, its speed-up and the --host-fraction that admits it; with that
// share it wins.
TEST_F(PlanTest, AFasterCandidateLeftOutOnlyByTheHostFractionIsNamed) {
  PlanRequest r = request(eight_layer_gpt());
  auto roomy = make_plan(r, machine(std::uint64_t{64} << 30));
  ASSERT_TRUE(roomy.is_ok()) << roomy.status().to_string();
  const Candidate best = roomy->fitting.front();
  const auto available = static_cast<std::uint64_t>(static_cast<double>(best.memory.host_bytes()) / 0.95);
  auto plan = make_plan(r, machine(available));
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  ASSERT_FALSE(plan->fitting.empty()) << plan->shortfall;
  ASSERT_GT(plan->fitting.front().step_s, best.step_s);
  const std::string& why = plan->why_winner;
  const std::size_t at = why.find("--host-fraction ");
  ASSERT_NE(at, std::string::npos) << why;
  EXPECT_NE(why.find(best.label() + " would be"), std::string::npos) << why;
  EXPECT_NE(why.find("95% of the"), std::string::npos) << why;
  const double fraction = std::stod(why.substr(at + 16));
  EXPECT_GE(fraction, 0.95);  // the share needed, rounded up to a hundredth
  EXPECT_LE(fraction, 0.96);
  r.host_fraction = fraction;
  auto admitted = make_plan(r, machine(available));
  ASSERT_TRUE(admitted.is_ok());
  ASSERT_FALSE(admitted->fitting.empty());
  EXPECT_EQ(admitted->fitting.front().label(), best.label());
  EXPECT_EQ(admitted->why_winner.find("--host-fraction"), std::string::npos) << admitted->why_winner;
}

// A model whose knobs (pools, gathers, weight copies) outweigh the budget's larger process term
// (kProcessBeforeEngineBytes and the libraries' buffers against kProcessBaseBytes).
model::GptConfig budget_gpt() {
  model::GptConfig c = tiny_gpt();
  c.n_layer = 4;
  c.n_embd = 512;
  c.n_head = 4;
  c.vocab_size = 8192;
  return c;
}

// Short of host memory for every candidate as configured, but not for the engine's budget
// sizing: the plan's winner runs under zinf.host_memory_budget, its written config carries the
// knobs the budget lowers (and sizing it again changes nothing), and a real engine given the
// same room accepts it, sizes the same live limit and trains.
TEST_F(PlanTest, ShortOfHostMemoryPlansUnderTheEnginesBudget) {
  const model::GptConfig c = budget_gpt();
  PlanRequest r = request(c);
  r.micro_batch = testing::kB;  // the harness trains micro-batches of kB rows
  r.train_batch = 2 * testing::kB;
  auto roomy = make_plan(r, machine(std::uint64_t{64} << 30));
  ASSERT_TRUE(roomy.is_ok()) << roomy.status().to_string();
  std::uint64_t smallest = UINT64_MAX, least = UINT64_MAX;
  for (const Candidate& d : roomy->fitting) {
    EXPECT_EQ(d.host_memory_budget, 0u) << d.label() << ": a budget where everything fits";
    smallest = std::min(smallest, d.memory.host_bytes());
    least = std::min(least, d.memory.least_budget);
  }
  ASSERT_LT(least, smallest) << "the budget must have something to lower";
  const std::uint64_t usable = least + (smallest - least) / 2;
  const Machine tight = machine(static_cast<std::uint64_t>(static_cast<double>(usable) / r.host_fraction) + 1);
  auto plan = make_plan(r, tight);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  ASSERT_FALSE(plan->fitting.empty()) << plan->shortfall;
  const Candidate& w = plan->fitting.front();
  SCOPED_TRACE(w.label());
  ASSERT_GT(w.host_memory_budget, 0u);
  ASSERT_TRUE(w.memory.budgeted.has_value());
  EXPECT_LE(w.memory.host_bytes(), w.host_memory_budget);
  EXPECT_GE(w.host_memory_budget, w.memory.least_budget);
  EXPECT_NE(w.label().find("host budget"), std::string::npos);
  for (const Candidate& d : plan->fitting) EXPECT_GT(d.host_memory_budget, 0u) << d.label();

  auto ds = config::parse_ds_config(w.ds_config, "planned", config::AutoContext{});
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  EXPECT_EQ(ds->zinf.host_memory_budget, w.host_memory_budget);
  EXPECT_EQ(ds->zero.max_live_parameters, w.max_live_parameters);
  EXPECT_EQ(ds->zero.max_live_parameters, w.memory.budgeted->zero.max_live_parameters);
  EXPECT_EQ(ds->zero.reduce_bucket_size, w.memory.budgeted->zero.reduce_bucket_size);
  EXPECT_EQ(ds->zero.offload_param.buffer_size, w.memory.budgeted->zero.offload_param.buffer_size);
  auto model = make_gpt(c, w.activation_checkpointing);
  auto again = predict_memory(*model, ds.value(), static_cast<int>(w.micro_batch), r.seq);
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  ASSERT_TRUE(again->budgeted.has_value());
  EXPECT_EQ(again->budgeted->zero.max_live_parameters, w.max_live_parameters);
  EXPECT_LE(again->host_bytes(), w.host_memory_budget);

  // The engine sizes from its own RSS where the plan assumed kProcessBeforeEngineBytes; given the
  // same room beyond what the process holds, it sizes the same live limit (to within the budget
  // margin's share of the RSS difference).
  const std::int64_t held =
      static_cast<std::int64_t>(process_rss_bytes()) - static_cast<std::int64_t>(kProcessBeforeEngineBytes);
  auto comm = make_local_communicator();
  EngineOptions eo;
  eo.ds = ds.value();
  eo.host_memory_budget = static_cast<std::uint64_t>(static_cast<std::int64_t>(w.host_memory_budget) + held / 0.95);
  auto engine = Engine::create(make_gpt(c, w.activation_checkpointing), eo, *comm);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const double live = static_cast<double>((*engine)->host_budget().live_bound);
  EXPECT_NEAR(live, static_cast<double>(w.max_live_parameters), 0.05 * static_cast<double>(w.max_live_parameters));
  ASSERT_TRUE(testing::train(**engine, 0, 2, c.vocab_size).is_ok());
}

// Below what the budget sizing needs at the least, nothing fits, and the shortfall is counted
// from that least, not from the candidates as configured.
TEST_F(PlanTest, TheShortfallCountsFromTheBudgetsLeast) {
  const model::GptConfig c = budget_gpt();
  const PlanRequest r = request(c);
  auto roomy = make_plan(r, machine(std::uint64_t{64} << 30));
  ASSERT_TRUE(roomy.is_ok()) << roomy.status().to_string();
  std::uint64_t least = UINT64_MAX;
  for (const Candidate& d : roomy->fitting) least = std::min(least, d.memory.least_budget);
  auto plan = make_plan(r, machine(static_cast<std::uint64_t>(static_cast<double>(least) * 0.8 / r.host_fraction)));
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_TRUE(plan->fitting.empty());
  EXPECT_NE(plan->shortfall.find("at their least"), std::string::npos) << plan->shortfall;
  // 20% of the least is short (give or take the MiB the message rounds to).
  const std::size_t at = plan->shortfall.find("The smallest change that fits it: ");
  ASSERT_NE(at, std::string::npos) << plan->shortfall;
  const double more_mib = std::stod(plan->shortfall.substr(at + 34));
  EXPECT_NEAR(more_mib, 0.2 * static_cast<double>(least) / (1 << 20), 1.5) << plan->shortfall;
}

TEST_F(PlanTest, NothingFitsSaysWhatIsShortAndByHowMuch) {
  const PlanRequest r = request(tiny_gpt());
  auto plan = make_plan(r, machine(std::uint64_t{1} << 20, 4096));
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_TRUE(plan->fitting.empty());
  EXPECT_NE(plan->shortfall.find("nothing fits"), std::string::npos) << plan->shortfall;
  EXPECT_NE(plan->shortfall.find("short"), std::string::npos) << plan->shortfall;
  EXPECT_NE(plan->shortfall.find("MiB more free host memory"), std::string::npos) << plan->shortfall;
}

TEST_F(PlanTest, RefusesABatchTheRanksCannotSplit) {
  PlanRequest r = request(tiny_gpt());
  r.world_size = 3;
  auto plan = make_plan(r, machine(std::uint64_t{8} << 30));
  ASSERT_FALSE(plan.is_ok());
  EXPECT_NE(plan.status().message().find("--train-batch 4"), std::string::npos) << plan.status().message();
}

TEST_F(PlanTest, ReadsAnAioSummaryAndNamesABadOne) {
  Machine m = machine(std::uint64_t{8} << 30);
  const std::string good = (dir_ / "summary.json").string();
  {
    std::ofstream f(good);
    f << R"({"best": {"read_gbps": 3.5, "write_gbps": 2.25}, "aio": {"block_size": 262144, "queue_depth": 16}})";
  }
  ASSERT_TRUE(read_aio_summary(good, m).is_ok());
  EXPECT_DOUBLE_EQ(m.nvme_read_gbps.value, 3.5);
  EXPECT_EQ(m.aio.block_size, 262144);
  EXPECT_EQ(m.aio.queue_depth, 16);
  const std::string bad = (dir_ / "bad.json").string();
  {
    std::ofstream f(bad);
    f << R"({"best": {"read_gbps": "fast"}})";
  }
  Status s = read_aio_summary(bad, m);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("best.read_gbps"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace zinf::zero3

namespace zinf::zero3 {
namespace {

// A GPU plan on the host: the GPU's workspace stands in as the CPU model's activations (the GPU
// models' own sizes are checked in tests/gpu/plan_gpu_*_test).
class PlanOnGpuTest : public PlanTest {
 protected:
  Machine gpu_machine(std::uint64_t room) const {
    Machine m = machine(std::uint64_t{8} << 30);
    auto g = plan_gpu("NVIDIA H100 80GB HBM3", room, "test", std::nullopt, std::nullopt, std::nullopt);
    EXPECT_TRUE(g.is_ok()) << g.status().to_string();
    m.gpu = std::move(g).value();
    return m;
  }
  PlanRequest gpu_request(const model::GptConfig& c) const {
    PlanRequest r = request(c);
    r.gpu_workspace = [](const model::Model& m, int rows) -> Result<std::uint64_t> {
      return m.activation_bytes(rows / m.max_seq(), m.max_seq());
    };
    return r;
  }
};

const Candidate* best_with(const Plan& plan, config::OffloadDevice params) {
  for (const Candidate& c : plan.fitting) {
    if (c.param_device == params) return &c;
  }
  return nullptr;
}

TEST(PlanGpu, KnowsTheDatasheetAndAsksForAnUnknownGpusPeak) {
  auto h100 = plan_gpu("NVIDIA H100 80GB HBM3", 1ull << 30, "test", std::nullopt, std::nullopt, std::nullopt);
  ASSERT_TRUE(h100.is_ok());
  EXPECT_EQ(h100->tflops.value, 989);
  EXPECT_EQ(h100->hbm_gbps.value, 3350);
  EXPECT_EQ(h100->pcie_gbps.value, 55);
  auto pcie = plan_gpu("NVIDIA H100 PCIe", 1ull << 30, "test", std::nullopt, std::nullopt, std::nullopt);
  ASSERT_TRUE(pcie.is_ok());
  EXPECT_EQ(pcie->tflops.value, 756);  // the more specific name wins
  auto l40s = plan_gpu("NVIDIA L40S", 1ull << 30, "test", std::nullopt, std::nullopt, std::nullopt);
  ASSERT_TRUE(l40s.is_ok());
  EXPECT_EQ(l40s->tflops.value, 362);  // not the L4's
  EXPECT_EQ(l40s->pcie_gbps.value, 25);
  auto a100 = plan_gpu("NVIDIA A100-SXM4-80GB", 1ull << 30, "test", std::nullopt, std::nullopt, std::nullopt);
  ASSERT_TRUE(a100.is_ok());
  EXPECT_EQ(a100->hbm_gbps.value, 2039);  // not the 40 GB one's 1555
  auto unknown = plan_gpu("Some Future GPU", 1ull << 30, "test", std::nullopt, std::nullopt, std::nullopt);
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_NE(unknown.status().message().find("--gpu-tflops"), std::string::npos) << unknown.status().message();
  EXPECT_NE(unknown.status().message().find("Some Future GPU"), std::string::npos);
  auto given = plan_gpu("Some Future GPU", 1ull << 30, "test", 500.0, std::nullopt, 60.0);
  ASSERT_TRUE(given.is_ok());
  EXPECT_EQ(given->tflops.source, "given (--gpu-tflops)");
  EXPECT_EQ(given->pcie_gbps.value, 60);
  EXPECT_FALSE(plan_gpu("NVIDIA H200", 0, "test", std::nullopt, std::nullopt, std::nullopt).is_ok());
  auto unnamed = plan_gpu("", 1ull << 30, "test", std::nullopt, std::nullopt, std::nullopt);
  ASSERT_FALSE(unnamed.is_ok());
  EXPECT_NE(unnamed.status().message().find("--gpu-name"), std::string::npos) << unnamed.status().message();
  auto unnamed_given = plan_gpu("", 1ull << 30, "test", 100.0, std::nullopt, std::nullopt);
  ASSERT_TRUE(unnamed_given.is_ok());
  EXPECT_EQ(unnamed_given->name, "an unnamed GPU");
}

// With room for everything, the whole state stays on the GPU; every candidate is a GPU run with
// its GPU bytes predicted, and the written config parses with the offload it names.
TEST_F(PlanOnGpuTest, AGpuWithRoomKeepsTheWholeStateOnIt) {
  auto plan = make_plan(gpu_request(tiny_gpt()), gpu_machine(std::uint64_t{8} << 30));
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  ASSERT_FALSE(plan->fitting.empty());
  for (const Candidate& c : plan->fitting) {
    EXPECT_TRUE(c.on_gpu);
    EXPECT_GT(c.memory.gpu, 0u);
    EXPECT_GT(c.compute_s, 0.0);
  }
  const Candidate& w = plan->fitting.front();
  EXPECT_EQ(w.param_device, config::OffloadDevice::kNone);
  EXPECT_EQ(w.optimizer_device, config::OffloadDevice::kNone);
  EXPECT_EQ(w.pcie_s, 0.0);  // nothing crosses
  auto ds = config::parse_ds_config(w.ds_config, "<plan>", config::AutoContext{});
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  EXPECT_EQ(ds->zero.offload_param.device, config::OffloadDevice::kNone);
  // A host-state candidate that keeps the values across micro-batches writes a reuse distance
  // past a pass's traffic, and moves the values up once a step.
  const Candidate* host = best_with(*plan, config::OffloadDevice::kCpu);
  ASSERT_NE(host, nullptr);
  EXPECT_GT(host->pcie_s, 0.0);
  bool resident = false;
  for (const Candidate& c : plan->fitting) {
    if (c.param_device != config::OffloadDevice::kCpu || c.max_reuse_distance == 0) continue;
    resident = true;
    auto cds = config::parse_ds_config(c.ds_config, "<plan>", config::AutoContext{});
    ASSERT_TRUE(cds.is_ok());
    EXPECT_EQ(cds->zero.max_reuse_distance, c.max_reuse_distance);
    EXPECT_GE(static_cast<double>(c.max_reuse_distance), 2.0 * static_cast<double>(c.memory.shard_elements));
  }
  EXPECT_TRUE(resident);
  EXPECT_NE(plan->why_winner.find("GPU"), std::string::npos) << plan->why_winner;
}

// A GPU too small for the state: the candidates that keep it there are dropped with the GPU's
// shortfall, and the state goes to the host.
TEST_F(PlanOnGpuTest, AGpuTooSmallForTheStateMovesItToTheHost) {
  const PlanRequest r = gpu_request(tiny_gpt());
  auto roomy = make_plan(r, gpu_machine(std::uint64_t{8} << 30));
  ASSERT_TRUE(roomy.is_ok());
  const Candidate* on = best_with(*roomy, config::OffloadDevice::kNone);
  const Candidate* off = best_with(*roomy, config::OffloadDevice::kCpu);
  ASSERT_TRUE(on != nullptr && off != nullptr);
  ASSERT_GT(on->memory.gpu, off->memory.gpu);
  // Room between the two: only the host-state candidates fit.
  const std::uint64_t room = (on->memory.gpu + off->memory.gpu) / 2;
  auto tight = make_plan(r, gpu_machine(room));
  ASSERT_TRUE(tight.is_ok()) << tight.status().to_string();
  ASSERT_FALSE(tight->fitting.empty());
  EXPECT_NE(tight->fitting.front().param_device, config::OffloadDevice::kNone);
  bool named = false;
  for (const Candidate& c : tight->dropped) {
    if (c.param_device == config::OffloadDevice::kNone && c.why_not.find("GPU memory") != std::string::npos) named = true;
  }
  EXPECT_TRUE(named);
  // Room for nothing: the shortfall names the GPU and how much more it needs.
  auto none = make_plan(r, gpu_machine(4096));
  ASSERT_TRUE(none.is_ok());
  EXPECT_TRUE(none->fitting.empty());
  EXPECT_NE(none->shortfall.find("more GPU memory"), std::string::npos) << none->shortfall;
}

TEST_F(PlanOnGpuTest, AGpuPlanNeedsTheGpuModelsWorkspace) {
  auto plan = make_plan(request(tiny_gpt()), gpu_machine(std::uint64_t{8} << 30));
  ASSERT_FALSE(plan.is_ok());
  EXPECT_NE(plan.status().message().find("GPU build"), std::string::npos);
}

// predict_config: a given config as the planner sees it, on the GPU and on the host.
TEST_F(PlanOnGpuTest, PredictsAGivenConfigOnTheGpuAndTheHost) {
  auto plan = make_plan(gpu_request(tiny_gpt()), gpu_machine(std::uint64_t{8} << 30));
  ASSERT_TRUE(plan.is_ok());
  const Candidate& w = plan->fitting.front();
  auto ds = config::parse_ds_config(w.ds_config, "<plan>", config::AutoContext{});
  ASSERT_TRUE(ds.is_ok());
  auto again = predict_config(gpu_request(tiny_gpt()), gpu_machine(std::uint64_t{8} << 30), ds.value());
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_DOUBLE_EQ(again->step_s, w.step_s);
  EXPECT_EQ(again->memory.gpu, w.memory.gpu);
  EXPECT_TRUE(again->fits);
  auto host = predict_config(request(tiny_gpt()), machine(std::uint64_t{8} << 30), ds.value());
  ASSERT_TRUE(host.is_ok()) << host.status().to_string();
  EXPECT_FALSE(host->on_gpu);
  EXPECT_EQ(host->memory.gpu, 0u);
  EXPECT_EQ(host->param_device, config::OffloadDevice::kCpu);  // "none" keeps it in host memory there
}

}  // namespace
}  // namespace zinf::zero3
