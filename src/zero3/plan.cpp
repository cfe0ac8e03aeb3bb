// The planner's search: candidates over offload devices and knobs, each one's ds_config parsed
// as `zinf train` parses it, its memory from predict_memory and its time from the roofs.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "zinf/zero3/plan.h"

namespace zinf::zero3 {
namespace {

using config::OffloadDevice;
using nlohmann::ordered_json;

// Assumed constants of the time model (docs/plan.md, "Time", gives the runs they come from).
// Non-matmul work (norms, softmax, GELU, the loss) moves each activation byte this many times
// through memory per micro-step.
constexpr double kActivationPasses = 6.0;
// A memory-bound AVX2 Adam step runs at this multiple of the triad's counted GB/s (its arrays
// are read-modify-write; docs/measuring.md) over 28 bytes per element, plus the 16-bit copy.
constexpr double kAdamTriadRatio = 1.3;
constexpr double kAdamBytes = 28.0;
// Coordinator traffic per micro-step besides the gathers: the model's gradient writes, the
// reduce into the fp32 partitions (read, read-modify-write): bytes per parameter.
constexpr double kGradBytes = 16.0;
// Adam's fp32 arrays per element besides the gradient: the master weights and two states.
constexpr double kOptimizerArrays = 3.0;
// The engine's NVMe transfers are assumed to run at these shares of the drive roofs, whatever
// the tile size (docs/plan.md, "Time", has the runs they come from): the reads of one request
// at a time (the parameters' in the passes, the gradient store's, the norm's read-back), the
// writes of one at a time (the gradient store's, one partition at a time: a few blocks in
// flight), and the optimizer step's pipelined tiles, whose reads and writes share the drive.
constexpr double kSyncReadShare = 0.65;
constexpr double kSyncWriteShare = 0.3;
constexpr double kTileDriveShare = 0.7;
// On a GPU (docs/plan.md, "Time on a GPU", has the runs). The GPU models' passes reach these
// shares of the dense bf16 peak at 8192 tokens a micro-batch, in the 6 N + 12 L h T flop count,
// by the hidden width h (piecewise linear in log h, flat above the widest): the runs with bf16
// values gathered and kept on the GPU (runs 30-31, H200) at 0.31 for GPT-2's 768, 0.43-0.44 at
// 2048-2560, 0.45 at 3072 and 0.49 at 4096. Wider models are assumed at 4096's share.
constexpr std::pair<double, double> kGpuPassShare[] = {{768.0, 0.31}, {2048.0, 0.43}, {3072.0, 0.45}, {4096.0, 0.49}};
// Activation checkpointing on a GPU: the passes took 1.17x as long with it (Llama 2 7B's shape,
// H200, 4 x 2048 tokens a micro-batch: 27.81 s a step in run 32 against 23.74 s in run 30), not
// the 4/3 of the flop count (why was not profiled). One run; other widths and GPUs are assumed
// alike.
constexpr double kGpuRecompute = 1.17;
// Assumed, not measured: below 8192 tokens a micro-batch the share falls as (tokens / 8192)^0.25.
constexpr double kGpuFullTokens = 8192.0;
constexpr double kGpuTokensExponent = 0.25;
// The norm and AdamW over a state on the GPU: bytes per parameter at the memory bandwidth (the
// step outside the passes of runs 27-28 at 1.3B: 19 ms on an H100, 15 ms on an H200).
constexpr double kGpuAdamBytes = 50.0;

std::string gib(std::uint64_t b) {
  if (b < (std::uint64_t{10} << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1u << 20));
  if (b < (std::uint64_t{1} << 30)) return fmt::format("{:.0f} MiB", static_cast<double>(b) / (1u << 20));
  return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1u << 30));
}

}  // namespace

std::string count_name(std::int64_t v) {
  const double d = static_cast<double>(v);
  if (d >= 1e9) return fmt::format("{:.3g}G", d / 1e9);
  if (d >= 1e6) return fmt::format("{:.3g}M", d / 1e6);
  if (d >= 1e4) return fmt::format("{:.3g}k", d / 1e3);
  return std::to_string(v);
}

