// The planner's GPU bytes (predict_memory with ComputeOn::kGpu) against the peak device memory of
// real GPU runs (docs/gpu-runs/*, the caching allocator's peak reserved bytes that gpu-check
// prints), with the GPU models' own workspace sizes. Host only: runs on every CUDA build.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "plan_gpu_runs.h"
#include "zinf/zero3/plan.h"

namespace zinf::zero3 {
namespace {

struct GpuRunRecord {
  const char* name;
  const char* model;   // a GPT preset, or an HF config.json under bench/gpu
  const char* config;  // under bench/gpu
  int seq;
  bool recompute;
  std::uint64_t free_bytes;
  double peak_mib;  // measured
  const char* where;
  // Runs before the bf16 gathers gathered fp32 values and cast each module to bf16 on the GPU.
  bool fp32_gathers = false;
  // The live gathered values are predicted at the engine's bound (stage3_max_live_parameters),
  // which a run with the parameters on NVMe stays well under: checked as a bound only.
  bool bound_only = false;
};

// Each gpu-check step as it ran: today's code (runs 30-33, bf16 values read in place, the whole
// state on the GPU for (a)), and the runs before the bf16 gathers, predicted as they ran.
const GpuRunRecord kRuns[] = {
    {"a_gpt2_gpu", "gpt2", "a_gpt2_gpu.json", 1024, false, kH200Free, 6020.0, "run 31, H200"},
    {"a_1p3b_gpu", "1.3b", "a_1p3b_gpu.json", 2048, false, kH200Free, 37500.0, "run 30, H200"},
    {"b_1p3b_ga8", "1.3b", "b_1p3b_offload_cpu_ga8.json", 2048, false, kH200Free, 21121.2, "run 33, H200"},
    {"b_1p3b_resident", "1.3b", "b_1p3b_offload_cpu_resident.json", 2048, false, kH200Free, 22621.2, "run 31, H200"},
    {"b_2p7b_resident", "2.7b", "b_2p7b_offload_cpu_resident.json", 2048, false, kH200Free, 39067.9, "run 31, H200"},
    {"b_llama3b_resident", "llama32_3b_config.json", "b_llama3b_offload_cpu_resident.json", 2048, false, kH200Free,
     43411.0, "run 31, H200"},
    {"b_llama7b_resident", "llama2_7b_config.json", "b_llama7b_offload_cpu_resident.json", 2048, false, kH200Free,
     75209.5, "run 30, H200"},
    {"a_llama7b_plan", "llama2_7b_config.json", "a_llama7b_plan.json", 2048, true, kH200Free, 122474.0,
     "run 32, H200 (zinf plan's winner: the whole state on the GPU, checkpointing)"},
    {"b_1p3b_ga8", "1.3b", "b_1p3b_offload_cpu_ga8.json", 2048, false, kH100Free, 24937.9, "run 24, H100", true},
    {"b_1p3b_resident", "1.3b", "b_1p3b_offload_cpu_resident.json", 2048, false, kH200Free, 28039.9, "run 25, H200",
     true},
    {"b_2p7b_resident", "2.7b", "b_2p7b_offload_cpu_resident.json", 2048, false, kH200Free, 49303.2, "run 26, H200",
     true},
    {"b_llama3b_resident", "llama32_3b_config.json", "b_llama3b_offload_cpu_resident.json", 2048, false, kH100Free,
     56611.7, "run 27, H100", true},
    {"b_llama7b_resident", "llama2_7b_config.json", "b_llama7b_offload_cpu_resident.json", 2048, false, kH200Free,
     94100.5, "run 28, H200", true},
    {"c_nvme_offload", "gpt2-xl", "c_nvme_offload.json", 1024, true, kH200Free, 3305.2, "run 25, H200", true, true},
};

// Within 15% above the measured peak, never below (NVMe parameters: never below).
TEST(PlanGpuMemory, GpuRunsPeakDeviceMemoryIsPredictedWithinFifteenPercentAndNeverBelow) {
  for (const GpuRunRecord& run : kRuns) {
    SCOPED_TRACE(run.name);
    auto ds = load_config(run.config);
    ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
    const int B = static_cast<int>(ds->batch.train_micro_batch_size_per_gpu);
    const Made made = make_run_model(run.model, run.recompute, B * run.seq);
    ASSERT_NE(made.model, nullptr);
    auto mem = predict_memory(*made.model, ds.value(), B, run.seq, ComputeOn::kGpu,
                              GpuRun{made.workspace, run.free_bytes, run.fp32_gathers});
    ASSERT_TRUE(mem.is_ok()) << mem.status().to_string();
    const double predicted = static_cast<double>(mem->gpu) / kMiB;
    std::printf("%-20s predicted %9.1f MiB, measured %9.1f MiB (%s%s): %.3f\n", run.name, predicted, run.peak_mib,
                run.where, run.fp32_gathers ? ", fp32 gathers" : "", predicted / run.peak_mib);
    for (const MemoryTerm& t : mem->gpu_terms) std::printf("    %9.1f MiB  %s\n", static_cast<double>(t.bytes) / kMiB, t.name.c_str());
    EXPECT_GE(predicted, run.peak_mib);
    if (!run.bound_only) {
      EXPECT_LE(predicted, 1.15 * run.peak_mib);
    }
  }
}

// On the host (ComputeOn::kHost) nothing is on a GPU; a GPU run's terms add up to its total; a
// bf16 run gathers bf16 values now, half the bytes of the fp32 ones the runs above gathered.
TEST(PlanGpuMemory, TheGpuTermsAddUpAndTheHostHasNone) {
  const GpuRunRecord& run = kRuns[3];
  auto ds = load_config(run.config);
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  const Made made = make_run_model(run.model, run.recompute, 4 * run.seq);
  auto host = predict_memory(*made.model, ds.value(), 4, run.seq);
  ASSERT_TRUE(host.is_ok()) << host.status().to_string();
  EXPECT_EQ(host->gpu, 0u);
  EXPECT_TRUE(host->gpu_terms.empty());
  auto gpu = predict_memory(*made.model, ds.value(), 4, run.seq, ComputeOn::kGpu, GpuRun{made.workspace, run.free_bytes});
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
  std::uint64_t sum = 0;
  for (const MemoryTerm& t : gpu->gpu_terms) sum += t.bytes;
  EXPECT_EQ(sum, gpu->gpu);
  auto fp32 = predict_memory(*made.model, ds.value(), 4, run.seq, ComputeOn::kGpu,
                             GpuRun{made.workspace, run.free_bytes, /*fp32_gathers=*/true});
  ASSERT_TRUE(fp32.is_ok());
  auto live = [](const MemoryPrediction& m) {
    for (const MemoryTerm& t : m.gpu_terms) {
      if (t.name.find("gathered parameters, live") == 0) return t.bytes;
    }
    return std::uint64_t{0};
  };
  EXPECT_EQ(2 * live(gpu.value()), live(fp32.value()));
  EXPECT_LT(gpu->gpu, fp32->gpu);
  // A smaller GPU holds fewer gradient sums: at most 40% of its free memory.
  auto small = predict_memory(*made.model, ds.value(), 4, run.seq, ComputeOn::kGpu, GpuRun{made.workspace, 4ull << 30});
  ASSERT_TRUE(small.is_ok());
  EXPECT_LT(small->gpu, gpu->gpu);
}

}  // namespace
}  // namespace zinf::zero3
