// Engine tests: bit-identical training across offload devices, pipelining and live budgets;
// resume; loss goes down; clear errors for impossible budgets.
#include "zinf/zero3/engine.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/checksum.h"
#include "common/file_io.h"
#include "temp_dir.h"
#include "zinf/aio/fault.h"
#include "zinf/config/ds_config.h"
#include "zinf/model/data.h"
#include "zinf/model/gpt.h"
#include "zinf/model/matmul.h"
#include "zinf/zero3/checkpoint.h"
#include "zinf/zero3/safetensors.h"

namespace zinf::zero3 {
namespace {

using zinf::testing::TempDir;

struct RunSetup {
  std::string param_device = "none";
  std::string optim_device = "none";
  bool pipeline = true;
  std::int64_t max_live = 1000000000;
  std::int64_t sub_group = 3000;
  std::string precision = "bf16";  // or "fp32"
  int gas = 2;
  int param_buffer_count = 3;       // offload_param nvme staging buffers of 4096 elements
  std::int64_t prefetch_bucket = 4000;
  std::shared_ptr<aio::FaultInjector> faults;  // for the NVMe tiers' aio requests
  EngineDevice device;  // where gathered parameters and gradients live
  bool overlap_optimizer = false;
  double clipping = 1.0;  // gradient_clipping
  bool recompute = false;  // activation checkpointing
};

std::unique_ptr<model::Model> tiny_model(bool recompute = false) {
  model::GptConfig c;
  c.activation_checkpointing = recompute;
  c.vocab_size = 256;
  c.max_seq = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  return std::move(model::GptModel::create(c)).value();
}

std::string config_text(const RunSetup& s, const std::string& nvme) {
  auto offload = [&](const std::string& device, bool optimizer) {
    std::string block = fmt::format(R"({{"device": "{}")", device);
    if (device == "nvme") block += fmt::format(R"(, "nvme_path": "{}")", nvme);
    if (device == "nvme" && optimizer) {
      block += fmt::format(R"(, "pipeline_read": {0}, "pipeline_write": {0})", s.pipeline ? "true" : "false");
    }
    if (device == "nvme" && !optimizer) {
      block += fmt::format(R"(, "buffer_count": {}, "buffer_size": 4096, "max_in_cpu": 0)", s.param_buffer_count);
    }
    return block + "}";
  };
  return fmt::format(R"({{
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": {gas},
    "gradient_clipping": {clip},
    {precision}
    "optimizer": {{"type": "AdamW", "params": {{"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}}}},
    "scheduler": {{"type": "WarmupLR", "params": {{"warmup_min_lr": 0, "warmup_max_lr": 3e-3, "warmup_num_steps": 5, "warmup_type": "linear"}}}},
    "zero_optimization": {{
      "stage": 3, "sub_group_size": {sg}, "reduce_bucket_size": 5000,
      "stage3_prefetch_bucket_size": {prefetch}, "stage3_param_persistence_threshold": 64,
      "stage3_max_live_parameters": {live}, "stage3_max_reuse_distance": 3000,
      "offload_param": {op}, "offload_optimizer": {oo}
    }},
    "aio": {{"block_size": 65536, "queue_depth": 4}}
  }})",
                     fmt::arg("gas", s.gas), fmt::arg("clip", s.clipping),
                     fmt::arg("precision", s.precision == "bf16"   ? R"("bf16": {"enabled": true},)"
                                           : s.precision == "fp16" ? R"("fp16": {"enabled": true, "initial_scale_power": 12, "loss_scale_window": 4},)"
                                                                   : ""),
                     fmt::arg("sg", s.sub_group), fmt::arg("live", s.max_live), fmt::arg("prefetch", s.prefetch_bucket),
                     fmt::arg("op", offload(s.param_device, false)), fmt::arg("oo", offload(s.optim_device, true)));
}

struct RunResult {
  std::vector<float> losses;
  std::vector<std::vector<float>> weights;
  std::vector<StepReport> reports;
};

class Trainer {
 public:
  Trainer(const RunSetup& s, const std::string& nvme) : setup_(s) {
    auto ds = config::parse_ds_config(config_text(s, nvme), "test_config", config::AutoContext{});
    status_ = ds.status();
    if (!ds.is_ok()) return;
    comm_ = make_local_communicator();
    EngineOptions options{ds.value(), 7, ""};
    options.aio_faults = s.faults;
    options.device = s.device;
    options.overlap_optimizer = s.overlap_optimizer;
    auto engine = Engine::create(tiny_model(s.recompute), std::move(options), *comm_);
    status_ = engine.status();
    if (engine.is_ok()) engine_ = std::move(engine).value();
    data_ = model::TokenDataset::from_text(std::string(
        "It was the best of times, it was the worst of times, it was the age of wisdom, it was the "
        "age of foolishness, it was the epoch of belief, it was the epoch of incredulity. "), "test text");
  }
  const Status& status() const { return status_; }
  Engine& engine() { return *engine_; }

  // Steps [from, to): batches depend only on the step number, so a resumed run sees the same data.
  Status run(int from, int to, RunResult* out) {
    const int B = 2, T = 16;
    for (int step = from; step < to; ++step) {
      std::vector<std::vector<std::int32_t>> in(setup_.gas), tg(setup_.gas);
      std::vector<MicroBatch> micro;
      for (int g = 0; g < setup_.gas; ++g) {
        for (int i = 0; i < B * T; ++i) {
          const std::size_t pos = (static_cast<std::size_t>(step * 37 + g * 11 + i * 3)) % (data_.size() - 1);
          in[g].push_back(data_.tokens()[pos]);
          tg[g].push_back(data_.tokens()[pos + 1]);
        }
        micro.push_back(MicroBatch{in[g], tg[g], B, T});
      }
      auto r = engine_->train_step(micro);
      if (!r.is_ok()) return r.status();
      out->losses.push_back(static_cast<float>(r->loss));
      out->reports.push_back(r.value());
    }
    out->weights.clear();
    for (std::size_t p = 0; p < engine_->model().params().size(); ++p) {
      std::vector<float> w(engine_->model().params()[p].numel);
      ZINF_RETURN_IF_ERROR(engine_->read_full_param(p, w));
      out->weights.push_back(std::move(w));
    }
    return Status::ok();
  }

 private:
  RunSetup setup_;
  Status status_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Engine> engine_;
  model::TokenDataset data_ = model::TokenDataset::from_text("x", "empty");
};

RunResult train(const RunSetup& s, int steps) {
  TempDir nvme;
  Trainer t(s, nvme.path());
  EXPECT_TRUE(t.status().is_ok()) << t.status().to_string();
  RunResult r;
  if (!t.status().is_ok()) return r;
  Status st = t.run(0, steps, &r);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return r;
}

void expect_identical(const RunResult& a, const RunResult& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  for (std::size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(std::memcmp(&a.losses[i], &b.losses[i], sizeof(float)), 0)
        << what << ": step " << i + 1 << " loss " << a.losses[i] << " vs " << b.losses[i];
  }
  ASSERT_EQ(a.weights.size(), b.weights.size()) << what;
  for (std::size_t p = 0; p < a.weights.size(); ++p) {
    EXPECT_EQ(a.weights[p], b.weights[p]) << what << ": parameter " << p;
  }
}

constexpr int kSteps = 20;

TEST(EngineTest, OffloadDevicesGiveBitIdenticalTraining) {
  const RunResult base = train(RunSetup{}, kSteps);
  ASSERT_EQ(base.losses.size(), static_cast<std::size_t>(kSteps));
  EXPECT_LT(base.losses.back(), base.losses.front() - 0.5f) << "training should lower the loss";
  for (const std::string p : {"none", "cpu", "nvme"}) {
    for (const std::string o : {"none", "cpu", "nvme"}) {
      if (p == "none" && o == "none") continue;
      RunSetup s;
      s.param_device = p;
      s.optim_device = o;
      expect_identical(base, train(s, kSteps), "offload_param " + p + ", offload_optimizer " + o);
    }
  }
}

// auto gives bf16 configs fp32 products on most CPUs (its table: docs/model.md, "Matrix
// products"); this pins oneDNN's bf16 products (where they run) so that their path through the
// engine is covered on every machine with bf16 units.
TEST(EngineTest, Bf16ProductsGiveBitIdenticalTrainingAcrossOffloadDevices) {
  const model::MatmulSupport support = model::matmul_support();
  if (!support.dnnl_built || !support.bf16_units) GTEST_SKIP() << "no bf16 products here (" << support.isa << ")";
  const char* old = std::getenv("ZINF_MATMUL");
  const std::optional<std::string> saved = old != nullptr ? std::optional<std::string>(old) : std::nullopt;
  setenv("ZINF_MATMUL", "bf16", 1);
  const RunResult base = train(RunSetup{}, kSteps);
  RunSetup nvme;
  nvme.param_device = "nvme";
  nvme.optim_device = "nvme";
  const RunResult off = train(nvme, kSteps);
  setenv("ZINF_MATMUL", "fp32", 1);
  const RunResult fp32 = train(RunSetup{}, kSteps);
  if (saved) {
    setenv("ZINF_MATMUL", saved->c_str(), 1);
  } else {
    unsetenv("ZINF_MATMUL");
  }
  ASSERT_EQ(base.losses.size(), static_cast<std::size_t>(kSteps));
  expect_identical(base, off, "bf16 products, offload_param and offload_optimizer nvme");
  // The products really were bf16: the losses differ from the fp32 products' somewhere.
  ASSERT_EQ(fp32.losses.size(), base.losses.size());
  EXPECT_NE(std::memcmp(fp32.losses.data(), base.losses.data(), base.losses.size() * sizeof(float)), 0);
}

TEST(EngineTest, PipeliningAndLiveBudgetDoNotChangeResults) {
  const RunResult base = train(RunSetup{}, kSteps);
  RunSetup unpipelined;
  unpipelined.param_device = "nvme";
  unpipelined.optim_device = "nvme";
  unpipelined.pipeline = false;
  expect_identical(base, train(unpipelined, kSteps), "pipelining off");
  // The largest module (wte + wpe: 256*32 + 16*32 elements) just fits: forces releases.
  RunSetup tight = unpipelined;
  tight.pipeline = true;
  tight.max_live = 256 * 32 + 16 * 32 + 64;
  expect_identical(base, train(tight, kSteps), "small max_live_parameters");
  // Prefetch wants far more than the two staging buffers hold: it must stage only what fits
  // (staging more deadlocks: a reader waits for a prefetch parked behind later ones).
  RunSetup small_pool = unpipelined;
  small_pool.param_buffer_count = 2;
  small_pool.prefetch_bucket = 1000000;
  expect_identical(base, train(small_pool, kSteps), "two staging buffers, large prefetch bucket");
}

// The device-resident path on the host device (gathered parameters and gradients in device
// memory, uploads ahead of use, gradient downloads under backward) gives the host path's bits for
// every offload device, precision and activation checkpointing, under random stream delays and
// with new device blocks poisoned.
TEST(EngineTest, HostDeviceGivesBitIdenticalTraining) {
  constexpr int kDeviceSteps = 4;
  struct Case {
    const char* precision;
    bool recompute;
    const char* where;
  };
  // Every offload device in bf16, each precision, and activation checkpointing in each.
  const Case cases[] = {{"bf16", false, "none"}, {"bf16", false, "cpu"}, {"bf16", false, "nvme"},
                        {"fp32", false, "nvme"}, {"bf16", true, "cpu"},  {"fp32", true, "none"}};
  for (const Case& c : cases) {
    RunSetup host;
    host.precision = c.precision;
    host.recompute = c.recompute;
    host.param_device = c.where;
    host.optim_device = c.where;
    RunSetup on_device = host;
    on_device.device.kind = EngineDevice::Kind::kHostDevice;
    on_device.device.seed = 17;
    on_device.device.max_delay_us = 200;
    on_device.device.poison_new_blocks = true;
    const std::string what = fmt::format("{}, activation checkpointing {}, offload {}", c.precision,
                                         c.recompute ? "on" : "off", c.where);
    const RunResult host_run = train(host, kDeviceSteps);
    expect_identical(host_run, train(on_device, kDeviceSteps), what);
    if (std::string(c.where) == "cpu" && !c.recompute) {
      // Gradients summed on the device across the two micro-batches: all of them above, some
      // (the limit reached part-way) here, none (each micro-batch's comes back) last.
      for (const std::uint64_t hold : {std::uint64_t{64} << 10, std::uint64_t{0}}) {
        RunSetup partial = on_device;
        partial.device.hold_gradient_bytes = hold;
        expect_identical(host_run, train(partial, kDeviceSteps), fmt::format("{}, {} bytes of held sums", what, hold));
      }
    }
  }
}

// The optimizer stepped sub-group by sub-group during the last backward (early_step.h) gives the
// step at the end's bits, whether the early steps are kept (nothing clips) or rolled back (the
// step clips); both happen in these runs. (A skipped step's rollback: tier_factory_test's
// EarlyStepper test, as fp16 here overflows nowhere or everywhere.)
TEST(EngineTest, OverlappedOptimizerGivesTheStepAtTheEndsBits) {
  struct Case {
    const char* precision;
    const char* where;
    double clipping;
  };
  // fp32 in memory: the parameters are the master weights themselves (updated in place).
  const Case cases[] = {{"bf16", "none", 100.0}, {"bf16", "cpu", 1.0}, {"fp32", "none", 1.0},
                        {"fp32", "cpu", 100.0},  {"fp16", "cpu", 100.0}};
  std::uint64_t kept = 0, rolled_back = 0;
  for (const Case& c : cases) {
    RunSetup at_end;
    at_end.precision = c.precision;
    at_end.param_device = c.where;
    at_end.optim_device = c.where;
    at_end.clipping = c.clipping;
    at_end.sub_group = 1000;  // several sub-groups, so some step while backward goes on
    RunSetup overlapped = at_end;
    overlapped.overlap_optimizer = true;
    const RunResult a = train(at_end, 8);
    const RunResult b = train(overlapped, 8);
    expect_identical(a, b, fmt::format("{}, offload {}, clipping {}", c.precision, c.where, c.clipping));
    for (const StepReport& r : b.reports) {
      kept += r.early_subgroups;
      rolled_back += r.early_rolled_back;
      EXPECT_EQ(r.early_subgroups > 0 && r.early_rolled_back > 0, false) << "a step keeps all or none";
    }
  }
  EXPECT_GT(kept, 0u) << "no early step was ever kept: the overlap never happened";
  EXPECT_GT(rolled_back, 0u) << "no clipped step: the rollback path was not exercised";
}

// A step speculates only after a step that was kept as speculated: where clipping fires every
// step, only the first step's early steps are rolled back, and the rest are taken at the end
// (early_step.h); where it never fires, every step keeps its early steps. Bits as always.
TEST(EngineTest, OverlappedOptimizerStopsSpeculatingWhileClippingPersists) {
  for (const double clipping : {1e-6, 100.0}) {  // clips every step, or never
    RunSetup at_end;
    at_end.clipping = clipping;
    at_end.param_device = "cpu";
    at_end.optim_device = "cpu";
    RunSetup overlapped = at_end;
    overlapped.overlap_optimizer = true;
    const RunResult a = train(at_end, 5);
    const RunResult b = train(overlapped, 5);
    expect_identical(a, b, fmt::format("clipping {}", clipping));
    ASSERT_EQ(b.reports.size(), 5u);
    for (std::size_t i = 0; i < b.reports.size(); ++i) {
      const StepReport& r = b.reports[i];
      if (clipping < 1.0) {
        EXPECT_EQ(r.early_subgroups, 0u) << "step " << i + 1;
        EXPECT_EQ(r.early_rolled_back > 0, i == 0) << "step " << i + 1 << ": only the first step speculates";
      } else {
        EXPECT_GT(r.early_subgroups, 0u) << "step " << i + 1;
        EXPECT_EQ(r.early_rolled_back, 0u) << "step " << i + 1;
      }
    }
  }
}

// NVMe optimizer state cannot step one sub-group alone: a notice, and the step at the end.
TEST(EngineTest, OverlappedOptimizerFallsBackWithNvmeState) {
  RunSetup s;
  s.param_device = "nvme";
  s.optim_device = "nvme";
  s.overlap_optimizer = true;
  const RunResult r = train(s, 2);
  ASSERT_EQ(r.reports.size(), 2u);
  EXPECT_EQ(r.reports[1].early_subgroups + r.reports[1].early_rolled_back, 0u);
}

// Its step report says what moved: parameters up, gradients down, the device memory it held
// (offload cpu: with offload none the whole state lives on the device, next test). Gradients are
// summed on the device across the step's micro-batches and come down once a step, unless that
// is turned off (hold_gradient_bytes 0): then once a micro-batch.
TEST(EngineTest, HostDeviceStepReportsItsTraffic) {
  for (const std::uint64_t hold : {EngineDevice::kAutoHold, std::uint64_t{0}}) {
    RunSetup s;
    s.param_device = "cpu";
    s.optim_device = "cpu";
    s.device.kind = EngineDevice::Kind::kHostDevice;
    s.device.hold_gradient_bytes = hold;
    s.max_live = 256 * 32 + 16 * 32 + 64;  // the largest module just fits
    TempDir nvme;
    Trainer t(s, nvme.path());
    ASSERT_TRUE(t.status().is_ok()) << t.status().to_string();
    const std::vector<std::int32_t> tokens(2 * 16, 5);
    const MicroBatch mb{tokens, tokens, 2, 16};
    std::vector<MicroBatch> micro = {mb, mb};
    for (int step = 0; step < 2; ++step) {
      auto r = t.engine().train_step(micro);
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      const std::uint64_t params = t.engine().model().num_params();
      // Every parameter goes up at least once a pass (2 passes), in bf16 as the memory tier holds
      // it (widened on the device); each gradient comes down in fp32.
      EXPECT_GE(r->h2d_bytes, 2 * params * sizeof(std::uint16_t)) << "step " << step;
      if (hold == 0) {
        EXPECT_EQ(r->d2h_bytes, 2 * params * sizeof(float)) << "step " << step << ": once a micro-batch";
      } else {
        EXPECT_EQ(r->d2h_bytes, params * sizeof(float)) << "step " << step << ": the step's sums, once";
      }
      EXPECT_GT(r->device_peak_bytes, 0u);
      // The host device times its copies: the step's GB/s have a denominator.
      EXPECT_GT(r->h2d_copy_s, 0.0);
      EXPECT_GT(r->d2h_copy_s, 0.0);
      EXPECT_LE(r->live_high_water, static_cast<std::uint64_t>(s.max_live));
      // The step's parts are disjoint pieces of it: before the passes, the passes, after them,
      // the optimizer phase.
      const double parts = r->setup_s + r->forward_s + r->backward_s + r->after_passes_s + r->optimizer_s;
      EXPECT_GE(r->setup_s, 0.0);
      EXPECT_GE(r->after_passes_s, 0.0);
      EXPECT_GT(r->forward_s + r->backward_s, 0.0);
      EXPECT_LE(parts, r->seconds + 1e-9) << "step " << step;
    }
  }
}

// With offload none and one rank the state lives in the device's memory (device_state.h): the
// same bits as the host path (HostDeviceGivesBitIdenticalTraining), and nothing crosses to the
// host during a step; the tiers say where they are.
TEST(EngineTest, HostDeviceKeepsAnOffloadNoneStateInDeviceMemory) {
  RunSetup s;
  s.device.kind = EngineDevice::Kind::kHostDevice;
  s.device.poison_new_blocks = true;
  TempDir nvme;
  Trainer t(s, nvme.path());
  ASSERT_TRUE(t.status().is_ok()) << t.status().to_string();
  EXPECT_NE(t.engine().describe().find("in device memory"), std::string::npos) << t.engine().describe();
  const std::vector<std::int32_t> tokens(2 * 16, 5);
  const MicroBatch mb{tokens, tokens, 2, 16};
  std::vector<MicroBatch> micro = {mb, mb};
  for (int step = 0; step < 2; ++step) {
    auto r = t.engine().train_step(micro);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->h2d_bytes, 0u) << "step " << step;
    EXPECT_EQ(r->d2h_bytes, 0u) << "step " << step;
    EXPECT_GT(r->device_peak_bytes, 4 * t.engine().model().num_params() * sizeof(float)) << "master, states, gradients";
  }
  // Weights and state read back through staging (read_full_param, checkpoints) are the device's.
  std::vector<float> w(t.engine().model().params()[0].numel);
  ASSERT_TRUE(t.engine().read_full_param(0, w).is_ok());
  EXPECT_TRUE(std::all_of(w.begin(), w.end(), [](float x) { return std::isfinite(x); }));
}

TEST(EngineTest, HostDeviceMemoryCapTooSmallIsAClearError) {
  for (const char* where : {"none", "cpu"}) {  // the state on the device, or only the gathers
    RunSetup s;
    s.param_device = where;
    s.optim_device = where;
    s.device.kind = EngineDevice::Kind::kHostDevice;
    s.device.memory_cap_bytes = 4096;
    TempDir nvme;
    Trainer t(s, nvme.path());
    Status st = t.status();
    if (st.is_ok()) {
      RunResult r;
      st = t.run(0, 1, &r);
    }
    ASSERT_FALSE(st.is_ok()) << where;
    EXPECT_NE(st.message().find("device memory"), std::string::npos) << st.to_string();
  }
}

// "fd:<n>" of this process's one open optimizer swap data file; empty when there is not exactly
// one, or when another open descriptor's name starts with the same digits (fd:1 vs fd:12).
std::string optimizer_store_fd() {
  std::vector<std::string> fds;
  std::string found;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    fds.push_back(e.path().filename().string());
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && target.find("/optimizer/stripe") != std::string::npos) {
      if (!found.empty()) return "";
      found = fds.back();
    }
  }
  for (const std::string& other : fds) {
    if (other != found && other.rfind(found, 0) == 0) return "";
  }
  return found.empty() ? "" : "fd:" + found;
}