namespace {

// What the time model needs of a model, counted once.
struct ModelShape {
  std::uint64_t params = 0;         // all elements
  std::uint64_t matmul_params = 0;  // weights of matrix products (the tied LM head counted)
  std::uint64_t largest_group = 0;  // largest module's owned elements
  int attention_layers = 0;
  int hidden = 0;
};

ModelShape shape_of(const model::Model& m) {
  ModelShape s;
  s.params = m.num_params();
  s.hidden = m.hidden_size();
  const auto params = m.params();
  int index = 0;
  for (const model::ModuleSpec& mod : m.modules()) {
    std::uint64_t owned = 0;
    for (int p : mod.params) {
      const model::ParamSpec& ps = params[static_cast<std::size_t>(p)];
      if (ps.module == index) owned += ps.numel;
      // A module whose backward does not read its values is a lookup (the embeddings); the same
      // matrix listed by another module (the tied LM head) is a product there.
      if (ps.shape.size() == 2 && (mod.backward_reads_values || ps.module != index)) s.matmul_params += ps.numel;
    }
    s.largest_group = std::max(s.largest_group, owned);
    if (mod.name.find("attn") != std::string::npos) ++s.attention_layers;
    ++index;
  }
  return s;
}

// The candidate's knobs as ds_config JSON.
ordered_json zero_json(const Candidate& c, const Machine& machine) {
  ordered_json z;
  z["stage"] = 3;
  z["sub_group_size"] = c.sub_group_size;
  z["reduce_bucket_size"] = c.reduce_bucket_size;
  z["stage3_prefetch_bucket_size"] = c.prefetch_bucket_size;
  z["stage3_param_persistence_threshold"] = 100000;
  z["stage3_max_live_parameters"] = c.max_live_parameters;
  if (c.max_reuse_distance > 0) z["stage3_max_reuse_distance"] = c.max_reuse_distance;
  const std::string opt_path = machine.drives.empty() ? "" : machine.drives.front().path;
  const std::string param_path = machine.drives.empty() ? "" : machine.drives[machine.drives.size() > 1 ? 1 : 0].path;
  ordered_json op = {{"device", std::string(config::offload_device_name(c.param_device))}};
  if (c.param_device == OffloadDevice::kNvme) {
    op["nvme_path"] = param_path;
    op["buffer_count"] = c.param_buffer_count;
    op["buffer_size"] = c.param_buffer_size;
    op["max_in_cpu"] = 0;
  }
  ordered_json oo = {{"device", std::string(config::offload_device_name(c.optimizer_device))}};
  if (c.optimizer_device == OffloadDevice::kNvme) {
    oo["nvme_path"] = opt_path;
    oo["buffer_count"] = c.optimizer_buffer_count;
    oo["pipeline_read"] = true;
    oo["pipeline_write"] = true;
  }
  z["offload_param"] = op;
  z["offload_optimizer"] = oo;
  return z;
}

struct Roofs {
  double flops, mem, read, write;  // bytes or flops per second
  std::vector<std::pair<int, double>> flops_by_rows;  // (rows, flops per second), ascending
  // The rates the engine's transfers reach (the roofs times the shares above).
  double engine_read() const { return read * kSyncReadShare; }
  double engine_write() const { return write * kSyncWriteShare; }
  double tile_read() const { return read * kTileDriveShare; }
  double tile_write() const { return write * kTileDriveShare; }
  double flops_at(double rows) const {
    if (flops_by_rows.empty()) return flops;
    if (rows <= flops_by_rows.front().first) return flops_by_rows.front().second;
    for (std::size_t i = 1; i < flops_by_rows.size(); ++i) {
      const auto [r0, f0] = flops_by_rows[i - 1];
      const auto [r1, f1] = flops_by_rows[i];
      if (rows <= r1) return f0 + (f1 - f0) * std::log(rows / r0) / std::log(static_cast<double>(r1) / r0);
    }
    return flops_by_rows.back().second;
  }
};

// The share of the GPU's peak its passes reach at micro-batches of `tokens` (kGpuPassShare).
double gpu_pass_share(int hidden, double tokens) {
  // Below the narrowest width the first segment's slope goes on (to a quarter of it, at least
  // 0.05); above the widest the share stays.
  constexpr std::size_t kLast = std::size(kGpuPassShare) - 1;
  const double h = std::clamp(static_cast<double>(hidden), kGpuPassShare[0].first / 4.0, kGpuPassShare[kLast].first);
  std::size_t i = 1;
  while (i < kLast && h > kGpuPassShare[i].first) ++i;
  const auto [h0, s0] = kGpuPassShare[i - 1];
  const auto [h1, s1] = kGpuPassShare[i];
  const double share = std::max(0.05, s0 + (s1 - s0) * std::log(h / h0) / std::log(h1 / h0));
  return share * std::pow(std::min(1.0, tokens / kGpuFullTokens), kGpuTokensExponent);
}

// The passes on a GPU: its kernels at the calibrated share of its peak, then the host <-> GPU
// copies: the gathered values up, `gathers` models' worth of them (one when they stay on the
// device across micro-batches), and the gradients down (once a step when the sums across
// micro-batches are held on the GPU: one rank, within 40% of its memory; else every
// micro-batch). The uploads add to the passes: run 33's 1.3B gathering again every micro-batch
// took its kernels' time plus its uploads at the copy rate (1.959 s of passes against 1.415 for
// the same kernels with the values kept, 29.95 GB up at 53.8 GB/s: 0.557 s), though its compute
// stream never waited on an upload by the engine's count. The downloads run beside the kernels
// (the runs' gradient downloads held the GPU up 0.13-0.67 s a step, within the fit). With the
// whole state on the GPU nothing crosses.
void predict_gpu_passes(Candidate& c, const ModelShape& s, const config::DsConfig& ds, const PlanRequest& r,
                        const PlanGpu& gpu, double shard, double gathers, bool state_on_gpu) {
  const double gas = static_cast<double>(c.grad_accum);
  const double tokens = static_cast<double>(c.micro_batch) * r.seq;
  const double P = static_cast<double>(s.params);
  const double recompute = c.activation_checkpointing ? kGpuRecompute : 1.0;
  const double flops = (6.0 * P + 12.0 * s.attention_layers * r.seq * s.hidden) * tokens;
  c.compute_s = gas * recompute * flops / (gpu.tflops.value * 1e12 * gpu_pass_share(s.hidden, tokens));
  if (state_on_gpu) return;
  const double dsize = ds.bf16.enabled || ds.fp16.enabled ? 2.0 : 4.0;
  const bool held = gas > 1 && r.world_size == 1 && 4.0 * P <= 0.4 * static_cast<double>(gpu.room_bytes);
  const double up = gathers * dsize * shard, down = (held ? 1.0 : gas) * 4.0 * shard;
  const double pcie = gpu.pcie_gbps.value * 1e9;
  c.pcie_s = (up + down) / pcie;
  c.gather_s = up / pcie + std::max(0.0, down / pcie - c.compute_s);
}

// Time per optimizer step (docs/plan.md, "Time"): the passes, the coordinator's memory
// traffic, the parameters' NVMe reads (hidden behind the passes when prefetch can stage them),
// and the optimizer step (its NVMe traffic overlapped with its compute by the pipelines).
// `plain`: the model without activation checkpointing. The passes' element-wise work is that
// model's activations, whatever the candidate stores, and recomputing repeats the forward's share.
void predict_time(Candidate& c, const ModelShape& s, const model::Model& plain, const config::DsConfig& ds,
                  const PlanRequest& r, const Roofs& roofs, const PlanGpu* gpu) {
  const double W = r.world_size, gas = static_cast<double>(c.grad_accum);
  const double tokens = static_cast<double>(c.micro_batch) * r.seq;
  const double shard = c.memory.shard_elements > 0 ? static_cast<double>(c.memory.shard_elements)
                                                   : static_cast<double>(s.params) / W;
  const double dsize = ds.bf16.enabled || ds.fp16.enabled ? 2.0 : 4.0;
  const double recompute = c.activation_checkpointing ? 4.0 / 3.0 : 1.0;
  const bool state_on_gpu = gpu != nullptr && r.world_size == 1 &&
                            ds.zero.offload_param.device == OffloadDevice::kNone &&
                            ds.zero.offload_optimizer.device == OffloadDevice::kNone;
  // Gathers per step, in models' worth. The coordinator keeps released copies while the live
  // budget has room and evicts the one used farthest ahead, so the step's first forward gathers
  // everything, each backward re-gathers what the budget could not keep from the forward's end,
  // and each later micro-step's forward what it could not keep from the backward's end (the live
  // budget holds the whole model: one gather a step). Recomputing a checkpointed block gathers
  // nothing more: its backward, right after, takes the same copies (the budget holds a block).
  // On a GPU the coordinator also drops a value whose next use is past
  // stage3_max_reuse_distance, which a pass's traffic reaches when it is under twice the model
  // (run 28). docs/plan.md has the runs' gathered_elements against this.
  const double P = static_cast<double>(s.params);
  const bool reuse_reaches = gpu == nullptr || static_cast<double>(c.max_reuse_distance) >= 2.0 * P;
  const double kept = reuse_reaches ? std::min(1.0, static_cast<double>(c.max_live_parameters) / P) : 0.0;
  const double gathers = 1.0 + (2.0 * gas - 1.0) * (1.0 - kept);
  c.gathers = state_on_gpu ? 0.0 : gathers;
  if (gpu != nullptr) {
    predict_gpu_passes(c, s, ds, r, *gpu, shard, gathers, state_on_gpu);
  } else {
    const double flops =
        (6.0 * static_cast<double>(s.matmul_params) + 12.0 * s.attention_layers * r.seq * s.hidden) * tokens * recompute;
    // The plain model's activations: a checkpointed model stores a fraction of them but computes
    // them all, the forward's twice.
    const double act = static_cast<double>(plain.activation_bytes(static_cast<int>(c.micro_batch), r.seq));
    c.compute_s = gas * (flops / roofs.flops_at(tokens) + kActivationPasses * recompute * act / roofs.mem);
    if (c.memory.budgeted && c.activation_checkpointing &&
        c.memory.budgeted->weight_copy_bytes < c.memory.budgeted->weight_copy_asked) {
      // A budget that keeps only some bf16 weight copies: the backward pass uses each weight twice
      // (the recomputed forward, then the input gradient) and rounds a weight without a copy both
      // times (bf16_weights.h): one more read of 4 and write of 2 bytes per element.
      const double uncached =
          static_cast<double>(c.memory.budgeted->weight_copy_asked - c.memory.budgeted->weight_copy_bytes) / 2.0;
      c.compute_s += gas * 6.0 * uncached / roofs.mem;
    }
    c.gather_s = (gathers * (dsize + 4.0) * shard + gas * kGradBytes * P) / roofs.mem;
  }
  if (c.param_device == OffloadDevice::kNvme) {
    // Counted in full: the tier stages at most buffer_count - 1 partitions ahead, within the live
    // budget's room, and converts each on the compute thread; runs with the parameters on NVMe
    // did not hide their reads behind the passes (docs/plan.md, "Time").
    c.param_io_s = gathers * dsize * shard / roofs.engine_read();
    c.param_io_exposed_s = c.param_io_s;
  }
  c.optimizer_s = state_on_gpu ? P * kGpuAdamBytes / (gpu->hbm_gbps.value * 1e9)
                               : shard * (kAdamBytes / (kAdamTriadRatio * roofs.mem) + 2.0 / roofs.mem);
  double opt_total = c.optimizer_s;
  if (c.optimizer_device == OffloadDevice::kNvme) {
    // The gradients live in the swapper's gradient store (grad_store.cpp): each micro-step writes
    // its partitions' sums and, after the first, reads the sums so far; before the step the norm
    // reads back the blocks two partitions share. A partition's write runs under the next
    // module's backward and the next partition's sum is read ahead beside it (both on the one
    // drive), so a micro-step shows what its backward cannot cover, and the step the last
    // partition's write, which the norm waits for.
    const double grads = 4.0 * shard;
    const double backward_share = c.activation_checkpointing ? 0.75 : 2.0 / 3.0;  // of the flops
    const double backward_s = c.compute_s / gas * backward_share;
    const double writes_s = grads / roofs.engine_write();
    const double reads_s = grads / roofs.engine_read();
    const double last_write_s = 4.0 * static_cast<double>(c.memory.largest_partition) / roofs.engine_write();
    c.grad_io_s = std::max(0.0, writes_s - backward_s) + (gas - 1.0) * std::max(0.0, writes_s + reads_s - backward_s) +
                  last_write_s;
    const double norm_bytes = 4.0 * static_cast<double>(c.memory.norm_read_elements);
    const double norm_s = norm_bytes / roofs.engine_read();
    // The step's tiles read master, states and gradient, and write master and states (and the
    // 16-bit copies when the parameters are on NVMe).
    const double copy = c.param_device == OffloadDevice::kNvme ? dsize * shard : 0.0;
    c.optimizer_io_s = (4.0 * kOptimizerArrays * shard + grads) / roofs.tile_read() +
                       (4.0 * kOptimizerArrays * shard + copy) / roofs.tile_write();
    // Pipelined tiles: the longer of compute and I/O, plus one tile's ramp (its read is taken
    // ahead during the passes, so the ramp is the last tile's write).
    double tile = static_cast<double>(c.sub_group_size);
    if (c.memory.budgeted && c.memory.budgeted->optimizer_buffer_size > 0) {
      tile = std::min(tile, static_cast<double>(c.memory.budgeted->optimizer_buffer_size));
    }
    const double tiles = std::max(1.0, std::ceil(shard / tile));
    opt_total = norm_s + std::max(c.optimizer_s, c.optimizer_io_s) + c.optimizer_io_s / tiles / 2.0;
    c.optimizer_io_s += norm_s;
    // The store: gas writes, gas - 1 reads, the norm's read-back; the step: the arrays read and
    // written, the gradient read (the 16-bit copies are the parameter tier's bytes).
    c.nvme_bytes = (2.0 * gas - 1.0) * grads + norm_bytes + (2.0 * kOptimizerArrays + 1.0) * grads;
  } else if (c.param_device == OffloadDevice::kNvme) {
    c.optimizer_io_s = dsize * shard / roofs.engine_write();  // the updated 16-bit copies
    opt_total += c.optimizer_io_s;
  }
  const Calibration& k = r.calibration;
  c.compute_s *= k.passes;
  c.gather_s *= k.passes;
  c.param_io_exposed_s *= k.passes;
  c.grad_io_s *= k.passes;
  c.optimizer_s *= k.optimizer;
  opt_total *= k.optimizer;
  c.optimizer_exposed_s = opt_total - c.optimizer_s;
  c.step_s = c.compute_s + c.gather_s + c.param_io_exposed_s + c.grad_io_s + opt_total;
  c.tokens_per_s = gas * tokens * W / c.step_s;
  const bool on_gpu = gpu != nullptr;
  const std::pair<double, const char*> terms[] = {
      {c.compute_s, on_gpu ? "GPU compute" : "compute (matrix products and activations)"},
      {c.gather_s, on_gpu ? "host <-> GPU copies (PCIe)" : "memory bandwidth (gathers, gradients)"},
      {c.param_io_exposed_s, "NVMe parameter reads"},
      {c.grad_io_s, "NVMe gradient traffic"},
      {c.optimizer_s, state_on_gpu ? "optimizer step (GPU memory bandwidth)" : "optimizer step (memory bandwidth)"},
      {c.optimizer_exposed_s, "NVMe optimizer traffic"}};
  c.bottleneck = std::max_element(std::begin(terms), std::end(terms))->second;
}

Result<Roofs> roofs_of(const Machine& machine) {
  for (const Roof* roof : {&machine.matmul_gflops, &machine.memory_gbps, &machine.nvme_read_gbps,
                           &machine.nvme_write_gbps}) {
    if (!(roof->value > 0)) return Status::invalid_argument(fmt::format("a roof is not positive ({})", roof->source));
  }
  Roofs roofs{machine.matmul_gflops.value * 1e9, machine.memory_gbps.value * 1e9, machine.nvme_read_gbps.value * 1e9,
              machine.nvme_write_gbps.value * 1e9, {}};
  for (const auto& [rows, gflops] : machine.matmul_by_rows) roofs.flops_by_rows.emplace_back(rows, gflops * 1e9);
  return roofs;
}

// The request's model, set to compute as the engine sets it (the product kind decides the
// activations' 16-bit copies).
Result<std::unique_ptr<model::Model>> planned_model(const PlanRequest& r, bool recompute) {
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> m, r.make_model(recompute));
  ZINF_RETURN_IF_ERROR(m->set_compute_precision(compute_precision(r.precision)));
  return m;
}

