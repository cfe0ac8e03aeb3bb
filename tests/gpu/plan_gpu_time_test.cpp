// The planner's time on a GPU (predict_config with Machine::gpu set) against the step breakdowns
// of real GPU runs (docs/gpu-runs/*: gpu-check's "per step" lines). Host only: every CUDA build.
//
// What is checked: the passes (the GPU's kernels, and the copies and NVMe reads they do not
// hide) within 5% of each run's measured passes, and with the whole state on the GPU the step;
// the NVMe run as a bound (see bound_only). The pass shares are fitted to these runs, so 5% checks
// the model's form and catches a change to it (the goal for a prediction is 15%).
// The hosts' memory triads were not measured in those runs, so each run's memory roof is set
// to what reproduces its measured time outside the passes (the CPU's AdamW and norm): the CPU
// optimizer's model is checked on the CPU machines (docs/plan.md), not here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "plan_gpu_runs.h"
#include "zinf/zero3/plan.h"

namespace zinf::zero3 {
namespace {

struct GpuTimeRecord {
  const char* name;
  const char* model;   // a GPT preset, or an HF config.json under bench/gpu
  const char* config;  // under bench/gpu
  int seq;
  const char* gpu;     // the CUDA device name
  std::uint64_t room;
  double step_s, passes_s, outside_s;  // measured: s/step, the passes ("compute"), outside them
  const char* where;
  double read_gbps = 0, write_gbps = 0;  // aio_bench's best in the same call (NVMe runs)
  std::int64_t reuse_distance = 0;       // the run's stage3_max_reuse_distance where the config has changed since
  // The NVMe optimizer's time outside the passes is the drive's, not the triad's: the host's
  // memory roof is run 25's (the same H200 machine kind).
  double host_gbps = 0;
  // NVMe runs: the engine's NVMe shares (kSyncWriteShare and the rest) come from the 2-core CPU
  // machines' virtual disks; the GPU machine's 16 cores came closer to aio_bench's rates (io_eff
  // 0.89), so the prediction is high there: checked as at or above the run, within 1.5x.
  bool bound_only = false;
  // How near the passes must be: 5% for the runs the shares were fitted to; a run the model was
  // not fitted to is held to the 15%.
  double tolerance = 0.05;
};

// Today's code: bf16 values gathered and kept on the GPU across micro-batches (runs 30-31, H200;
// the (a) 1.3B also on an H100, run 27), and the NVMe run.
const GpuTimeRecord kRuns[] = {
    {"a_gpt2_gpu", "gpt2", "a_gpt2_gpu.json", 1024, "NVIDIA H200", kH200Free, 0.0248, 0.0235, 0.0, "run 31, H200"},
    {"a_1p3b_gpu", "1.3b", "a_1p3b_gpu.json", 2048, "NVIDIA H100 80GB HBM3", kH100Free, 0.196, 0.178, 0.0,
     "run 27, H100"},
    {"a_1p3b_gpu", "1.3b", "a_1p3b_gpu.json", 2048, "NVIDIA H200", kH200Free, 0.1863, 0.1717, 0.0, "run 30, H200"},
    {"b_1p3b_resident", "1.3b", "b_1p3b_offload_cpu_resident.json", 2048, "NVIDIA H200", kH200Free, 6.089, 5.661,
     0.427, "run 31, H200"},
    {"b_2p7b_resident", "2.7b", "b_2p7b_offload_cpu_resident.json", 2048, "NVIDIA H200", kH200Free, 11.638, 10.841,
     0.796, "run 31, H200"},
    {"b_llama3b_resident", "llama32_3b_config.json", "b_llama3b_offload_cpu_resident.json", 2048, "NVIDIA H200",
     kH200Free, 13.440, 12.561, 0.879, "run 31, H200"},
    {"b_llama7b_resident", "llama2_7b_config.json", "b_llama7b_offload_cpu_resident.json", 2048, "NVIDIA H200",
     kH200Free, 26.205, 23.735, 2.469, "run 30, H200"},
    {"a_llama7b_plan", "llama2_7b_config.json", "a_llama7b_plan.json", 2048, "NVIDIA H200", kH200Free, 27.998, 27.812,
     0.0, "run 32, H200"},
    {"c_nvme_offload", "gpt2-xl", "c_nvme_offload.json", 1024, "NVIDIA H200", kH200Free, 25.287, 6.961, 18.327,
     "run 29, H200", 2.46, 3.52, 0, 28.3, true},
    // The values gathered again every micro-batch (live 1e9 of 1.3e9): not fitted; the gather
    // count is the planner's (16 models' worth, the run moved 11.4).
    {"b_1p3b_ga8", "1.3b", "b_1p3b_offload_cpu_ga8.json", 2048, "NVIDIA H200", kH200Free, 2.417, 1.959, 0.458,
     "run 33, H200", 0, 0, 0, 0, false, 0.15},
};
constexpr std::size_t kNvmeRun = 8;
// Llama 2 7B's shape with a reuse distance (1e10) under twice the model: every micro-batch
// gathered its values again (run 28, H200, before the bf16 gathers).
const GpuTimeRecord kShortReuseRun = {"b_llama7b_resident", "llama2_7b_config.json",
                                      "b_llama7b_offload_cpu_resident.json", 2048, "NVIDIA H200", kH200Free, 29.510,
                                      27.372, 2.138, "run 28, H200", 0, 0, 10000000000};

struct Predicted {
  Candidate c;
  double passes() const { return c.compute_s + c.gather_s + c.param_io_exposed_s + c.grad_io_s; }
};

// calibrated: with the run's own breakdown as --calibrate gives it (zero3::calibrate).
Result<Predicted> predict(const GpuTimeRecord& run, double memory_gbps, bool calibrated = false) {
  ZINF_ASSIGN_OR_RETURN(config::DsConfig ds, load_config(run.config));
  if (run.reuse_distance > 0) ds.zero.max_reuse_distance = run.reuse_distance;
  const bool recompute = ds.activation_checkpointing.present;
  PlanRequest r;
  const std::string model = run.model;
  r.make_model = [model](bool ckpt) -> Result<std::unique_ptr<model::Model>> {
    Made m = make_run_model(model, ckpt, 1);
    if (m.model == nullptr) return Status::internal("no model " + model);
    return std::move(m.model);
  };
  r.seq = run.seq;
  r.gpu_workspace = [model, recompute](const model::Model&, int rows) -> Result<std::uint64_t> {
    return make_run_model(model, recompute, rows).workspace;
  };
  Machine machine;
  machine.matmul_gflops = Roof{1000, "unused on a GPU", false};
  machine.memory_gbps = Roof{memory_gbps, "set from the run's time outside the passes", false};
  machine.nvme_read_gbps = Roof{run.read_gbps > 0 ? run.read_gbps : 1.0, "aio_bench in the run's call", true};
  machine.nvme_write_gbps = Roof{run.write_gbps > 0 ? run.write_gbps : 1.0, "aio_bench in the run's call", true};
  machine.host_available = std::uint64_t{125} << 30;
  ZINF_ASSIGN_OR_RETURN(machine.gpu, plan_gpu(run.gpu, run.room, "the run's", std::nullopt, std::nullopt, std::nullopt));
  if (calibrated) {
    ZINF_ASSIGN_OR_RETURN(r.calibration, calibrate(r, machine, ds, run.passes_s, run.outside_s, run.where));
  }
  ZINF_ASSIGN_OR_RETURN(Candidate c, predict_config(r, machine, ds));
  return Predicted{std::move(c)};
}

TEST(PlanGpuTime, GpuRunsPassesArePredictedWithinFivePercent) {
  for (const GpuTimeRecord& run : kRuns) {
    SCOPED_TRACE(std::string(run.name) + ", " + run.where);
    // The host's memory roof that gives the run's time outside the passes (the CPU optimizer's
    // time is inverse in it); with the state on the GPU nothing runs on the CPU.
    double gbps = run.host_gbps > 0 ? run.host_gbps : 10.0;
    if (run.outside_s > 0 && run.host_gbps == 0) {
      auto at_one = predict(run, 1.0);
      ASSERT_TRUE(at_one.is_ok()) << at_one.status().to_string();
      gbps = at_one->c.optimizer_s / run.outside_s;
    }
    auto p = predict(run, gbps);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    const Candidate& c = p->c;
    std::printf("%-20s %-13s passes predicted %7.3f s, measured %7.3f s: %.3f; step %7.3f s against %7.3f s: %.3f "
                "(compute %.3f, copies exposed %.3f of %.3f, NVMe params %.3f, NVMe grads %.3f, optimizer %.3f + "
                "NVMe %.3f; host triad set to %.1f GB/s)\n",
                run.name, run.where, p->passes(), run.passes_s, p->passes() / run.passes_s, c.step_s, run.step_s,
                c.step_s / run.step_s, c.compute_s, c.gather_s, c.pcie_s, c.param_io_exposed_s, c.grad_io_s,
                c.optimizer_s, c.optimizer_exposed_s, gbps);
    EXPECT_TRUE(c.on_gpu);
    if (run.bound_only) {
      for (const double ratio : {p->passes() / run.passes_s, c.step_s / run.step_s}) {
        EXPECT_GE(ratio, 1.0);
        EXPECT_LE(ratio, 1.5);
      }
      continue;
    }
    EXPECT_NEAR(p->passes() / run.passes_s, 1.0, run.tolerance);
    if (run.outside_s == 0) {
      EXPECT_NEAR(c.step_s / run.step_s, 1.0, run.tolerance);
    }
  }
}

// --calibrate on a GPU: the NVMe run's own step breakdown scales its passes and optimizer step,
// after which the prediction is the run's step.
TEST(PlanGpuTime, TheNvmeRunCalibratedFromItsBreakdownPredictsItsStep) {
  const GpuTimeRecord& run = kRuns[kNvmeRun];
  auto raw = predict(run, run.host_gbps);
  auto calibrated = predict(run, run.host_gbps, /*calibrated=*/true);
  ASSERT_TRUE(raw.is_ok() && calibrated.is_ok());
  EXPECT_GT(raw->c.step_s / run.step_s, 1.2);
  EXPECT_NEAR(calibrated->c.step_s / run.step_s, 1.0, 0.01);
  EXPECT_NEAR(calibrated->passes() / run.passes_s, 1.0, 0.01);
}

// The copies: values kept on the GPU across micro-batches go up once a step; with a reuse
// distance shorter than a pass's traffic (run 28's 1e10 at 7B) every micro-batch gathers again,
// which the planner counts, and the uploads add to the passes (run 33). The count is the whole
// model twice a micro-batch, a bound: run 28 moved 209 GB of fp32 a step, not 64 x 13.5 GB.
TEST(PlanGpuTime, AShortReuseDistanceGathersEveryMicroBatch) {
  const GpuTimeRecord& resident = kShortReuseRun;
  GpuTimeRecord kept = resident;
  kept.reuse_distance = 100000000000;
  auto short_reuse = predict(resident, 20.0);
  auto long_reuse = predict(kept, 20.0);
  ASSERT_TRUE(short_reuse.is_ok() && long_reuse.is_ok());
  const double P = 6.74e9;
  EXPECT_NEAR(long_reuse->c.pcie_s * 55e9, 2 * P + 4 * P, 0.05 * P);          // up once, sums down once
  EXPECT_NEAR(short_reuse->c.pcie_s * 55e9, 64 * 2 * P + 4 * P, 0.5 * P);     // 2 x 32 gathers
  EXPECT_NEAR(short_reuse->c.gather_s * 55e9, 64 * 2 * P, 0.5 * P);  // the uploads, not hidden
  EXPECT_NEAR(long_reuse->c.gather_s * 55e9, 2 * P, 0.05 * P);
  EXPECT_EQ(long_reuse->c.compute_s, short_reuse->c.compute_s);
}

}  // namespace
}  // namespace zinf::zero3
