// The planner: the fastest ds_config that fits a model on this machine, and how fast it will be.
//
// Memory comes from the engine's own sizing: a candidate's ds_config is parsed by the config
// layer exactly as `zinf train` parses it, the partition layout is built by the engine's own
// functions (model_partition_plan, PartitionLayout::build), the pinned pools are sized by
// swap::PoolBudget, and the activations by the model's activation_bytes(). Time comes from
// measured roofs (the machine's matrix rate, memory bandwidth and drive bandwidth; each one
// measured, read from a file or assumed, and labelled so) with the overlap the engine's
// pipelines allow. docs/plan.md describes the model and its measured accuracy.
//
// Threading: the functions are reentrant; the probes use every core while they run.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zinf/config/ds_config.h"
#include "zinf/model/matmul.h"
#include "zinf/model/model.h"
#include "zinf/status.h"

namespace zinf::zero3 {

// One rank's predicted peak memory, by kind, and the named terms it is made of.
struct MemoryTerm {
  std::string name;  // e.g. "optimizer state in memory (master + 2 states, fp32)"
  std::uint64_t bytes = 0;
  bool pinned = false;  // page-locked (pinned pools, pinned parameter partitions)
};

struct MemoryPrediction {
  std::vector<MemoryTerm> host;  // process memory (RSS), the base term included
  std::uint64_t disk_optimizer = 0;  // the optimizer's swap files (offload_optimizer.nvme_path)
  std::uint64_t disk_params = 0;     // the parameters' swap files (offload_param.nvme_path)
  // ComputeOn::kGpu: the GPU's peak bytes (its caching allocator's peak reserved, what a run's
  // "peak device memory" reports), as the named terms of gpu_terms; 0 on the host.
  std::uint64_t gpu = 0;
  std::vector<MemoryTerm> gpu_terms;
  std::uint64_t shard_elements = 0;  // this rank's sub-groups' elements, padded as the layout pads them
  std::uint64_t largest_partition = 0;  // elements of this rank's largest parameter partition
  // With the optimizer on NVMe: the gradient elements the norm reads back each step.
  std::uint64_t norm_read_elements = 0;
  // The smallest zinf.host_memory_budget the engine accepts for this run: every knob it sizes
  // (pinned pools, live parameters, gradient buckets, bf16 weight copies) at its least.
  std::uint64_t least_budget = 0;
  // Under zinf.host_memory_budget: the knobs as the engine lowers them to fit (host_budget.h),
  // and `host` holds the budget's terms at those values.
  struct Budgeted {
    config::ZeroSection zero;                // the lowered knobs
    std::uint64_t optimizer_buffer_size = 0;  // fp32 elements per optimizer pool buffer; 0: the largest sub-group
    std::uint64_t weight_copy_bytes = UINT64_MAX;  // the products' bf16 weight copies kept; UINT64_MAX: all
    std::uint64_t weight_copy_asked = 0;           // what the model keeps without a budget
  };
  std::optional<Budgeted> budgeted;
  std::uint64_t host_bytes() const;
  std::uint64_t pinned_bytes() const;
  std::uint64_t disk_bytes() const { return disk_optimizer + disk_params; }
};

// The process memory of `zinf train` before any model state: the program, its libraries, the
// math libraries' per-thread buffers and the built-in corpus. Calibrated on a tiny model
// (docs/plan.md, "Memory"); a term of every prediction.
inline constexpr std::uint64_t kProcessBaseBytes = std::uint64_t{176} << 20;
// The process before the engine as the engine's host-memory budget measures it (its RSS when
// the engine is made: program, libraries, the built-in corpus; 167.5 MiB with --config and
// 183.3 MiB with --plan, whose probes leave buffers behind, at 124M and 1.2B parameters alike):
// candidates under a budget are sized with it (docs/plan.md, "Short of memory").
inline constexpr std::uint64_t kProcessBeforeEngineBytes = std::uint64_t{184} << 20;

// The process of `zinf train --device cuda` before any model state: kProcessBaseBytes plus the
// CUDA runtime, cuBLAS and the device context (runs 27-28: 878.9 and 883.5 MiB peak RSS at
// 1.3B with the whole state on the GPU, where nothing else is on the host).
inline constexpr std::uint64_t kCudaProcessBaseBytes = std::uint64_t{896} << 20;

// Where the model computes. kGpu: on a GPU whose memory the engine gathers into (zinf train
// --device cuda, --gpu-gather device): no activations, gathered values or gradient buckets on the
// host, but pinned staging for the copies; with offload_param and offload_optimizer none (one
// rank) the whole state is on the GPU. The GPU's bytes are MemoryPrediction::gpu.
enum class ComputeOn { kHost, kGpu };

// What predict_memory needs of a GPU run that only the GPU build knows.
struct GpuRun {
  // The GPU model's activations and scratch at B x T (gpu::GptGpu::workspace_bytes,
  // gpu::LlamaGpu::workspace_bytes).
  std::uint64_t workspace_bytes = 0;
  // Device memory free when the engine starts: gradient sums held across micro-batches take up
  // to 40% of it (EngineDevice::kAutoHold). 0: unknown, as if every sum fits.
  std::uint64_t free_bytes = 0;
  // Whether gathered values are fp32 even in a bf16 run, as the engine gathered them before it
  // gathered in the compute dtype (runs up to 29: the calibration runs of docs/plan.md).
  bool fp32_gathers = false;
};

// Peak host, pinned and disk bytes of one rank training `model` (which describes itself only:
// no parameter is allocated) with the resolved `ds` at micro-batch B and window T on
// ds.world_size ranks. With ds.zinf.host_memory_budget the knobs are sized as the engine sizes
// them (`budgeted`), assuming the process holds kProcessBeforeEngineBytes before the engine
// (kHost only: on a GPU the budget's terms are not modelled). Errors: the engine's own (a
// layout it refuses, a pool that overflows, a budget below least_budget).
// kGpu also predicts the GPU's bytes from `gpu_run` (ignored on the host).
Result<MemoryPrediction> predict_memory(const model::Model& model, const config::DsConfig& ds, int B, int T,
                                        ComputeOn on = ComputeOn::kHost, const GpuRun& gpu_run = {});

// "31.0 GiB training state, 4.5 GiB ..." : the `count` largest terms, largest first (the memory
// checks' messages).
std::string largest_terms(std::vector<MemoryTerm> terms, std::size_t count = 3);

// Whether a GPU run's predicted bytes (MemoryPrediction::gpu) fit `room` bytes of its GPU's memory
// (Device::memory_room when the engine starts). The prediction came to 1.02-1.10 of five real
// runs' peaks (docs/plan.md, "On a GPU"): over the room by up to 15% the run may still fit
// (kMayNotFit); by more it will not (kDoesNotFit: zinf train refuses before any work).
struct GpuFit {
  enum class Verdict { kFits, kMayNotFit, kDoesNotFit };
  Verdict verdict = Verdict::kFits;
  std::string message;  // unless kFits: the need and the room, the largest terms, what to change
};
GpuFit check_gpu_fit(const MemoryPrediction& m, const config::DsConfig& ds, std::uint64_t room, const std::string& gpu);

// A roof and where its figure came from.
struct Roof {
  double value = 0;    // GFLOP/s or GB/s
  std::string source;  // "measured: ...", "from <file>", "given (--flag)", "assumed: ..."
  bool measured = false;
};

// The GPU a plan computes on (zinf train --device cuda, the engine gathering into its memory).
struct PlanGpu {
  std::string name;                 // "NVIDIA H100 80GB HBM3"
  std::uint64_t room_bytes = 0;     // device memory a run may take (free when it starts)
  std::string room_source;          // "free now (cudaMemGetInfo)", "given (--gpu-memory)"
  Roof tflops;     // dense bf16 tensor-core peak, TFLOP/s (what the model's products run on)
  Roof hbm_gbps;   // device memory bandwidth (the optimizer step when the state is on the GPU)
  Roof pcie_gbps;  // one direction between pinned host memory and the device
};

// The GPU facts for `name` with `room` bytes: the peak and memory bandwidth from zinf's table of
// data-center and workstation GPUs (labelled "from the datasheet"), or the given values, and the
// copy rate given or assumed (PCIe gen 5 for Hopper and later, gen 4 before). A GPU the table
// does not know, or an empty name, needs its peak given: kInvalidArgument naming --gpu-tflops.
Result<PlanGpu> plan_gpu(const std::string& name, std::uint64_t room, const std::string& room_source,
                         std::optional<double> tflops, std::optional<double> hbm_gbps,
                         std::optional<double> pcie_gbps);

// The machine a plan is made for.
struct Machine {
  Roof matmul_gflops;    // the model's matrix products at its own precision (at 1024 rows)
  // The same product at several row counts (rows, GFLOP/s), ascending: a micro-batch's rows
  // B x T take the rate interpolated here. Empty: matmul_gflops at every shape.
  std::vector<std::pair<int, double>> matmul_by_rows;
  Roof memory_gbps;      // a STREAM triad's counted GB/s
  Roof nvme_read_gbps;   // the drive, with the aio block the plan writes
  Roof nvme_write_gbps;
  std::uint64_t host_available = 0;  // bytes a plan may use (MemAvailable, or --host-memory)
  std::string host_source;
  int cores = 1;
  int gpus = 0;            // usable CUDA devices (the caller probes them)
  std::string gpu_detail;  // device 0 in a few words, or why there is none
  // Set: the plan computes on this GPU (every candidate is a GPU run, ComputeOn::kGpu); unset:
  // on the CPU.
  std::optional<PlanGpu> gpu;
  struct Drive {
    std::string path;
    std::uint64_t free_bytes = 0;
  };
  std::vector<Drive> drives;  // --nvme-path folders and their free space
  // The aio block of the plan's config (from an aio_bench summary when given; else zinf's defaults).
  config::AioSection aio;
  std::string aio_source;
};

// The arithmetic a run in `precision` computes with (as the engine sets it on the model).
model::ComputePrecision compute_precision(config::Precision precision);

// Reads MemAvailable, the cores, and each folder's free space (statvfs). Folders must exist.
Result<Machine> describe_machine(const std::vector<std::string>& nvme_paths);
// Probes (each a fraction of a second; every core busy): the model's matrix product kind at a
// layer of width `hidden` (capped) at 128 and 1024 rows (sets matmul_gflops and
// matmul_by_rows), and a triad.
void probe_matmul(Machine& machine, config::Precision precision, int hidden);
Roof probe_memory_gbps();
// Reads "best.read_gbps", "best.write_gbps" and the "aio" block of an aio_bench summary.json.
Status read_aio_summary(const std::string& path, Machine& machine);
// Writes then reads `bytes` in the first drive with O_DIRECT through the aio handle (the
// machine's aio block) in 64 MiB requests, and sets the drive roofs from the median request's
// rate ("measured: quick probe").
Status probe_drive(Machine& machine, std::uint64_t bytes);

// Factors from a measured run (calibrate()): the passes' predicted time (compute, gathers,
// exposed parameter reads) and the optimizer step's are multiplied by them.
struct Calibration {
  double passes = 1.0, optimizer = 1.0;
  std::string source;  // empty: not calibrated
};

// What to plan: the run shape, under zinf train's names.
struct PlanRequest {
  // The model with (true) or without (false) activation checkpointing; description only.
  std::function<Result<std::unique_ptr<model::Model>>(bool recompute)> make_model;
  int seq = 0;                              // the window T
  std::optional<std::int64_t> micro_batch;  // fixed by --micro-batch, else searched
  std::optional<std::int64_t> grad_accum;
  std::optional<std::int64_t> train_batch;  // samples per optimizer step, all ranks
  config::Precision precision = config::Precision::kBf16;
  int world_size = 1;
  double host_fraction = 0.9;  // of Machine::host_available a plan may take (the rest: headroom)
  // Top-level blocks written as they are (JSON object text: "optimizer", "scheduler",
  // "gradient_clipping", ...); empty: none (the engine's default AdamW, no clipping).
  std::string optimizer_json;
  Calibration calibration;
  // A GPU plan (Machine::gpu set): the GPU model's device workspace for the CPU model `m`
  // describes at `rows` = micro-batch x window (gpu::GptGpu / gpu::LlamaGpu::workspace_bytes,
  // which only the GPU build has); an error for a model without a GPU implementation.
  std::function<Result<std::uint64_t>(const model::Model& m, int rows)> gpu_workspace;
};

// One configuration tried.
struct Candidate {
  config::OffloadDevice param_device = config::OffloadDevice::kCpu;
  config::OffloadDevice optimizer_device = config::OffloadDevice::kCpu;
  std::int64_t micro_batch = 1, grad_accum = 1;
  bool activation_checkpointing = false;
  std::int64_t sub_group_size = 0;
  std::int64_t max_live_parameters = 0, prefetch_bucket_size = 0, reduce_bucket_size = 0;
  std::int64_t param_buffer_count = 0, param_buffer_size = 0, optimizer_buffer_count = 0;
  // stage3_max_reuse_distance written (0: not written, DeepSpeed's default). GPU candidates that
  // keep the values on the device across micro-batches need it past a pass's traffic.
  std::int64_t max_reuse_distance = 0;
  bool on_gpu = false;  // computes on Machine::gpu (its memory is memory.gpu)
  // zinf.host_memory_budget (0: none): the engine lowers the knobs above to fit it, as
  // memory.budgeted says, and keeps bf16 copies of only some of the products' weights.
  std::uint64_t host_memory_budget = 0;