// What predict_memory needs of a GPU plan's candidate of `m` at micro-batch B: the GPU model's
// workspace and the GPU's room (nothing on the host).
Result<GpuRun> gpu_run_of(const PlanRequest& r, const Machine& machine, const model::Model& m, int B) {
  GpuRun run;
  if (!machine.gpu) return run;
  if (!r.gpu_workspace) {
    return Status::invalid_argument("a plan on a GPU needs the GPU models' workspace sizes (a GPU build)");
  }
  ZINF_ASSIGN_OR_RETURN(run.workspace_bytes, r.gpu_workspace(m, B * r.seq));
  run.free_bytes = machine.gpu->room_bytes;
  return run;
}

// Bytes a candidate needs free under each drive: the optimizer's files go to the first drive, the
// parameters' to the second when given.
std::map<std::string, std::uint64_t> disk_need(const Candidate& c, const Machine& machine) {
  std::map<std::string, std::uint64_t> need;
  if (!machine.drives.empty()) {
    need[machine.drives.front().path] += c.memory.disk_optimizer;
    need[machine.drives[machine.drives.size() > 1 ? 1 : 0].path] += c.memory.disk_params;
  }
  return need;
}

bool fits_disk(const Candidate& c, const Machine& machine) {
  std::map<std::string, std::uint64_t> need = disk_need(c, machine);
  return std::all_of(machine.drives.begin(), machine.drives.end(),
                     [&](const Machine::Drive& d) { return need[d.path] <= d.free_bytes; });
}

