// The host-memory budget: the run's fixed host memory, each knob's least and asked bytes, and the
// knobs lowered to fit (host_budget.h).
#include "zero3/host_budget.h"

#include <algorithm>
#include <fstream>
#include <numeric>
#include <set>

#include <fmt/format.h>

#include "zero3/grad_store.h"
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
  // The bf16 weight copies are a knob (make_knobs), not part of this term.
  t.push_back({fmt::format("activations for {} x {}", r.B, r.T),
               r.model.activation_bytes(r.B, r.T) - r.model.weight_copy_bytes(), false});
  if (opt_nvme) {
    t.push_back({"the gradient store's buffer (fp32; the gradients are on NVMe)",
                 swapped_gradient_buffer_bytes(r.layout), true});
    t.push_back({"the gradient store's small partitions (fp32, in memory)", swapped_gradient_held_bytes(r.layout), false});
  } else {
    t.push_back({"fp32 gradient partitions", 4 * shard, false});
    t.push_back({fmt::format("optimizer state in memory (master + {} states, fp32)", r.optimizer_states),
                 4 * (1 + r.optimizer_states) * shard, false});
    if (r.overlap_optimizer) {
      // early_step.h: a snapshot of each sub-group stepped during backward, kept for reuse.
      t.push_back({"the early optimizer step's snapshots (--overlap-optimizer)", 4 * (1 + r.optimizer_states) * shard, false});
    }
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

std::uint64_t gradient_buffer_elements(const GatheredSizes& g, std::uint64_t bucket, int world) {
  // In use or kept, the bucket plus the group that crosses it; one rank flushes each gradient as
  // soon as it is complete, so at most one of each size besides the one being filled is needed.
  std::uint64_t grads = std::min(g.total, std::min(bucket, g.total) + g.largest);
  if (world == 1) grads = std::min(grads, g.distinct + g.largest);
  return grads;
}

std::uint64_t gradient_buffer_bytes(const GatheredSizes& g, std::uint64_t bucket, int world) {
  // Several ranks add the bucket's packing buffer and the reduce-scatter's 1/W output.
  const std::uint64_t b = std::min(bucket, g.total);
  const std::uint64_t buckets = world > 1 ? b + b / static_cast<std::uint64_t>(world) : 0;
  return 4 * (gradient_buffer_elements(g, bucket, world) + buckets);
}

std::uint64_t HostBudgetFit::total() const {
  return std::accumulate(terms.begin(), terms.end(), std::uint64_t{0},
                         [](std::uint64_t s, const MemoryTerm& t) { return s + t.bytes; });
}

namespace {

// The knobs a budget sizes, with what their sizing needs to turn bytes back into config values.
struct Knobs {
  Knob opt_pool, param_pool, in_cpu, live, grads, weight_copies;
  std::uint64_t opt_count = 1, opt_least_elements = 0, opt_asked_elements = 0;
  std::uint64_t param_count = 1, param_least_buffer = 0, dsize = 2;
  std::uint64_t live_asked_elements = 0;
};

Knobs make_knobs(const HostBudgetRequest& r, const GatheredSizes& g, std::uint64_t shard) {
  const config::ZeroSection& z = r.ds.zero;
  const int world = static_cast<int>(r.ds.world_size);
  Knobs k;
  k.dsize = swap::dtype_size(run_dtype(r.ds));
  std::uint64_t largest_part = 0;
  for (const swap::ParamPartition& p : r.layout.params) largest_part = std::max(largest_part, p.numel);
  // The optimizer's pinned pool: buffer_count buffers of the largest sub-group (optimizer_swapper.cpp,
  // plan_tiles); at the least one tile of kAlign elements per pipeline stage.
  k.opt_pool.name = "the offload_optimizer pinned pool";
  k.opt_pool.pinned = true;
  k.opt_count = std::max<std::uint64_t>(1, u64(z.offload_optimizer.buffer_count));
  const std::uint64_t stages = 1 + (z.offload_optimizer.pipeline_read ? 1 : 0) + (z.offload_optimizer.pipeline_write ? 1 : 0);
  const std::uint64_t per_element = 4 * (1 + r.optimizer_states) + 4 + 2;  // master, states, gradient, 16-bit copy
  k.opt_least_elements = (stages * per_element * kAlign + 4 * k.opt_count - 1) / (4 * k.opt_count);
  k.opt_asked_elements = std::max(std::max(r.layout.largest_subgroup(), kAlign), k.opt_least_elements);
  if (z.offload_optimizer.device == config::OffloadDevice::kNvme) {
    k.opt_pool.least = k.opt_count * up(4 * k.opt_least_elements, kPage);
    k.opt_pool.asked = k.opt_count * up(4 * k.opt_asked_elements, kPage);
  }
  // The parameters' pinned pool: buffer_count x buffer_size of the compute dtype (its capacity,
  // which bounds it whether it grows on demand or not). max_in_cpu: partitions kept in memory
  // beside their NVMe copy (a cache: the last to get memory).
  k.param_pool.name = "the offload_param pinned pool";
  k.param_pool.pinned = true;
  k.param_count = std::max<std::uint64_t>(1, u64(z.offload_param.buffer_count));
  k.param_least_buffer = up(std::min(kLeastParamBuffer, largest_part * k.dsize), kPage);
  k.in_cpu.name = "parameters kept in memory (offload_param.max_in_cpu)";
  if (z.offload_param.device == config::OffloadDevice::kNvme) {
    k.param_pool.least = k.param_count * k.param_least_buffer;
    // Buffers larger than the largest partition hold nothing more (every partition fits one
    // either way), so a budget asks for no more than that.
    k.param_pool.asked = std::max(
        k.param_pool.least,
        k.param_count * up(std::min(u64(z.offload_param.buffer_size), largest_part) * k.dsize, kPage));
    const std::uint64_t elements = std::min(u64(z.offload_param.max_in_cpu), shard);
    k.in_cpu.asked = elements > 0 ? elements * k.dsize + kPage * r.layout.params.size() : 0;
  }
  // Gathered parameters (fp32): at the least the largest module's.
  k.live.name = "gathered parameters (fp32, stage3_max_live_parameters)";
  k.live.least_name = fmt::format("the largest module '{}' gathered (fp32)", g.module_name);
  k.live.least = 4 * g.module_need;
  k.live_asked_elements =
      z.max_live_parameters == 0 ? g.module_need : std::min(u64(z.max_live_parameters), g.non_persistent);
  k.live.asked = std::max(k.live.least, 4 * k.live_asked_elements);
  // Gradient buffers and reduce buckets (fp32): at the least one group at a time.
  k.grads.name = "gradient buffers and reduce buckets (fp32, reduce_bucket_size)";
  k.grads.least_name = "the largest module's gradient buffers (fp32)";
  k.grads.least = gradient_buffer_bytes(g, 1, world);
  k.grads.asked =
      std::max(k.grads.least, gradient_buffer_bytes(g, std::max<std::uint64_t>(1, u64(z.reduce_bucket_size)), world));
  // The model's bf16 copies of its weights (Model::weight_copy_bytes): speed, 2 bytes a parameter
  // of the products' matrices; without them each product rounds its weight again.
  k.weight_copies.name = "the bf16 weight copies of the products";
  k.weight_copies.asked = r.model.weight_copy_bytes();
  return k;
}

// Turns the knobs' bytes into config values where they are below what was asked (one notice
// each), and their bytes into what those values hold.
void lower_keys(const HostBudgetRequest& r, const GatheredSizes& g, Knobs& k, HostBudgetFit& fit) {
  const config::ZeroSection& z = r.ds.zero;
  const int world = static_cast<int>(r.ds.world_size);
  config::ZeroSection& out = fit.ds.zero;
  const auto lowered = [&fit](const std::string& key, std::uint64_t asked, std::uint64_t used, const char* unit) {
    fit.notices.push_back(fmt::format("host memory budget: {} {} {} asked, {} used", key, asked, unit, used));
  };
  if (k.opt_pool.used < k.opt_pool.asked) {
    fit.optimizer_buffer_size = std::max(k.opt_least_elements, down(k.opt_pool.used / k.opt_count, kPage) / 4);
    k.opt_pool.used = k.opt_count * up(4 * fit.optimizer_buffer_size, kPage);
    lowered("offload_optimizer pinned buffers (buffer_count x the largest sub-group)", k.opt_asked_elements,
            fit.optimizer_buffer_size, "fp32 elements each");
  }
  if (k.param_pool.asked > 0) {
    const std::uint64_t size = std::min(
        u64(z.offload_param.buffer_size),
        std::max(k.param_least_buffer, down(k.param_pool.used / k.param_count, kPage)) / k.dsize);
    if (size < u64(z.offload_param.buffer_size)) {
      lowered("offload_param.buffer_size", u64(z.offload_param.buffer_size), size, "elements");
      out.offload_param.buffer_size = static_cast<std::int64_t>(size);
    }
    k.param_pool.used = k.param_count * up(size * k.dsize, kPage);
  }
  if (k.in_cpu.used < k.in_cpu.asked) {
    const std::uint64_t overhead = kPage * r.layout.params.size();
    const std::uint64_t elements = k.in_cpu.used > overhead ? (k.in_cpu.used - overhead) / k.dsize : 0;
    lowered("offload_param.max_in_cpu", u64(z.offload_param.max_in_cpu), elements, "elements");
    out.offload_param.max_in_cpu = static_cast<std::int64_t>(elements);
    k.in_cpu.used = elements > 0 ? elements * k.dsize + overhead : 0;
  }
  fit.live_bound = k.live_asked_elements;
  if (k.live.used < k.live.asked) {
    const std::uint64_t elements = std::max(g.module_need, k.live.used / 4);
    lowered("stage3_max_live_parameters", u64(z.max_live_parameters), elements, "elements");
    out.max_live_parameters = static_cast<std::int64_t>(elements);
    fit.live_bound = elements;
    // Prefetch depth: what is prefetched is held live, so it stays within the limit.
    if (u64(out.prefetch_bucket_size) > elements) {
      lowered("stage3_prefetch_bucket_size", u64(out.prefetch_bucket_size), elements, "elements");
      out.prefetch_bucket_size = static_cast<std::int64_t>(elements);
    }
  }
  if (k.weight_copies.used < k.weight_copies.asked) {
    fit.weight_copy_bytes = k.weight_copies.used;
    fit.notices.push_back(fmt::format(
        "host memory budget: bf16 weight copies {} asked, {} kept (the products round the other weights each time)",
        format_bytes(k.weight_copies.asked), format_bytes(k.weight_copies.used)));
  }
  if (k.grads.used < k.grads.asked) {
    // The largest bucket whose buffers fit (gradient_buffer_bytes grows with the bucket).
    std::uint64_t lo = 1, hi = std::max<std::uint64_t>(1, u64(z.reduce_bucket_size));
    while (lo < hi) {
      const std::uint64_t mid = lo + (hi - lo + 1) / 2;
      if (gradient_buffer_bytes(g, mid, world) <= k.grads.used) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    lowered("reduce_bucket_size", u64(z.reduce_bucket_size), lo, "elements");
    out.reduce_bucket_size = static_cast<std::int64_t>(lo);
    k.grads.used = gradient_buffer_bytes(g, lo, world);
  }
}

}  // namespace

namespace {

// What every budget needs: the fixed terms, the knobs, and their least.
struct Sizing {
  GatheredSizes g;
  std::vector<MemoryTerm> fixed;
  Knobs k;
  std::uint64_t least = 0;  // the fixed terms plus each knob at its least
  std::vector<Knob*> shared() { return {&k.opt_pool, &k.param_pool, &k.live, &k.grads, &k.weight_copies}; }
};

Sizing size_run(const HostBudgetRequest& r) {
  std::uint64_t shard = 0;
  for (const swap::SubGroup& sg : r.layout.subgroups) shard += sg.numel;
  Sizing s;
  s.g = gathered_sizes(r.model, r.plan, r.ds.zero, static_cast<int>(r.ds.world_size));
  s.fixed = fixed_terms(r, s.g, shard);
  s.k = make_knobs(r, s.g, shard);
  for (const MemoryTerm& t : s.fixed) s.least += t.bytes;
  for (const Knob* knob : s.shared()) s.least += knob->least;
  return s;
}

std::uint64_t with_margin(std::uint64_t least) {
  return static_cast<std::uint64_t>(static_cast<double>(least) / (1.0 - kMarginShare)) + 1;
}

}  // namespace

std::uint64_t host_budget_least_bytes(const HostBudgetRequest& r) { return with_margin(size_run(r).least); }

Result<HostBudgetFit> fit_host_budget(const HostBudgetRequest& r) {
  Sizing s = size_run(r);
  const GatheredSizes& g = s.g;
  const std::vector<MemoryTerm>& fixed = s.fixed;
  Knobs& k = s.k;
  const std::vector<Knob*> shared = s.shared();
  const std::uint64_t least = s.least;
  const auto usable = static_cast<std::uint64_t>(static_cast<double>(r.budget) * (1.0 - kMarginShare));
  if (least > usable) {
    std::vector<MemoryTerm> named = fixed;
    for (const Knob* knob : shared) {
      named.push_back({knob->least_name.empty() ? knob->name + " at the least" : knob->least_name, knob->least, knob->pinned});
    }
    const std::uint64_t need = with_margin(least);
    return Status::resource_exhausted(fmt::format(
        "host memory budget {} is below the {} this run needs at the least ({} of it kept free for allocator slack): "
        "{}; raise the budget (--host-memory-budget, zinf.host_memory_budget), or lower the micro-batch or the "
        "sequence, or move state to NVMe",
        format_bytes(r.budget), format_bytes(need), format_bytes(need - least), biggest_terms(named)));
  }
  std::uint64_t extra = usable - least;
  share(shared, extra);
  for (const Knob* knob : shared) extra -= knob->used - knob->least;
  k.in_cpu.used = std::min(k.in_cpu.asked, extra);

  HostBudgetFit fit;
  fit.ds = r.ds;
  lower_keys(r, g, k, fit);
  fit.terms = fixed;
  for (const Knob* knob : {&k.opt_pool, &k.param_pool, &k.in_cpu, &k.live, &k.grads, &k.weight_copies}) {
    if (knob->used > 0) fit.terms.push_back({knob->name, knob->used, knob->pinned});
  }
  fit.pinned_bound = k.opt_pool.used + k.param_pool.used;
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
