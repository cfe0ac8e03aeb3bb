// The planner's memory prediction: one rank's peak host, pinned and disk bytes, from the
// engine's own layout and the swap layer's own pool sizing.
#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "zero3/device_gather_target.h"
#include "zero3/grad_store.h"
#include "zero3/host_budget.h"
#include "zero3/model_partition.h"
#include "zinf/optim/optimizer.h"
#include "zinf/swap/pinned_pool.h"
#include "zinf/swap/types.h"
#include "zinf/zero3/plan.h"

namespace zinf::zero3 {
namespace {

constexpr std::uint64_t kPage = 4096;
constexpr double kMarginShare = 0.05;
// On a GPU the host holds few, large arrays allocated once (no activations, gathered values or
// buckets): the named terms came to 1.00-1.05 of the peak RSS of five runs (runs 30-31, H200;
// docs/plan.md, "On a GPU"), so the margin is a small one.
constexpr double kGpuMarginShare = 0.01;
// A GPU run's peak RSS grew with the device memory it held: 883.9 MiB at 36.6 GiB (1.3B with the
// whole state on the GPU, run 30), 993.1 MiB at 119.6 GiB (7B's shape, run 32), the same
// program, data and libraries. Calibrated, not attributed (the CUDA driver's host-side records
// of device memory are the likely owner): 1.3 MiB of host memory a GiB of predicted GPU bytes.
constexpr double kCudaHostPerDeviceByte = 1.3 / 1024.0;
constexpr std::uint64_t kNvmeParamsUnattributed = std::uint64_t{48} << 20;
std::uint64_t page_up(std::uint64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

swap::DType run_dtype(const config::DsConfig& ds) {
  if (ds.bf16.enabled) return swap::DType::kBF16;
  if (ds.fp16.enabled) return swap::DType::kF16;
  return swap::DType::kF32;
}

Result<std::size_t> optimizer_states(const config::DsConfig& ds) {
  // The state count depends on the type only (Adam: 2, Lion: 1, ...); the engine parses the
  // same type (engine.cpp), AdamW when there is no optimizer block.
  ZINF_ASSIGN_OR_RETURN(optim::OptimizerConfig oc,
                        optim::OptimizerConfig::parse(ds.optimizer ? ds.optimizer->type : "AdamW", {}));
  return optim::Optimizer(oc).state_count();
}

// The pool's bytes; an overflowing product is the config's error, while a pool larger than the
// memory available now is for the caller to weigh (the planner names the shortfall).
Result<std::size_t> pool_bytes(const swap::PoolBudget& budget) {
  Result<std::size_t> checked = budget.checked_bytes();
  if (!checked.is_ok() && checked.status().code() != ErrorCode::kResourceExhausted) return checked.status();
  return budget.bytes();
}

// What a GPU run's caching allocator reserves at its peak (the run's "peak device memory"): the
// model's workspace, the training state or the gathered values, the gradients held or in flight,
// and a share of those for what they leave out: the allocator's rounding (a block serves requests
// down to 4/5 of its size) and the freed blocks it keeps reserved, some fenced by copies still in
// flight. The shares are calibrated, each the smallest round share that covers its runs
// (docs/plan.md, "On a GPU"): with fp32 gathers, whose per-module bf16 casts churn the cache, the
// named terms came to 0.87-0.94 of the peaks of five runs (1.3B to 7B, H100 and H200); with the
// bf16 values read in place, 0.96-0.98 of four (1.3B to 7B, H200), and with the whole state on the
// GPU above the peak (1.03-1.07, GPT-2 and 1.3B).
constexpr double kGpuAllocatorShareFp32Gathers = 0.17;
constexpr double kGpuAllocatorShare = 0.06;

void add_gpu_terms(MemoryPrediction& m, const config::DsConfig& ds, const GatheredSizes& g, std::uint64_t shard,
                   std::size_t states, swap::DType dtype, bool state_on_gpu, const GpuRun& run) {
  auto add = [&m](std::string name, std::uint64_t bytes) { m.gpu_terms.push_back({std::move(name), bytes, false}); };
  const config::ZeroSection& z = ds.zero;
  const int world = static_cast<int>(ds.world_size);
  add("the model's activations and scratch (its workspace)", run.workspace_bytes);
  // The coordinator's gradient blocks (fp32, gathered size) from a module's backward until their
  // download or device addition: the module computing and the downloads in flight
  // (DeviceGatherTarget::max_downloads_in_flight), of the largest group at most.
  const std::uint64_t in_flight = DeviceGatherOptions{}.staging_buffers;
  // engine.cpp: a bf16 run gathers bf16 values, which the model reads in place; otherwise fp32,
  // which the GPU model casts to bf16 per module while it holds them (the module computing and
  // the one whose gather runs ahead).
  const bool casts = !state_on_gpu && !(dtype == swap::DType::kBF16 && !run.fp32_gathers);
  if (state_on_gpu) {
    // device_state.cpp: master weights and optimizer states (fp32), the gradient partitions
    // (fp32), and the parameters' 16-bit copy, which the GPU model reads in place: nothing is
    // gathered or cast.
    add(fmt::format("training state (fp32 master, {} states and gradients; {} parameters)", states,
                    swap::dtype_name(dtype)),
        shard * (4 * (2 + states) + swap::dtype_size(dtype)));
    add(fmt::format("gradient blocks in flight ({} x the largest group, fp32)", in_flight), in_flight * 4 * g.largest);
  } else {
    const std::uint64_t live =
        std::min(g.non_persistent, std::max(static_cast<std::uint64_t>(z.max_live_parameters), 2 * g.largest));
    const std::uint64_t vsize = casts ? 4 : 2;
    const char* vname = casts ? "fp32" : "bf16";
    add(fmt::format("gathered parameters, persistent ({})", vname), vsize * g.persistent);
    add(fmt::format("gathered parameters, live ({}, stage3_max_live_parameters)", vname), vsize * live);
    if (casts) add("16-bit casts of the modules in use (2 modules)", 2 * 2 * g.module_need);
    // engine.cpp (kAutoHold): with gradient accumulation and one rank, the sums across
    // micro-batches stay on the GPU, up to 40% of the memory free at the start.
    std::uint64_t held = 0;
    if (ds.batch.gradient_accumulation_steps > 1 && world == 1) {
      held = 4 * g.total;
      if (run.free_bytes != 0) held = std::min(held, run.free_bytes / 10 * 4);
      add("gradient sums held across micro-batches (fp32; up to 40% of the free memory)", held);
    }
    if (held < 4 * g.total) {
      add(fmt::format("gradient blocks in flight ({} x the largest group, fp32)", in_flight), in_flight * 4 * g.largest);
    }
  }
  std::uint64_t sum = 0;
  for (const MemoryTerm& t : m.gpu_terms) sum += t.bytes;
  const double share = casts ? kGpuAllocatorShareFp32Gathers : kGpuAllocatorShare;
  add("allocator rounding and cached blocks (calibrated share)", static_cast<std::uint64_t>(static_cast<double>(sum) * share));
  m.gpu = sum + m.gpu_terms.back().bytes;
}

}  // namespace

std::string largest_terms(std::vector<MemoryTerm> terms, std::size_t count) {
  std::sort(terms.begin(), terms.end(), [](const MemoryTerm& a, const MemoryTerm& b) { return a.bytes > b.bytes; });
  std::string s;
  for (std::size_t i = 0; i < std::min(count, terms.size()); ++i) {
    s += fmt::format("{}{:.1f} GiB {}", i == 0 ? "" : ", ", static_cast<double>(terms[i].bytes) / (1 << 30), terms[i].name);
  }
  return s;
}

GpuFit check_gpu_fit(const MemoryPrediction& m, const config::DsConfig& ds, std::uint64_t room, const std::string& gpu) {
  GpuFit fit;
  const double need = static_cast<double>(m.gpu);
  const double have = static_cast<double>(room);
  if (need <= have) return fit;
  fit.verdict = need / 1.15 <= have ? GpuFit::Verdict::kMayNotFit : GpuFit::Verdict::kDoesNotFit;
  constexpr double kGiB = 1 << 30;
  fit.message = fmt::format("{}: this run is predicted to need {:.1f} GiB of GPU memory (largest: {}), and {} has {:.1f} GiB free",
                            ds.source, need / kGiB, largest_terms(m.gpu_terms), gpu, have / kGiB);
  if (fit.verdict == GpuFit::Verdict::kMayNotFit) {
    fit.message += "; the prediction may be up to 15% high, so it may still fit";
    return fit;
  }
  const config::ZeroSection& z = ds.zero;
  std::string change;
  if (z.offload_param.device == config::OffloadDevice::kNone && z.offload_optimizer.device == config::OffloadDevice::kNone) {
    change += "offload the optimizer state and the parameters to the CPU (offload_optimizer and offload_param device cpu), ";
  } else {
    change += fmt::format("lower stage3_max_live_parameters ({}) or stage3_max_reuse_distance, ", z.max_live_parameters);
    if (ds.batch.gradient_accumulation_steps > 1) change += "hold fewer gradient sums on the GPU (--device-grad-sums SIZE or none), ";
  }
  change += "use a smaller micro-batch or activation checkpointing";
  fit.message += fmt::format(": at least {:.1f} GiB short. To fit: {}, or let `zinf plan` find a configuration; "
                             "--no-memory-check starts anyway",
                             (need / 1.15 - have) / kGiB, change);
  return fit;
}

std::uint64_t MemoryPrediction::host_bytes() const {
  return std::accumulate(host.begin(), host.end(), std::uint64_t{0},
                         [](std::uint64_t s, const MemoryTerm& t) { return s + t.bytes; });
}

std::uint64_t MemoryPrediction::pinned_bytes() const {
  std::uint64_t s = 0;
  for (const MemoryTerm& t : host) s += t.pinned ? t.bytes : 0;
  return s;
}

Result<MemoryPrediction> predict_memory(const model::Model& model, const config::DsConfig& ds, int B, int T,
                                        ComputeOn on, const GpuRun& gpu_run) {
  const int world = static_cast<int>(ds.world_size);
  ZINF_ASSIGN_OR_RETURN(PartitionPlan plan, model_partition_plan(model.params(), model.modules().size(), world));
  const swap::PartitionLayout layout = swap::PartitionLayout::build(
      layout_partitions(model.params(), model.modules(), plan), static_cast<std::uint64_t>(ds.zero.sub_group_size));
  ZINF_ASSIGN_OR_RETURN(const std::size_t states, optimizer_states(ds));
  const swap::DType dtype = run_dtype(ds);
  const std::uint64_t dsize = swap::dtype_size(dtype);
  std::uint64_t shard = 0;  // padded elements of this rank's sub-groups
  for (const swap::SubGroup& sg : layout.subgroups) shard += sg.numel;
  const std::uint64_t largest_sg = std::max(layout.largest_subgroup(), swap::PartitionLayout::kAlign);

  MemoryPrediction m;
  m.shard_elements = shard;
  for (const swap::ParamPartition& p : layout.params) m.largest_partition = std::max(m.largest_partition, p.numel);
  auto add = [&m](std::string name, std::uint64_t bytes, bool pinned = false) {
    m.host.push_back({std::move(name), bytes, pinned});
  };
  const bool gpu = on == ComputeOn::kGpu;
  // On a GPU, after the GPU's terms: the host memory that grows with them (kCudaHostPerDeviceByte).
  auto add_cuda_records = [&] {
    add("CUDA's host records of the device memory (calibrated: 1.3 MiB a GiB)",
        static_cast<std::uint64_t>(static_cast<double>(m.gpu) * kCudaHostPerDeviceByte));
  };
  // Allocator slack and what the terms do not name (thread stacks, the aio rings, the data
  // loader's rows): a share of the rest, calibrated with the base (docs/plan.md, "Memory").
  auto add_margin = [&] {
    const double share = gpu ? kGpuMarginShare : kMarginShare;
    add("margin (allocator slack, small buffers)", static_cast<std::uint64_t>(static_cast<double>(m.host_bytes()) * share));
  };
  add(gpu ? "process base (program, libraries, corpus, CUDA runtime and context)"
          : "process base (program, libraries, corpus)",
      gpu ? kCudaProcessBaseBytes : kProcessBaseBytes);

  const config::ZeroSection& z = ds.zero;
  const GatheredSizes g = gathered_sizes(model, plan, z, world);
  if (gpu && world == 1 && z.offload_param.device == config::OffloadDevice::kNone &&
      z.offload_optimizer.device == config::OffloadDevice::kNone) {
    // tier_factory.cpp state_on_device: master weights, optimizer state, gradients and the
    // parameters all in GPU memory; nothing is staged through the host.
    add_gpu_terms(m, ds, g, shard, states, dtype, true, gpu_run);
    add_cuda_records();
    add_margin();
    return m;
  }
  const bool opt_nvme = z.offload_optimizer.device == config::OffloadDevice::kNvme;
  const bool param_nvme = z.offload_param.device == config::OffloadDevice::kNvme;
  if (opt_nvme) {
    // tier_factory.cpp: with the optimizer on NVMe the gradients go to the swapper's gradient
    // store, through one pinned buffer; on the disk, one fp32 array per sub-group.
    add("gradient store buffer (fp32; the gradients are on NVMe)", swapped_gradient_buffer_bytes(layout), true);
    add("the gradient store's small partitions (fp32, in memory)", swapped_gradient_held_bytes(layout), false);
    m.norm_read_elements = swapped_norm_read_elements(layout);
    for (const swap::SubGroup& sg : layout.subgroups) m.disk_optimizer += page_up(4 * sg.numel);
    // tier_factory.cpp leaves OptimizerSwapConfig::buffer_size 0: the swapper sizes each buffer
    // as the largest sub-group (OptimizerSwapper::plan_tiles).
    const swap::PoolBudget budget{"offload_optimizer", static_cast<std::size_t>(z.offload_optimizer.buffer_count),
                                  static_cast<std::size_t>(largest_sg), 4};
    ZINF_ASSIGN_OR_RETURN(const std::size_t pool, pool_bytes(budget));
    add(fmt::format("optimizer pinned pool ({} x {} fp32)", budget.buffer_count, budget.buffer_size), pool, true);
    for (const swap::SubGroup& sg : layout.subgroups) m.disk_optimizer += 2 * (1 + states) * page_up(4 * sg.numel);
  } else {
    add("fp32 gradient partitions", 4 * shard);  // the engine's memory gradient store
    add(fmt::format("optimizer state in memory (master + {} states, fp32)", states), 4 * (1 + states) * shard);
  }
  if (param_nvme) {
    const swap::PoolBudget budget{"offload_param", static_cast<std::size_t>(z.offload_param.buffer_count),
                                  static_cast<std::size_t>(z.offload_param.buffer_size), dsize};
    ZINF_ASSIGN_OR_RETURN(const std::size_t pool, pool_bytes(budget));
    add(fmt::format("parameter pinned pool ({} x {} {})", budget.buffer_count, budget.buffer_size,
                    swap::dtype_name(dtype)),
        pool, true);
    const std::uint64_t in_cpu = std::min<std::uint64_t>(static_cast<std::uint64_t>(z.offload_param.max_in_cpu), shard);
    if (in_cpu > 0) add("parameters kept in CPU (max_in_cpu)", in_cpu * dsize);
    for (const swap::ParamPartition& p : layout.params) m.disk_params += page_up(p.numel * dsize);
    // Runs with the parameters on NVMe peaked above the named terms by a few tens of MiB, from
    // code not yet attributed, not growing with the model (docs/plan.md, "Memory"): counted,
    // not guessed away.
    add("NVMe parameters, unattributed (calibrated)", kNvmeParamsUnattributed);
    // A memory optimizer tier converts each sub-group's copy in a staging array first.
    if (!opt_nvme) add("16-bit copy staging (one sub-group)", 4 * largest_sg);
  } else if (!(dtype == swap::DType::kF32 && !opt_nvme)) {
    // An fp32 parameter tier over memory master weights aliases them (param_tiers.cpp).
    add(fmt::format("parameter partitions ({})", swap::dtype_name(dtype)), dsize * shard, true);
  }

  if (gpu) {
    // device_gather_target.cpp: pinned staging for parameter uploads and gradient downloads, each
    // buffer grown to the largest slice it carried; the gathered values, the gradients and the
    // activations are in GPU memory.
    const std::uint64_t per_rank = (g.largest + static_cast<std::uint64_t>(world) - 1) / static_cast<std::uint64_t>(world);
    const std::size_t buffers = DeviceGatherOptions{}.staging_buffers;
    add(fmt::format("pinned staging for the GPU's copies ({} x the largest slice, fp32)", buffers),
        buffers * page_up(4 * per_rank), true);
    add_gpu_terms(m, ds, g, shard, states, dtype, false, gpu_run);
    add_cuda_records();
    add_margin();
    return m;
  }

  // Gathered full values the coordinator may hold at once: the persistent groups plus the rest
  // under stage3_max_live_parameters, never less than two of the largest group.
  const std::uint64_t live = std::min(g.non_persistent, std::max(static_cast<std::uint64_t>(z.max_live_parameters), 2 * g.largest));
  add("gathered parameters, persistent (fp32)", 4 * g.persistent);
  add("gathered parameters, live (fp32, stage3_max_live_parameters)", 4 * live);
  add("gathered gradients and reduce buckets (fp32)",
      gradient_buffer_bytes(g, static_cast<std::uint64_t>(z.reduce_bucket_size), world));
  add(fmt::format("activations and scratch (B {}, T {})", B, T), model.activation_bytes(B, T));
  add_margin();

  // The engine's budget sizing (engine.cpp, fit_budget) for the same run.
  HostBudgetRequest request{model, ds, plan, layout, states, B, T, ds.zinf.host_memory_budget,
                            kProcessBeforeEngineBytes, false};
  m.least_budget = host_budget_least_bytes(request);
  if (ds.zinf.host_memory_budget == 0) return m;
  ZINF_ASSIGN_OR_RETURN(HostBudgetFit fit, fit_host_budget(request));
  m.host = std::move(fit.terms);
  m.budgeted = MemoryPrediction::Budgeted{fit.ds.zero, fit.optimizer_buffer_size, fit.weight_copy_bytes,
                                          model.weight_copy_bytes()};
  return m;
}

}  // namespace zinf::zero3