// Why a predicted candidate does not fit; empty when it does.
std::string check_fit(const Candidate& c, const Machine& machine, const PlanRequest& r) {
  std::vector<std::string> why;
  const auto budget = static_cast<std::uint64_t>(static_cast<double>(machine.host_available) * r.host_fraction);
  if (c.memory.host_bytes() > budget) {
    why.push_back(fmt::format("host memory: needs {}, {} may be used ({:.0f}% of {} {}); short {}",
                              gib(c.memory.host_bytes()), gib(budget), 100 * r.host_fraction,
                              gib(machine.host_available), machine.host_source, gib(c.memory.host_bytes() - budget)));
    if (c.memory.least_budget > budget) {
      why.back() += fmt::format(" (with its pools, live parameters, buckets and weight copies at their least, "
                                "zinf.host_memory_budget: {}, short {})",
                                gib(c.memory.least_budget), gib(c.memory.least_budget - budget));
    }
  }
  if (c.on_gpu && machine.gpu && c.memory.gpu > machine.gpu->room_bytes) {
    why.push_back(fmt::format("GPU memory: needs {} (largest: {}), {} has {} ({}); short {}", gib(c.memory.gpu),
                              largest_terms(c.memory.gpu_terms, 2), machine.gpu->name, gib(machine.gpu->room_bytes),
                              machine.gpu->room_source, gib(c.memory.gpu - machine.gpu->room_bytes)));
  }
  std::map<std::string, std::uint64_t> need = disk_need(c, machine);
  for (const Machine::Drive& d : machine.drives) {
    if (need[d.path] > d.free_bytes) {
      why.push_back(fmt::format("disk: needs {} free under {}; {} are (short {})", gib(need[d.path]), d.path,
                                gib(d.free_bytes), gib(need[d.path] - d.free_bytes)));
    }
  }
  std::string out;
  for (const std::string& w : why) out += (out.empty() ? "" : "; ") + w;
  return out;
}

