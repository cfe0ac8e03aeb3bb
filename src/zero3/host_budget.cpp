// The host-memory budget: the run's fixed host memory, each knob's least and asked bytes, and the
// knobs lowered to fit (host_budget.h).
#include "zero3/host_budget.h"

#include <algorithm>
#include <fstream>
#include <numeric>
#include <set>

#include <fmt/format.h>

#include "zinf/swap/pinned_pool.h"
#include "zinf/swap/types.h"
#include "zinf/zero3/disk_space.h"

namespace zinf::zero3 {
namespace {

constexpr std::uint64_t kPage = 4096;
constexpr std::uint64_t kAlign = swap::PartitionLayout::kAlign;
// Allocator slack, thread stacks, the aio rings, the data loader's rows: a share of the budget
// kept free (the planner's margin, docs/plan.md "Memory").
constexpr double kMarginShare = 0.05;
// The math libraries' per-thread work buffers, faulted in by the first products (after the engine
// is made, so not in the RSS it measures): part of the planner's calibrated process base.
constexpr std::uint64_t kLibraryScratch = std::uint64_t{64} << 20;
// The swapped gradient store's buffer: at least this many elements, in whole norm blocks
// (grad_store.cpp).
constexpr std::uint64_t kGradStatsChunk = std::uint64_t{1} << 20, kNormBlock = 8192;
// The least a parameter staging buffer is made (a partition smaller than it: the partition).
constexpr std::uint64_t kLeastParamBuffer = std::uint64_t{1} << 20;

std::uint64_t up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
std::uint64_t down(std::uint64_t v, std::uint64_t a) { return v / a * a; }
std::uint64_t u64(std::int64_t v) { return static_cast<std::uint64_t>(std::max<std::int64_t>(0, v)); }

swap::DType run_dtype(const config::DsConfig& ds) {
  if (ds.bf16.enabled) return swap::DType::kBF16;
  if (ds.fp16.enabled) return swap::DType::kF16;
  return swap::DType::kF32;
}

// One memory the budget sizes: bytes at the least that works, as ds_config asks, and as used.
struct Knob {
  std::string name;
  std::uint64_t least = 0, asked = 0, used = 0;
  bool pinned = false;
  std::string least_name;  // what its least is, for the refusal (default: name + " at the least")
};

// Gives `extra` bytes to the knobs above their least, an equal share each (max-min fair): a knob
// that asks less than its share keeps what it asks and leaves the rest to the others.
void share(std::vector<Knob*> knobs, std::uint64_t extra) {
  std::sort(knobs.begin(), knobs.end(), [](const Knob* a, const Knob* b) { return a->asked - a->least < b->asked - b->least; });
  for (std::size_t i = 0; i < knobs.size(); ++i) {
    const std::uint64_t fair = extra / (knobs.size() - i);
    const std::uint64_t give = std::min(knobs[i]->asked - knobs[i]->least, fair);
    knobs[i]->used = knobs[i]->least + give;
    extra -= give;
  }
}

// The fixed terms: what the run holds whatever the knobs.
std::vector<MemoryTerm> fixed_terms(const HostBudgetRequest& r, const GatheredSizes& g, std::uint64_t shard) {
  const config::ZeroSection& z = r.ds.zero;
  const bool opt_nvme = z.offload_optimizer.device == config::OffloadDevice::kNvme;
  const bool param_nvme = z.offload_param.device == config::OffloadDevice::kNvme;
  const swap::DType dtype = run_dtype(r.ds);
  const std::uint64_t dsize = swap::dtype_size(dtype);
  std::vector<MemoryTerm> t;
  t.push_back({"the process before the engine (program, libraries, data)", r.in_use, false});
  t.push_back({"the math libraries' work buffers", kLibraryScratch, false});
  t.push_back({fmt::format("activations for {} x {} (the bf16 weight copies included)", r.B, r.T),
               r.model.activation_bytes(r.B, r.T), false});
  if (opt_nvme) {
    std::uint64_t largest = 0;
    for (const swap::ParamPartition& p : r.layout.params) largest = std::max(largest, p.numel);
    t.push_back({"the gradient store's buffer (fp32; the gradients are on NVMe)",
                 4 * up(std::max(largest, kGradStatsChunk), kNormBlock), true});
  } else {
    t.push_back({"fp32 gradient partitions", 4 * shard, false});
    t.push_back({fmt::format("optimizer state in memory (master + {} states, fp32)", r.optimizer_states),
                 4 * (1 + r.optimizer_states) * shard, false});
  }
  if (param_nvme) {
    if (!opt_nvme) t.push_back({"16-bit copy staging (one sub-group)", 4 * r.layout.largest_subgroup(), false});
  } else if (!(dtype == swap::DType::kF32 && !opt_nvme)) {
    t.push_back({fmt::format("parameter partitions ({})", swap::dtype_name(dtype)), dsize * shard, false});
  }
  if (g.persistent > 0) {
    t.push_back({"persistent gathered parameters (fp32, stage3_param_persistence_threshold)", 4 * g.persistent, false});
  }
  return t;
}

std::string biggest_terms(std::vector<MemoryTerm> terms) {
  std::sort(terms.begin(), terms.end(), [](const MemoryTerm& a, const MemoryTerm& b) { return a.bytes > b.bytes; });
  std::string s;
  for (std::size_t i = 0; i < terms.size() && i < 5; ++i) {
    if (terms[i].bytes == 0) break;
    s += fmt::format("{}{} for {}", s.empty() ? "" : ", ", format_bytes(terms[i].bytes), terms[i].name);
  }
  return s;
}

}  // namespace

GatheredSizes gathered_sizes(const model::Model& model, const PartitionPlan& plan, const config::ZeroSection& z,
                             int world) {
  GatheredSizes g;
  std::set<std::uint64_t> sizes;
  std::vector<bool> persistent(plan.num_groups(), false);
  const auto params = model.params();
  for (std::size_t i = 0; i < plan.num_groups(); ++i) {
    const GroupSlot& slot = plan.group(i);
    const std::uint64_t full = static_cast<std::uint64_t>(slot.per_rank) * static_cast<std::uint64_t>(world);
    g.total += full;
    const bool small = std::all_of(slot.params.begin(), slot.params.end(), [&](std::size_t p) {
      return params[p].numel <= u64(z.param_persistence_threshold);
    });
    if (small && g.persistent + slot.numel <= u64(z.model_persistence_threshold)) {
      g.persistent += full;
      persistent[i] = true;
    } else {
      g.non_persistent += full;
      g.largest = std::max(g.largest, full);
      if (sizes.insert(full).second) g.distinct += full;
    }
  }
  const auto modules = model.modules();
  for (const model::ModuleSpec& m : modules) {
    std::set<std::size_t> groups;
    for (int p : m.params) groups.insert(plan.place(static_cast<std::size_t>(p)).group);
    std::uint64_t need = 0;
    for (std::size_t grp : groups) {
      if (!persistent[grp]) need += static_cast<std::uint64_t>(plan.group(grp).per_rank) * static_cast<std::uint64_t>(world);
    }
    if (need > g.module_need) {
      g.module_need = need;
      g.module_name = m.name;
    }
  }
  return g;
}

std::uint64_t gradient_buffer_bytes(const GatheredSizes& g, std::uint64_t bucket, int world) {
  // In use or kept, they stay under the bucket plus the group that crosses it; one rank flushes
  // each gradient as soon as it is complete and keeps freed buffers by size: at most one of each
  // size besides the one being filled (coordinator.cpp, flush_bucket). Several ranks add the
  // bucket's packing buffer and the reduce-scatter's 1/W output.
  const std::uint64_t b = std::min(bucket, g.total);
  std::uint64_t grads = std::min(g.total, b + g.largest);
  if (world == 1) grads = std::min(grads, g.distinct + g.largest);
  const std::uint64_t buckets = world > 1 ? b + b / static_cast<std::uint64_t>(world) : 0;
  return 4 * (grads + buckets);
}

std::uint64_t HostBudgetFit::total() const {
  return std::accumulate(terms.begin(), terms.end(), std::uint64_t{0},
                         [](std::uint64_t s, const MemoryTerm& t) { return s + t.bytes; });
}

Result<HostBudgetFit> fit_host_budget(const HostBudgetRequest& r) {
  const config::ZeroSection& z = r.ds.zero;
  const int world = static_cast<int>(r.ds.world_size);
  const bool opt_nvme = z.offload_optimizer.device == config::OffloadDevice::kNvme;
  const bool param_nvme = z.offload_param.device == config::OffloadDevice::kNvme;
  const std::uint64_t dsize = swap::dtype_size(run_dtype(r.ds));
  std::uint64_t shard = 0;
  for (const swap::SubGroup& sg : r.layout.subgroups) shard += sg.numel;
  std::uint64_t largest_part = 0;
  for (const swap::ParamPartition& p : r.layout.params) largest_part = std::max(largest_part, p.numel);
  const GatheredSizes g = gathered_sizes(r.model, r.plan, z, world);
  const std::vector<MemoryTerm> fixed = fixed_terms(r, g, shard);

  // The optimizer's pinned pool: buffer_count buffers of the largest sub-group (optimizer_swapper.cpp,
  // plan_tiles); at the least one tile of kAlign elements per pipeline stage.
  Knob opt_pool;
  opt_pool.name = "the offload_optimizer pinned pool";
  opt_pool.pinned = true;
  const std::uint64_t opt_count = u64(z.offload_optimizer.buffer_count);
  const std::uint64_t stages = 1 + (z.offload_optimizer.pipeline_read ? 1 : 0) + (z.offload_optimizer.pipeline_write ? 1 : 0);
  const std::uint64_t per_element = 4 * (1 + r.optimizer_states) + 4 + 2;  // master, states, gradient, 16-bit copy
  const std::uint64_t largest_sg = std::max(r.layout.largest_subgroup(), kAlign);
  const std::uint64_t opt_least_elements = (stages * per_element * kAlign + 4 * opt_count - 1) / (4 * opt_count);
  const std::uint64_t opt_asked_elements = std::max(largest_sg, opt_least_elements);
  if (opt_nvme) {
    opt_pool.least = opt_count * up(4 * opt_least_elements, kPage);
    opt_pool.asked = opt_count * up(4 * opt_asked_elements, kPage);
  }
  // The parameters' pinned pool: buffer_count x buffer_size of the compute dtype (its capacity,
  // which bounds it whether it grows on demand or not).
  Knob param_pool;
  param_pool.name = "the offload_param pinned pool";
  param_pool.pinned = true;
  const std::uint64_t param_count = u64(z.offload_param.buffer_count);
  const std::uint64_t param_least_buffer = up(std::min(kLeastParamBuffer, largest_part * dsize), kPage);
  if (param_nvme) {
    param_pool.least = param_count * param_least_buffer;
    param_pool.asked = std::max(param_pool.least, param_count * up(u64(z.offload_param.buffer_size) * dsize, kPage));
  }
  // offload_param.max_in_cpu: partitions kept in memory beside their NVMe copy (a cache: the last
  // to get memory).
  Knob in_cpu;
  in_cpu.name = "parameters kept in memory (offload_param.max_in_cpu)";
  if (param_nvme) {
    const std::uint64_t elements = std::min(u64(z.offload_param.max_in_cpu), shard);
    in_cpu.asked = elements > 0 ? elements * dsize + kPage * r.layout.params.size() : 0;
  }
  // Gathered parameters (fp32): at the least the largest module's.
  Knob live;
  live.name = "gathered parameters (fp32, stage3_max_live_parameters)";
  live.least_name = fmt::format("the largest module '{}' gathered (fp32)", g.module_name);
  live.least = 4 * g.module_need;
  const std::uint64_t live_asked_elements =
      z.max_live_parameters == 0 ? g.module_need : std::min(u64(z.max_live_parameters), g.non_persistent);
  live.asked = std::max(live.least, 4 * live_asked_elements);
  // Gradient buffers and reduce buckets (fp32): at the least one group at a time.
  Knob grads;
  grads.name = "gradient buffers and reduce buckets (fp32, reduce_bucket_size)";
  grads.least_name = "its gradient buffers (fp32)";
  grads.least = gradient_buffer_bytes(g, 1, world);
  grads.asked = std::max(grads.least, gradient_buffer_bytes(g, std::max<std::uint64_t>(1, u64(z.reduce_bucket_size)), world));

  std::uint64_t fixed_bytes = 0;
  for (const MemoryTerm& t : fixed) fixed_bytes += t.bytes;
  const std::uint64_t least = fixed_bytes + opt_pool.least + param_pool.least + live.least + grads.least;
  const auto usable = static_cast<std::uint64_t>(static_cast<double>(r.budget) * (1.0 - kMarginShare));
  if (least > usable) {
    std::vector<MemoryTerm> named = fixed;
    for (const Knob* k : {&opt_pool, &param_pool, &live, &grads}) named.push_back({k->least_name.empty() ? k->name + " at the least" : k->least_name, k->least, k->pinned});
    const auto need = static_cast<std::uint64_t>(static_cast<double>(least) / (1.0 - kMarginShare)) + 1;
    return Status::resource_exhausted(fmt::format(
        "host memory budget {} is below the {} this run needs at the least ({} of it kept free for allocator slack): "
        "{}; raise the budget (--host-memory-budget, zinf.host_memory_budget), or lower the micro-batch or the "
        "sequence, or move state to NVMe",
        format_bytes(r.budget), format_bytes(need), format_bytes(need - least), biggest_terms(named)));
  }
  std::uint64_t extra = usable - least;
  share({&opt_pool, &param_pool, &live, &grads}, extra);
  for (const Knob* k : {&opt_pool, &param_pool, &live, &grads}) extra -= k->used - k->least;
  in_cpu.used = std::min(in_cpu.asked, extra);

  HostBudgetFit fit;
  fit.ds = r.ds;
  config::ZeroSection& out = fit.ds.zero;
  const auto lowered = [&fit](const std::string& key, std::uint64_t asked, std::uint64_t used, const char* unit) {
    fit.notices.push_back(fmt::format("host memory budget: {} {} {} asked, {} used", key, asked, unit, used));
  };
  if (opt_nvme && opt_pool.used < opt_pool.asked) {
    fit.optimizer_buffer_size = std::max(opt_least_elements, down(opt_pool.used / opt_count, kPage) / 4);
    opt_pool.used = opt_count * up(4 * fit.optimizer_buffer_size, kPage);
    lowered("offload_optimizer pinned buffers (buffer_count x the largest sub-group)", opt_asked_elements,
            fit.optimizer_buffer_size, "fp32 elements each");
  }
  if (param_nvme && param_pool.used < param_pool.asked) {
    const std::uint64_t size = std::max(param_least_buffer, down(param_pool.used / param_count, kPage)) / dsize;
    lowered("offload_param.buffer_size", u64(z.offload_param.buffer_size), size, "elements");
    out.offload_param.buffer_size = static_cast<std::int64_t>(size);
    param_pool.used = param_count * up(size * dsize, kPage);
  }
  if (param_nvme && in_cpu.used < in_cpu.asked) {
    const std::uint64_t overhead = kPage * r.layout.params.size();
    const std::uint64_t elements = in_cpu.used > overhead ? (in_cpu.used - overhead) / dsize : 0;
    lowered("offload_param.max_in_cpu", u64(z.offload_param.max_in_cpu), elements, "elements");
    out.offload_param.max_in_cpu = static_cast<std::int64_t>(elements);
    in_cpu.used = elements > 0 ? elements * dsize + overhead : 0;
  }
  fit.live_bound = live_asked_elements;
  if (live.used < live.asked) {
    const std::uint64_t elements = std::max(g.module_need, live.used / 4);
    lowered("stage3_max_live_parameters", u64(z.max_live_parameters), elements, "elements");
    out.max_live_parameters = static_cast<std::int64_t>(elements);
    fit.live_bound = elements;
  }
  if (u64(out.prefetch_bucket_size) > fit.live_bound && out.max_live_parameters != 0) {
    lowered("stage3_prefetch_bucket_size", u64(out.prefetch_bucket_size), fit.live_bound, "elements");
    out.prefetch_bucket_size = static_cast<std::int64_t>(fit.live_bound);
  }
  if (grads.used < grads.asked) {
    // The largest bucket whose buffers fit (grad_bytes grows with the bucket).
    std::uint64_t lo = 1, hi = std::max<std::uint64_t>(1, u64(z.reduce_bucket_size));
    while (lo < hi) {
      const std::uint64_t mid = lo + (hi - lo + 1) / 2;
      if (gradient_buffer_bytes(g, mid, world) <= grads.used) lo = mid; else hi = mid - 1;
    }
    lowered("reduce_bucket_size", u64(z.reduce_bucket_size), lo, "elements");
    out.reduce_bucket_size = static_cast<std::int64_t>(lo);
    grads.used = gradient_buffer_bytes(g, lo, world);
  }
  fit.terms = fixed;
  for (const Knob* k : {&opt_pool, &param_pool, &in_cpu, &live, &grads}) {
    if (k->used > 0) fit.terms.push_back({k->name, k->used, k->pinned});
  }
  fit.pinned_bound = opt_pool.used + param_pool.used;
  fit.terms.push_back({"margin (allocator slack, thread stacks, aio rings)", r.budget - usable, false});
  return fit;
}

std::uint64_t process_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      std::uint64_t kib = 0;
      in >> kib;
      return kib * 1024;
    }
    std::getline(in, key);
  }
  return 0;
}

}  // namespace zinf::zero3