// The optimizer state is read ahead of the step, under the passes. A read of it that fails fails
// that train_step (naming the read-ahead and the step, the previous step committed), and the
// same batch retried trains on bit-identically to a run that saw no fault.
TEST(EngineTest, FailedOptimizerReadAheadFailsItsStepAndTheRetryMatches) {
  RunSetup s;
  s.param_device = "nvme";
  s.optim_device = "nvme";
  const RunResult want = train(s, 6);
  s.faults = std::make_shared<aio::FaultInjector>();
  TempDir nvme;
  Trainer t(s, nvme.path());
  ASSERT_TRUE(t.status().is_ok()) << t.status().to_string();
  RunResult got;
  ASSERT_TRUE(t.run(0, 3, &got).is_ok());
  // The optimizer store's data file, by its descriptor (the store's requests are fd-based, named
  // "fd:<n>"): its first read in the next step is the read-ahead's.
  const std::string fd = optimizer_store_fd();
  ASSERT_FALSE(fd.empty()) << "no open optimizer stripe file";
  aio::FaultRule rule;
  rule.op = aio::FaultOp::kRead;
  rule.path_contains = fd;
  s.faults->add(rule);
  RunResult failed;
  const Status st = t.run(3, 4, &failed);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(s.faults->injected(), 1u);
  EXPECT_EQ(st.sys_errno(), 5) << st.to_string();
  EXPECT_NE(st.message().find("(read ahead of the step)"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("optimizer step 4 failed (the state of step 3 stays committed and intact)"),
            std::string::npos)
      << st.to_string();
  s.faults->clear();
  const Status retried = t.run(3, 6, &got);
  ASSERT_TRUE(retried.is_ok()) << retried.to_string();
  expect_identical(want, got, "a failed read-ahead, then the step retried");
}

// fp32 copies are the master weights: read in place (both in memory), copied per tile from the
// swapper, or written to the parameter swap store from either optimizer tier.
TEST(EngineTest, Fp32TrainingMatchesAcrossOptimizerDevices) {
  RunSetup a;
  a.precision = "fp32";
  const RunResult want = train(a, 8);
  for (const auto& [param, optim] : {std::pair{"cpu", "nvme"}, std::pair{"nvme", "nvme"}, std::pair{"nvme", "cpu"}}) {
    RunSetup b = a;
    b.param_device = param;
    b.optim_device = optim;
    expect_identical(want, train(b, 8), fmt::format("fp32, parameters on {}, optimizer on {}", param, optim));
  }
}

TEST(EngineTest, Fp16WithDynamicLossScalingMatchesAcrossDevices) {
  RunSetup a;
  a.precision = "fp16";
  RunSetup b = a;
  b.param_device = "nvme";
  b.optim_device = "nvme";
  const RunResult ra = train(a, 12);
  expect_identical(ra, train(b, 12), "fp16, nvme");
  ASSERT_EQ(ra.losses.size(), 12u);
  EXPECT_LT(ra.losses.back(), ra.losses.front());
}

TEST(EngineTest, ResumeContinuesBitIdentically) {
  for (const std::string device : {"none", "nvme"}) {
    RunSetup s;
    s.param_device = device;
    s.optim_device = device;
    const RunResult full = train(s, kSteps);
    TempDir nvme, ckpt;
    RunResult first, second;
    {
      Trainer t(s, nvme.path());
      ASSERT_TRUE(t.status().is_ok());
      ASSERT_TRUE(t.run(0, 10, &first).is_ok());
      Status saved = t.engine().save_checkpoint(ckpt.path(), "global_step10", R"({"note": "x"})");
      ASSERT_TRUE(saved.is_ok()) << saved.to_string();
    }
    Trainer t(s, nvme.path());
    ASSERT_TRUE(t.status().is_ok());
    auto client = t.engine().load_checkpoint(ckpt.path(), "");
    ASSERT_TRUE(client.is_ok()) << device << ": " << client.status().to_string();
    EXPECT_EQ(client.value(), R"({"note": "x"})");
    EXPECT_EQ(t.engine().counters().steps, 10);
    ASSERT_TRUE(t.run(10, kSteps, &second).is_ok());
    RunResult joined{first.losses, second.weights, {}};
    joined.losses.insert(joined.losses.end(), second.losses.begin(), second.losses.end());
    expect_identical(full, joined, "resume at step 10, device " + device);
  }
}

// A checkpoint saved from a state in device memory (offload none on the host device,
// device_state.h) resumes on the host path, and one saved on the host path resumes into device
// memory: both continue bit for bit as the uninterrupted host run (read_state, load_state and
// the parameter copies rewritten from the loaded master weights, through staging).
TEST(EngineTest, ResumeBetweenDeviceMemoryAndHostMemoryContinuesBitIdentically) {
  RunSetup host;
  RunSetup on_device = host;
  on_device.device.kind = EngineDevice::Kind::kHostDevice;
  on_device.device.seed = 3;
  on_device.device.max_delay_us = 100;
  on_device.device.poison_new_blocks = true;
  const RunResult full = train(host, 8);
  for (const bool device_first : {true, false}) {
    const RunSetup& a = device_first ? on_device : host;
    const RunSetup& b = device_first ? host : on_device;
    TempDir nvme, ckpt;
    RunResult first, second;
    {
      Trainer t(a, nvme.path());
      ASSERT_TRUE(t.status().is_ok()) << t.status().to_string();
      ASSERT_TRUE(t.run(0, 5, &first).is_ok());
      Status saved = t.engine().save_checkpoint(ckpt.path(), "global_step5", "{}");
      ASSERT_TRUE(saved.is_ok()) << saved.to_string();
    }
    Trainer t(b, nvme.path());
    ASSERT_TRUE(t.status().is_ok()) << t.status().to_string();
    auto client = t.engine().load_checkpoint(ckpt.path(), "");
    ASSERT_TRUE(client.is_ok()) << client.status().to_string();
    ASSERT_TRUE(t.run(5, 8, &second).is_ok());
    RunResult joined{first.losses, second.weights, {}};
    joined.losses.insert(joined.losses.end(), second.losses.begin(), second.losses.end());
    expect_identical(full, joined, device_first ? "saved in device memory, resumed on the host"
                                                : "saved on the host, resumed in device memory");
  }
}

// A checkpoint saved with one sub_group_size loads into another layout (the re-partitioning
// path that also serves another world size): training continues bit for bit.
TEST(EngineTest, ResumeIntoAnotherSubGroupSizeContinuesBitIdentically) {
  RunSetup s;
  const RunResult full = train(s, 12);
  TempDir nvme, ckpt;
  RunResult first, second;
  {
    Trainer t(s, nvme.path());
    ASSERT_TRUE(t.status().is_ok());
    ASSERT_TRUE(t.run(0, 6, &first).is_ok());
    ASSERT_TRUE(t.engine().save_checkpoint(ckpt.path(), "global_step6", "{}").is_ok());
  }
  RunSetup other = s;
  other.sub_group = 50000;  // one sub-group instead of several
  other.optim_device = "nvme";
  Trainer t(other, nvme.path());
  ASSERT_TRUE(t.status().is_ok());
  auto client = t.engine().load_checkpoint(ckpt.path(), "");
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  ASSERT_TRUE(t.run(6, 12, &second).is_ok());
  RunResult joined{first.losses, second.weights, {}};
  joined.losses.insert(joined.losses.end(), second.losses.begin(), second.losses.end());
  expect_identical(full, joined, "resume at step 6 with sub_group_size 50000");
}

TEST(EngineTest, ConsolidatedWeightsRestartTraining) {
  TempDir nvme, ckpt;
  RunSetup s;
  Trainer t(s, nvme.path());
  ASSERT_TRUE(t.status().is_ok());
  RunResult r;
  ASSERT_TRUE(t.run(0, 3, &r).is_ok());
  ASSERT_TRUE(t.engine().save_checkpoint(ckpt.path(), "global_step3", "{}").is_ok());
  const std::string st = ckpt.path() + "/model.safetensors";
  Status c = consolidate_checkpoint(ckpt.path(), st);
  ASSERT_TRUE(c.is_ok()) << c.to_string();
  auto reader = SafetensorsReader::open(st);
  ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
  ASSERT_EQ(reader->entries().size(), r.weights.size());
  for (std::size_t p = 0; p < r.weights.size(); ++p) {
    std::vector<float> w(r.weights[p].size());
    ASSERT_TRUE(reader->read_f32(t.engine().model().params()[p].name, w).is_ok());
    EXPECT_EQ(w, r.weights[p]) << t.engine().model().params()[p].name;
  }
  // --init-from: a new engine starts from exactly these weights.
  auto ds = config::parse_ds_config(config_text(s, nvme.path()), "test_config", config::AutoContext{});
  ASSERT_TRUE(ds.is_ok());
  auto comm = make_local_communicator();
  auto engine = Engine::create(tiny_model(), EngineOptions{ds.value(), 99, st}, *comm);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  for (std::size_t p = 0; p < r.weights.size(); ++p) {
    std::vector<float> w(r.weights[p].size());
    ASSERT_TRUE((*engine)->read_full_param(p, w).is_ok());
    EXPECT_EQ(w, r.weights[p]);
  }
}

TEST(EngineTest, CorruptCheckpointIsRefused) {
  TempDir nvme, ckpt;
  Trainer t(RunSetup{}, nvme.path());
  ASSERT_TRUE(t.status().is_ok());
  RunResult r;
  ASSERT_TRUE(t.run(0, 2, &r).is_ok());
  ASSERT_TRUE(t.engine().save_checkpoint(ckpt.path(), "a", "{}").is_ok());
  const std::string file = ckpt.path() + "/a/rank0.state";
  {
    FILE* f = std::fopen(file.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, 100, SEEK_SET);
    std::fputc(0x5A, f);
    std::fclose(f);
  }
  std::vector<float> before(t.engine().model().params()[0].numel), after(before.size());
  ASSERT_TRUE(t.engine().read_full_param(0, before).is_ok());
  auto loaded = t.engine().load_checkpoint(ckpt.path(), "");
  ASSERT_FALSE(loaded.is_ok());
  EXPECT_EQ(loaded.status().code(), ErrorCode::kCorruption);
  EXPECT_NE(loaded.status().message().find("rank0.state"), std::string::npos);
  // Nothing was loaded: the running state is untouched.
  ASSERT_TRUE(t.engine().read_full_param(0, after).is_ok());
  EXPECT_EQ(before, after);
}

TEST(EngineTest, TrainingOnTheDefaultCorpusLowersTheLoss) {
  TempDir nvme;
  RunSetup s;
  s.param_device = "nvme";
  s.optim_device = "nvme";
  s.gas = 1;
  auto ds = config::parse_ds_config(config_text(s, nvme.path()), "test_config", config::AutoContext{});
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  auto comm = make_local_communicator();
  auto engine = Engine::create(tiny_model(), EngineOptions{ds.value(), 3, ""}, *comm);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  auto loader = model::BatchLoader::create(model::TokenDataset::load_default(), {2, 16, 0, 1, 5, true});
  ASSERT_TRUE(loader.is_ok());
  std::vector<std::int32_t> in(32), tg(32);
  double first = 0, last = 0;
  const int steps = 40;
  for (int step = 0; step < steps; ++step) {
    // Average a few steps at each end: single-batch losses are noisy.
    ASSERT_TRUE(loader->next(in, tg).is_ok());
    const MicroBatch mb{in, tg, 2, 16};
    auto r = (*engine)->train_step(std::span<const MicroBatch>(&mb, 1));
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    if (step < 5) first += r->loss / 5;
    if (step >= steps - 5) last += r->loss / 5;
  }
  EXPECT_LT(last, first - 0.5) << "loss " << first << " -> " << last;
}

TEST(EngineTest, LiveBudgetSmallerThanAModuleIsAClearError) {
  RunSetup s;
  s.max_live = 1000;  // wte + wpe alone is 8704 elements
  TempDir nvme;
  Trainer t(s, nvme.path());
  ASSERT_TRUE(t.status().is_ok());
  RunResult r;
  Status st = t.run(0, 1, &r);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(st.message().find("stage3_max_live_parameters"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("wte_wpe"), std::string::npos) << st.message();
}

// Checkpoints name their checksum (xxh3-64); one without the name is refused, naming the key.
TEST(EngineTest, CheckpointWithoutChecksumAlgoIsRefused) {
  TempDir nvme, ckpt;
  Trainer t(RunSetup{}, nvme.path());
  ASSERT_TRUE(t.status().is_ok());
  RunResult r;
  ASSERT_TRUE(t.run(0, 1, &r).is_ok());
  ASSERT_TRUE(t.engine().save_checkpoint(ckpt.path(), "a", "{}").is_ok());
  const std::string json_path = ckpt.path() + "/a/engine.json";
  auto j = nlohmann::json::parse(std::ifstream(json_path));
  EXPECT_EQ(j.value("checksum_algo", ""), "xxh3-64");
  j.erase("checksum_algo");
  std::ofstream(json_path) << j.dump(2);
  auto loaded = t.engine().load_checkpoint(ckpt.path(), "");
  ASSERT_FALSE(loaded.is_ok());
  EXPECT_EQ(loaded.status().code(), ErrorCode::kCorruption);
  EXPECT_NE(loaded.status().message().find("checksum_algo"), std::string::npos) << loaded.status().message();
}

// Format 3 keeps each rank file's whole XXH3-64 (gathered as integers, not through a double); one
// flipped bit is damage. A format-2 checkpoint (earlier zinf: the top 53 bits) still loads and is
// still verified; formats 1 and 4 are not read.
TEST(EngineTest, CheckpointKeepsTheWholeChecksumAndReadsFormat2) {
  TempDir nvme, ckpt;
  Trainer t(RunSetup{}, nvme.path());
  ASSERT_TRUE(t.status().is_ok());
  RunResult r;
  ASSERT_TRUE(t.run(0, 1, &r).is_ok());
  ASSERT_TRUE(t.engine().save_checkpoint(ckpt.path(), "a", "{}").is_ok());
  const std::string json_path = ckpt.path() + "/a/engine.json";
  auto j = nlohmann::json::parse(std::ifstream(json_path));
  EXPECT_EQ(j.value("format", 0), 3);
  std::ifstream rank_file(ckpt.path() + "/a/rank0.state", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(rank_file)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(bytes.empty());
  const std::uint64_t whole = checksum64(bytes.data(), bytes.size());
  EXPECT_EQ(j["ranks"][0]["checksum"].get<std::uint64_t>(), whole);
  ASSERT_TRUE(t.engine().load_checkpoint(ckpt.path(), "a").is_ok());
  j["ranks"][0]["checksum"] = whole ^ (std::uint64_t{1} << 63);
  std::ofstream(json_path) << j.dump(2);
  auto damaged = t.engine().load_checkpoint(ckpt.path(), "a");
  ASSERT_FALSE(damaged.is_ok());
  EXPECT_EQ(damaged.status().code(), ErrorCode::kCorruption) << damaged.status().to_string();
  // The same checkpoint as format 2 wrote it: top 53 bits; one of them flipped is damage.
  j["format"] = 2;
  j["ranks"][0]["checksum"] = whole >> 11;
  std::ofstream(json_path) << j.dump(2);
  auto format2 = t.engine().load_checkpoint(ckpt.path(), "a");
  EXPECT_TRUE(format2.is_ok()) << format2.status().to_string();
  j["ranks"][0]["checksum"] = (whole >> 11) ^ 1;
  std::ofstream(json_path) << j.dump(2);
  auto damaged2 = t.engine().load_checkpoint(ckpt.path(), "a");
  ASSERT_FALSE(damaged2.is_ok());
  EXPECT_EQ(damaged2.status().code(), ErrorCode::kCorruption) << damaged2.status().to_string();
  for (int format : {1, 4}) {
    j["format"] = format;
    j["ranks"][0]["checksum"] = whole;
    std::ofstream(json_path) << j.dump(2);
    auto other = t.engine().load_checkpoint(ckpt.path(), "a");
    ASSERT_FALSE(other.is_ok());
    EXPECT_EQ(other.status().code(), ErrorCode::kUnsupported) << other.status().to_string();
    EXPECT_NE(other.status().message().find("reads formats 2 to 3"), std::string::npos) << other.status().message();
  }
}

// engine.json is untrusted: a missing key, a wrong type or a tag that leaves the folder is a
// Status naming the file and the key (a missing key used to abort --resume with exit 134).
TEST(EngineTest, MalformedEngineJsonIsAStatusNamingTheKey) {
  TempDir nvme, ckpt;
  Trainer t(RunSetup{}, nvme.path());
  ASSERT_TRUE(t.status().is_ok());
  RunResult r;
  ASSERT_TRUE(t.run(0, 1, &r).is_ok());
  ASSERT_TRUE(t.engine().save_checkpoint(ckpt.path(), "a", "{}").is_ok());
  const std::string json_path = ckpt.path() + "/a/engine.json";
  const auto saved = nlohmann::json::parse(std::ifstream(json_path));
  struct Case {
    std::function<void(nlohmann::json&)> damage;
    std::string expected;
  };
  const Case cases[] = {
      {[](nlohmann::json& j) { j["counters"].erase("steps"); }, "engine.json: counters: missing integer key \"steps\""},
      {[](nlohmann::json& j) { j.erase("counters"); }, "engine.json: counters: missing or not an object"},
      {[](nlohmann::json& j) { j["ranks"][0]["bytes"] = "12"; }, "engine.json: ranks[0].bytes: expected an integer"},
      {[](nlohmann::json& j) { j["world_size"] = 4294967297LL; }, "engine.json: world_size: 4294967297 is out of range"},
      {[](nlohmann::json& j) { j.erase("sub_group_size"); }, "engine.json: missing integer key \"sub_group_size\""},
  };
  for (const Case& c : cases) {
    nlohmann::json j = saved;
    c.damage(j);
    std::ofstream(json_path) << j.dump(2);
    auto loaded = t.engine().load_checkpoint(ckpt.path(), "");
    ASSERT_FALSE(loaded.is_ok()) << c.expected;
    EXPECT_EQ(loaded.status().code(), ErrorCode::kCorruption) << loaded.status().to_string();
    EXPECT_NE(loaded.status().message().find(c.expected), std::string::npos) << loaded.status().message();
  }
  std::ofstream(json_path) << saved.dump(2);
  ASSERT_TRUE(t.engine().load_checkpoint(ckpt.path(), "").is_ok());
  // A `latest` that points out of the folder is refused before anything is read.
  std::ofstream(ckpt.path() + "/latest") << "../a\n";
  auto escaped = t.engine().load_checkpoint(ckpt.path(), "");
  ASSERT_FALSE(escaped.is_ok());
  EXPECT_NE(escaped.status().message().find("checkpoint tag '../a': contains '/'"), std::string::npos)
      << escaped.status().message();
  EXPECT_FALSE(t.engine().load_checkpoint(ckpt.path(), "..").is_ok());
  EXPECT_FALSE(t.engine().save_checkpoint(ckpt.path(), "..", "{}").is_ok());
}

// The checkpoint folder has one writer at a time: a save while another holds the folder's lock
// is refused at once, naming the folder and the holder; the folder's files stay as they were.
TEST(EngineTest, SaveIntoAFolderBeingSavedIsRefused) {
  TempDir nvme, ckpt;
  Trainer t(RunSetup{}, nvme.path());
  ASSERT_TRUE(t.status().is_ok());
  RunResult r;
  ASSERT_TRUE(t.run(0, 1, &r).is_ok());
  {
    auto held = fileio::FileLock::acquire(ckpt.path() + "/.zinf_save.lock", "test");
    ASSERT_TRUE(held.is_ok()) << held.status().to_string();
    const Status st = t.engine().save_checkpoint(ckpt.path(), "a", "{}");
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("checkpoint folder " + ckpt.path() + " is in use"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("pid " + std::to_string(::getpid())), std::string::npos) << st.message();
    EXPECT_FALSE(std::filesystem::exists(ckpt.path() + "/a"));
  }
  ASSERT_TRUE(t.engine().save_checkpoint(ckpt.path(), "a", "{}").is_ok());
}

// Checkpoint files are 0600 in 0700 folders, and a symbolic link planted at a checkpoint file's
// name is replaced, never written through.
TEST(EngineTest, CheckpointFilesArePrivateAndLinksAreNotFollowed) {
  TempDir nvme, ckpt, elsewhere;
  Trainer t(RunSetup{}, nvme.path());
  ASSERT_TRUE(t.status().is_ok());
  RunResult r;
  ASSERT_TRUE(t.run(0, 1, &r).is_ok());
  const std::string victim = elsewhere.write("victim", "precious");
  std::filesystem::create_symlink(victim, ckpt.path() + "/latest");
  ASSERT_TRUE(t.engine().save_checkpoint(ckpt.path(), "a", "{}").is_ok());
  std::ifstream in(victim);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "precious");
  EXPECT_FALSE(std::filesystem::is_symlink(ckpt.path() + "/latest"));
  namespace fs = std::filesystem;
  EXPECT_EQ(fs::status(ckpt.path() + "/a").permissions() & fs::perms::all, fs::perms::owner_all);
  for (const char* f : {"/a/rank0.state", "/a/engine.json", "/latest"}) {
    EXPECT_EQ(fs::status(ckpt.path() + f).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write)
        << f;
  }
}

}  // namespace
}  // namespace zinf::zero3