// The candidates' knobs. micro-batches: the divisors of the per-rank batch (or the one given).
std::vector<Candidate> enumerate(const PlanRequest& r, const Machine& machine, const ModelShape& s,
                                 std::int64_t per_rank_batch) {
  std::vector<std::int64_t> micros;
  if (r.micro_batch) {
    micros.push_back(*r.micro_batch);
  } else {
    for (std::int64_t b = 1; b <= per_rank_batch; ++b) {
      if (per_rank_batch % b == 0) micros.push_back(b);
    }
  }
  std::vector<OffloadDevice> devices = {OffloadDevice::kCpu};
  if (!machine.drives.empty()) devices.push_back(OffloadDevice::kNvme);
  std::vector<std::pair<OffloadDevice, OffloadDevice>> placements;  // (parameters, optimizer)
  // On a GPU, one rank may keep the whole state in GPU memory (offload none).
  if (machine.gpu && r.world_size == 1) placements.emplace_back(OffloadDevice::kNone, OffloadDevice::kNone);
  for (OffloadDevice pd : devices) {
    for (OffloadDevice od : devices) placements.emplace_back(pd, od);
  }
  const auto W = static_cast<std::uint64_t>(r.world_size);
  const auto largest_partition = static_cast<std::int64_t>((s.largest_group + W - 1) / W);
  const auto total = static_cast<std::int64_t>(s.params);
  // Lean: gather at most two of the largest modules and reduce one at a time; else keep the
  // whole model gathered across micro-steps, with stage3_max_live_parameters at twice the model:
  // the coordinator counts the freed copies it keeps for reuse against the same limit and frees
  // them to make room, so a limit of exactly the model reallocates gathered buffers every step
  // (docs/plan.md, "Time", the search). (One rank flushes each gradient as soon as it is complete
  // whatever reduce_bucket_size says, coordinator.cpp: the bucket is no knob there.)
  struct Knobs {
    bool lean, recompute;
  };
  std::vector<Knobs> knobs;
  for (bool lean : {false, true}) {
    for (bool recompute : {false, true}) knobs.push_back({lean, recompute});
  }
  const std::int64_t largest = std::max<std::int64_t>(1, static_cast<std::int64_t>(s.largest_group));
  // On a GPU the values kept across micro-batches must also be reused within
  // stage3_max_reuse_distance elements of gather traffic: a pass moves a few models' worth
  // between an upper module's last use and its next (docs/gpu.md, run 28), so 20 models.
  const std::int64_t resident_reuse = std::max<std::int64_t>(1000000000, (20 * total + 999999999) / 1000000000 * 1000000000);
  std::vector<Candidate> out;
  for (const auto& [pd, od] : placements) {
    std::vector<std::int64_t> groups = {1000000000};
    if (od == OffloadDevice::kNvme) groups = {1000000, 10000000, 100000000, 1000000000};
    for (std::int64_t sg : groups) {
      if (sg != groups.front() && sg / 10 >= total) continue;  // the same layout as a smaller one
      for (const Knobs& k : knobs) {
        // The state on the GPU gathers nothing: the live knobs do not apply.
        if (pd == OffloadDevice::kNone && k.lean) continue;
        for (std::int64_t b : micros) {
          Candidate c;
          c.on_gpu = machine.gpu.has_value();
          c.param_device = pd;
          c.optimizer_device = od;
          c.micro_batch = b;
          c.grad_accum = per_rank_batch / b;
          c.activation_checkpointing = k.recompute;
          c.sub_group_size = sg;
          const std::int64_t live = k.lean ? 2 * largest : std::max<std::int64_t>(total, 1);
          c.max_live_parameters = k.lean ? live : 2 * live;
          if (c.on_gpu && !k.lean) c.max_reuse_distance = resident_reuse;
          c.prefetch_bucket_size = std::min<std::int64_t>(live / 2 + 1, 50000000);
          c.reduce_bucket_size = k.lean ? largest : std::min<std::int64_t>(total, 500000000);
          c.param_buffer_count = 5;
          c.param_buffer_size = (largest_partition + 2047) / 2048 * 2048;
          c.optimizer_buffer_count = 4;
          out.push_back(c);
        }
      }
    }
  }
  return out;
}