  std::string ds_config;  // the JSON written and parsed (the nvme_path of the first drive)
  MemoryPrediction memory;
  // Time per optimizer step and its terms (seconds).
  // grad_io_s: the NVMe gradient store's reads and writes during the passes (optimizer on NVMe).
  // On a GPU: compute_s is the GPU's kernels, gather_s the host <-> GPU copies the kernels do not
  // hide (pcie_s: all of them), optimizer_s the AdamW on the CPU or, with the state on the GPU,
  // on the GPU.
  double pcie_s = 0;
  double gathers = 0;  // models' worth of values gathered a step (1: kept across micro-batches)
  double compute_s = 0, gather_s = 0, param_io_s = 0, param_io_exposed_s = 0, grad_io_s = 0, optimizer_s = 0,
         optimizer_io_s = 0, optimizer_exposed_s = 0, step_s = 0;
  double tokens_per_s = 0;
  // NVMe bytes per step the time model moves through the optimizer tier and the gradient store
  // (what Engine::bytes_moved counts; the parameter tier's transfers are not in it).
  double nvme_bytes = 0;
  std::string bottleneck;  // "compute", "memory bandwidth", "NVMe reads", ...
  bool fits = false;
  std::string why_not;     // empty when it fits
  std::string label() const;  // "params cpu, optimizer nvme, micro 4 x 2, sub_group 1e8, ..."
};

struct Plan {
  std::vector<Candidate> fitting;  // best (smallest step_s) first
  std::vector<Candidate> dropped;  // with why_not
  std::string why_winner;          // empty when nothing fits
  std::string shortfall;           // when nothing fits: what is short, by how much, the smallest change
  std::vector<std::string> assumptions;  // the terms that were assumed, not measured
  std::string calibration;               // the request's Calibration::source (empty: none)
  std::int64_t tokens_per_step = 0;
};

// Enumerates offload devices and knobs, predicts each candidate, drops what does not fit
// (naming the resource and the shortfall), and ranks the rest by predicted step time.
Result<Plan> make_plan(const PlanRequest& request, const Machine& machine);

// 38793984 -> "38.8M", 1000000000 -> "1G": element counts in tables and labels.
std::string count_name(std::int64_t elements);

// Calibration from zinf's own step breakdown: `ran` is the resolved config of a run of this
// request's model and shape, passes_s and optimizer_s the medians of its --json-log's
// forward_s + backward_s and optimizer_s (steps after the first). The factors are measured over
// predicted for that config; `source` names where they came from.
Result<Calibration> calibrate(const PlanRequest& request, const Machine& machine, const config::DsConfig& ran,
                              double passes_s, double optimizer_s, const std::string& source);

// A given config (a hand-written one, or the one a run used) as the planner predicts it: its
// knobs, memory and time on `machine` (on its GPU when Machine::gpu is set), and whether it
// fits. ds_config stays empty.
Result<Candidate> predict_config(const PlanRequest& request, const Machine& machine, const config::DsConfig& ds);

// The winner's ds_config as `zinf train --config` and DeepSpeed read it.
std::string plan_ds_config(const Candidate& c, const PlanRequest& request, const Machine& machine);

}  // namespace zinf::zero3