std::string explain_winner(const Plan& plan, const Machine& machine, const PlanRequest& r) {
  const Candidate& w = plan.fitting.front();
  std::string why = fmt::format("{} wins at {:.3f} s/step ({:.0f} tokens/s), bound by {}.", w.label(), w.step_s,
                                w.tokens_per_s, w.bottleneck);
  // Against the best of every other offload combination.
  std::map<std::pair<int, int>, const Candidate*> best;
  for (const Candidate& c : plan.fitting) {
    auto key = std::make_pair(static_cast<int>(c.param_device), static_cast<int>(c.optimizer_device));
    if (best.count(key) == 0) best[key] = &c;
  }
  for (const auto& [key, c] : best) {
    if (c == &plan.fitting.front()) continue;
    why += fmt::format(" Best with parameters {} and optimizer {}: {:.2f}x slower ({}).",
                       config::offload_device_name(c->param_device), config::offload_device_name(c->optimizer_device),
                       c->step_s / w.step_s, c->bottleneck);
  }
  std::size_t nvme_dropped = 0;
  for (const Candidate& c : plan.dropped) nvme_dropped += c.optimizer_device == OffloadDevice::kCpu ? 1 : 0;
  if (w.optimizer_device == OffloadDevice::kNvme && nvme_dropped > 0) {
    why += " Keeping the optimizer state in memory does not fit.";
  }
  // The fastest candidate that only the share of host memory left out (--host-fraction) dropped:
  // its prediction is within the memory available, and a user who knows the machine runs nothing
  // else may admit it.
  for (const Candidate& c : plan.dropped) {  // fastest first
    if (c.step_s >= w.step_s || machine.host_available == 0) break;
    if (c.memory.host.empty()) continue;
    const double share = static_cast<double>(c.memory.host_bytes()) / static_cast<double>(machine.host_available);
    if (share > 1.0) continue;
    PlanRequest admitted = r;
    admitted.host_fraction = std::ceil(share * 100.0) / 100.0;  // at most 1
    if (!check_fit(c, machine, admitted).empty()) continue;  // short of something else too
    why += fmt::format(
        " {} would be {:.2f}x faster ({:.3f} s/step) and is predicted to need {}, {:.0f}% of the {} available: "
        "--host-fraction {:.2f} admits it, leaving the rest to the system and other programs.",
        c.label(), w.step_s / c.step_s, c.step_s, gib(c.memory.host_bytes()), 100.0 * share,
        gib(machine.host_available), admitted.host_fraction);
    break;
  }
  return why;
}

// The least host memory a candidate can run in: as configured, or under a budget at the least.
std::uint64_t least_host(const Candidate& c) {
  const std::uint64_t host = c.memory.host_bytes();
  return c.memory.least_budget > 0 ? std::min(host, c.memory.least_budget) : host;
}

// When nothing fits: the candidate closest to fitting, what it lacks, and the smallest change.
std::string explain_shortfall(const Plan& plan, const Machine& machine, const PlanRequest& r) {
  const Candidate* closest = nullptr;
  double best = 1e300;
  const double budget = static_cast<double>(machine.host_available) * r.host_fraction;
  for (const Candidate& c : plan.dropped) {
    if (c.memory.host.empty()) continue;
    double over = static_cast<double>(least_host(c)) / std::max(budget, 1.0);
    for (const Machine::Drive& d : machine.drives) {
      over = std::max(over, static_cast<double>(c.memory.disk_bytes()) / std::max(1.0, static_cast<double>(d.free_bytes)));
    }
    if (c.on_gpu && machine.gpu) {
      over = std::max(over, static_cast<double>(c.memory.gpu) / static_cast<double>(machine.gpu->room_bytes));
    }
    if (over < best) {
      best = over;
      closest = &c;
    }
  }
  if (closest == nullptr) return "no candidate could be sized (see the errors above)";
  std::string s = fmt::format("nothing fits. Closest: {}: {}.", closest->label(), closest->why_not);
  std::vector<std::string> change;
  const std::uint64_t host = least_host(*closest);
  if (static_cast<double>(host) > budget) {
    change.push_back(fmt::format("{} more free host memory ({} available in all, at --host-fraction {:g})",
                                 gib(host - static_cast<std::uint64_t>(budget)),
                                 gib(static_cast<std::uint64_t>(static_cast<double>(host) / r.host_fraction)),
                                 r.host_fraction));
  }
  if (closest->on_gpu && machine.gpu && closest->memory.gpu > machine.gpu->room_bytes) {
    change.push_back(fmt::format("{} more GPU memory ({} in all)", gib(closest->memory.gpu - machine.gpu->room_bytes),
                                 gib(closest->memory.gpu)));
  }
  std::map<std::string, std::uint64_t> need = disk_need(*closest, machine);
  for (const Machine::Drive& d : machine.drives) {
    if (need[d.path] > d.free_bytes) {
      change.push_back(fmt::format("{} more free under {} ({} in all)", gib(need[d.path] - d.free_bytes), d.path,
                                   gib(need[d.path])));
    }
  }
  s += " The smallest change that fits it:";
  for (std::size_t i = 0; i < change.size(); ++i) s += (i == 0 ? " " : " and ") + change[i];
  s += " (or a smaller --seq or batch, or more ranks).";
  if (machine.drives.empty()) s += " Or give --nvme-path: state on NVMe needs the least host memory.";
  return s;
}

}  // namespace

std::string Candidate::label() const {
  return fmt::format("params {}, optimizer {}, micro {} x {}{}, sub_group {}, live {}{}",
                     config::offload_device_name(param_device), config::offload_device_name(optimizer_device),
                     micro_batch, grad_accum, activation_checkpointing ? ", recompute" : "", count_name(sub_group_size),
                     count_name(max_live_parameters),
                     host_memory_budget > 0 ? fmt::format(", host budget {}", gib(host_memory_budget)) : "");
}

Result<Candidate> predict_config(const PlanRequest& request, const Machine& machine, const config::DsConfig& ds) {
  const bool recompute = ds.activation_checkpointing.present;
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> m, planned_model(request, recompute));
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> plain, planned_model(request, false));
  ZINF_ASSIGN_OR_RETURN(const Roofs roofs, roofs_of(machine));
  Candidate c;
  c.on_gpu = machine.gpu.has_value();
  const config::ZeroSection& z = ds.zero;
  c.param_device = z.offload_param.device;
  c.optimizer_device = z.offload_optimizer.device;
  // On the host "none" keeps the state in memory, as "cpu" does.
  if (!c.on_gpu && c.param_device == OffloadDevice::kNone) c.param_device = OffloadDevice::kCpu;
  if (!c.on_gpu && c.optimizer_device == OffloadDevice::kNone) c.optimizer_device = OffloadDevice::kCpu;
  c.micro_batch = ds.batch.train_micro_batch_size_per_gpu;
  c.grad_accum = ds.batch.gradient_accumulation_steps;
  c.activation_checkpointing = recompute;
  c.sub_group_size = z.sub_group_size;
  c.max_live_parameters = z.max_live_parameters;
  c.max_reuse_distance = z.max_reuse_distance;
  c.prefetch_bucket_size = z.prefetch_bucket_size;
  c.reduce_bucket_size = z.reduce_bucket_size;
  c.param_buffer_count = z.offload_param.buffer_count;
  c.param_buffer_size = z.offload_param.buffer_size;
  c.optimizer_buffer_count = z.offload_optimizer.buffer_count;
  c.host_memory_budget = ds.zinf.host_memory_budget;
  const int B = static_cast<int>(c.micro_batch);
  ZINF_ASSIGN_OR_RETURN(const GpuRun gpu_run, gpu_run_of(request, machine, *m, B));
  ZINF_ASSIGN_OR_RETURN(c.memory, predict_memory(*m, ds, B, request.seq, c.on_gpu ? ComputeOn::kGpu : ComputeOn::kHost,
                                                 gpu_run));
  predict_time(c, shape_of(*plain), *plain, ds, request, roofs, c.on_gpu ? &*machine.gpu : nullptr);
  c.why_not = check_fit(c, machine, request);
  c.fits = c.why_not.empty();
  return c;
}

Result<Calibration> calibrate(const PlanRequest& request, const Machine& machine, const config::DsConfig& ran,
                              double passes_s, double optimizer_s, const std::string& source) {
  if (!(passes_s > 0) || !(optimizer_s > 0)) {
    return Status::invalid_argument(fmt::format("{}: the step breakdown has no positive forward/backward and "
                                                "optimizer seconds (a --json-log of zinf train expected)",
                                                source));
  }
  PlanRequest uncalibrated = request;
  uncalibrated.calibration = {};
  ZINF_ASSIGN_OR_RETURN(const Candidate c, predict_config(uncalibrated, machine, ran));
  const double passes = c.compute_s + c.gather_s + c.param_io_exposed_s + c.grad_io_s;
  const double optimizer = c.step_s - passes;
  return Calibration{passes_s / passes, optimizer_s / optimizer,
                     fmt::format("calibrated from {}: passes x{:.2f}, optimizer x{:.2f}", source, passes_s / passes,
                                 optimizer_s / optimizer)};
}

std::string plan_ds_config(const Candidate& c, const PlanRequest& r, const Machine& machine) {
  ordered_json j;
  j["train_batch_size"] = c.micro_batch * c.grad_accum * r.world_size;
  j["train_micro_batch_size_per_gpu"] = c.micro_batch;
  j["gradient_accumulation_steps"] = c.grad_accum;
  j["steps_per_print"] = 10;
  j["bf16"] = {{"enabled", r.precision == config::Precision::kBf16}};
  j["fp16"] = {{"enabled", r.precision == config::Precision::kFp16}};
  if (!r.optimizer_json.empty()) {
    const ordered_json blocks = ordered_json::parse(r.optimizer_json);
    for (const auto& [k, v] : blocks.items()) j[k] = v;
  }
  j["zero_optimization"] = zero_json(c, machine);
  if (c.activation_checkpointing) j["activation_checkpointing"] = {{"partition_activations", false}};
  if (c.host_memory_budget > 0) j["zinf"] = {{"host_memory_budget", c.host_memory_budget}};
  const config::AioSection& a = machine.aio;
  j["aio"] = {{"block_size", a.block_size},
              {"queue_depth", a.queue_depth},
              {"intra_op_parallelism", a.intra_op_parallelism},
              {"single_submit", a.single_submit},
              {"overlap_events", a.overlap_events}};
  return j.dump(2) + "\n";
}

Result<Plan> make_plan(const PlanRequest& r, const Machine& machine) {
  if (!r.make_model) return Status::invalid_argument("make_plan: no model");
  if (r.seq < 1) return Status::invalid_argument(fmt::format("--seq {}: must be at least 1", r.seq));
  if (r.world_size < 1) return Status::invalid_argument(fmt::format("--world-size {}: must be at least 1", r.world_size));
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> plain, planned_model(r, false));
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> recompute, planned_model(r, true));
  const ModelShape shape = shape_of(*plain);

  // Samples per rank per optimizer step: --train-batch, else micro x accumulation, else the
  // Trainer's default micro-batch.
  std::int64_t per_rank = config::TrainerDefaults::kMicroBatch;
  if (r.train_batch) {
    if (*r.train_batch % r.world_size != 0) {
      return Status::invalid_argument(
          fmt::format("--train-batch {} is not a multiple of --world-size {}", *r.train_batch, r.world_size));
    }
    per_rank = *r.train_batch / r.world_size;
  } else if (r.micro_batch) {
    per_rank = *r.micro_batch * r.grad_accum.value_or(1);
  }
  if (r.micro_batch && per_rank % *r.micro_batch != 0) {
    return Status::invalid_argument(fmt::format("--micro-batch {} does not divide the {} samples per rank of --train-batch",
                                                *r.micro_batch, per_rank));
  }
  Plan plan;
  plan.tokens_per_step = per_rank * r.world_size * r.seq;
  ZINF_ASSIGN_OR_RETURN(const Roofs roofs, roofs_of(machine));
  config::AutoContext ctx;
  ctx.world_size = r.world_size;
  // Writes, parses and predicts a candidate; an error is the planner's own (a config zinf refuses).
  auto predict = [&](Candidate& c) -> Status {
    c.ds_config = plan_ds_config(c, r, machine);
    Result<config::DsConfig> ds = config::parse_ds_config(c.ds_config, "<plan>", ctx);
    if (!ds.is_ok()) return ds.status().with_context("the planner wrote a config zinf refuses");
    const model::Model& m = c.activation_checkpointing ? *recompute : *plain;
    const int B = static_cast<int>(c.micro_batch);
    ZINF_ASSIGN_OR_RETURN(const GpuRun gpu_run, gpu_run_of(r, machine, m, B));
    Result<MemoryPrediction> mem =
        predict_memory(m, ds.value(), B, r.seq, c.on_gpu ? ComputeOn::kGpu : ComputeOn::kHost, gpu_run);
    if (!mem.is_ok()) {
      c.why_not = mem.status().message();
      return Status::ok();
    }
    c.memory = std::move(mem).value();
    predict_time(c, shape, *plain, ds.value(), r, roofs, c.on_gpu ? &*machine.gpu : nullptr);
    c.why_not = check_fit(c, machine, r);
    c.fits = c.why_not.empty();
    return Status::ok();
  };
  const auto usable = static_cast<std::uint64_t>(static_cast<double>(machine.host_available) * r.host_fraction);
  std::set<std::string> budgeted;
  for (Candidate c : enumerate(r, machine, shape, per_rank)) {
    ZINF_RETURN_IF_ERROR(predict(c));
    // Short of host memory only: the same candidate under zinf.host_memory_budget, which the
    // engine fits by lowering the pools, the live parameters, the buckets and the weight copies.
    // (On a GPU the budget's terms are not modelled: predict_memory.)
    const bool host_only =
        !c.on_gpu && !c.fits && !c.memory.host.empty() && c.memory.host_bytes() > usable && fits_disk(c, machine);
    if (host_only && c.memory.least_budget <= usable) {
      Candidate b = c;
      b.host_memory_budget = usable;
      b.memory = {};
      b.why_not.clear();
      ZINF_RETURN_IF_ERROR(predict(b));
      if (b.memory.budgeted) {
        // The lowered knobs go into the written config (DeepSpeed reads them too); the engine
        // sizes the rest (the optimizer's buffers, the weight copies) from the budget again.
        const config::ZeroSection& z = b.memory.budgeted->zero;
        b.max_live_parameters = z.max_live_parameters;
        b.prefetch_bucket_size = z.prefetch_bucket_size;
        b.reduce_bucket_size = z.reduce_bucket_size;
        b.param_buffer_size = z.offload_param.buffer_size;
        ZINF_RETURN_IF_ERROR(predict(b));
      }
      // Candidates that differ only in knobs the budget lowers, or in a bucket that moves neither
      // memory nor time, come out the same: one is kept.
      const std::string same = fmt::format("{}|{}|{}", b.label(), b.step_s, b.memory.host_bytes());
      if (budgeted.insert(same).second) (b.fits ? plan.fitting : plan.dropped).push_back(std::move(b));
    }
    (c.fits ? plan.fitting : plan.dropped).push_back(std::move(c));
  }
  auto faster = [](const Candidate& a, const Candidate& b) {
    if (a.step_s != b.step_s) return a.step_s < b.step_s;
    // Equal time: the one that gathers less (on a GPU the copies' overlap is the model's least
    // checked part: docs/plan.md, "Time on a GPU"), then the smaller one, on the GPU first.
    if (a.gathers != b.gathers) return a.gathers < b.gathers;
    if (a.memory.gpu != b.memory.gpu) return a.memory.gpu < b.memory.gpu;
    return a.memory.host_bytes() < b.memory.host_bytes();
  };
  std::stable_sort(plan.fitting.begin(), plan.fitting.end(), faster);
  std::stable_sort(plan.dropped.begin(), plan.dropped.end(), faster);
  const std::pair<const char*, const Roof*> named[] = {{"matmul rate", &machine.matmul_gflops},
                                                       {"memory bandwidth", &machine.memory_gbps},
                                                       {"NVMe read bandwidth", &machine.nvme_read_gbps},
                                                       {"NVMe write bandwidth", &machine.nvme_write_gbps}};
  for (const auto& [what, roof] : named) {
    if (!roof->measured) plan.assumptions.push_back(fmt::format("{}: {}", what, roof->source));
  }
  plan.calibration = r.calibration.source;
  plan.assumptions.push_back(fmt::format(
      "time-model constants: {} activation passes through memory, Adam at {}x the triad over {} bytes/element, "
      "{} bytes/parameter of gradient traffic, the engine's synchronous NVMe reads at {} and writes at {} of the "
      "drive's rates ({} in the optimizer step's pipelined tiles; docs/plan.md)",
      kActivationPasses, kAdamTriadRatio, kAdamBytes, kGradBytes, kSyncReadShare, kSyncWriteShare,
      kTileDriveShare));
  plan.assumptions.push_back(fmt::format("process base {} MiB (docs/plan.md, \"Memory\")",
                                         (machine.gpu ? kCudaProcessBaseBytes : kProcessBaseBytes) >> 20));
  if (machine.gpu) {
    const PlanGpu& g = *machine.gpu;
    const std::pair<const char*, const Roof*> gpu_roofs[] = {
        {"GPU peak", &g.tflops}, {"GPU memory bandwidth", &g.hbm_gbps}, {"host <-> GPU copies", &g.pcie_gbps}};
    for (const auto& [what, roof] : gpu_roofs) {
      if (!roof->measured) plan.assumptions.push_back(fmt::format("{}: {}", what, roof->source));
    }
    plan.assumptions.push_back(fmt::format(
        "GPU time-model constants: the passes at {:g}-{:g} of the peak by hidden width, calibrated on H100 and H200 "
        "runs at {:g} tokens a micro-batch (falling as (tokens/{:g})^{:g} below, not measured); activation "
        "checkpointing {:g}x the passes (one run); the AdamW on a "
        "GPU-resident state {:g} bytes/parameter at its memory bandwidth; uploads added to the passes, downloads "
        "hidden under the kernels; the "
        "host's gradient handling in the last backward not modelled (docs/plan.md, \"Time on a GPU\")",
        kGpuPassShare[0].second, kGpuPassShare[std::size(kGpuPassShare) - 1].second, kGpuFullTokens, kGpuFullTokens, kGpuTokensExponent,
        kGpuRecompute, kGpuAdamBytes));
  }
  if (plan.fitting.empty()) {
    plan.shortfall = explain_shortfall(plan, machine, r);
  } else {
    plan.why_winner = explain_winner(plan, machine, r);
  }
  return plan;
}

}  // namespace zinf::zero3
