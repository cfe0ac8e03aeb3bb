// Internal: the host-memory budget (EngineOptions::host_memory_budget): what a run holds whatever
// its knobs, what each knob's memory takes at the least and as ds_config asks, and the knobs
// lowered so that the whole fits the budget (docs/zero3.md, "The host-memory budget").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zinf/config/ds_config.h"
#include "zinf/model/model.h"
#include "zinf/status.h"
#include "zinf/swap/partition_layout.h"
#include "zinf/zero3/partition.h"
#include "zinf/zero3/plan.h"

namespace zinf::zero3 {

// Gathered (fp32, W * ceil(n / W) a group) element counts of a model under the coordinator's
// persistence rule (coordinator.cpp: groups whose parameters are all at most
// param_persistence_threshold, first come first served up to model_persistence_threshold).
struct GatheredSizes {
  std::uint64_t persistent = 0, non_persistent = 0;
  std::uint64_t largest = 0;   // the largest non-persistent group
  std::uint64_t total = 0;     // every group
  std::uint64_t distinct = 0;  // the non-persistent groups' sizes, each size once
  std::uint64_t module_need = 0;  // the most non-persistent elements one module gathers
  std::string module_name;        // that module
};
GatheredSizes gathered_sizes(const model::Model& model, const PartitionPlan& plan, const config::ZeroSection& zero,
                             int world);
// Elements of the coordinator's gathered-size gradient buffers, in use or kept for reuse, with
// reduce_bucket_size `bucket`: the bound the coordinator keeps them under.
std::uint64_t gradient_buffer_elements(const GatheredSizes& g, std::uint64_t bucket, int world);
// Bytes of those buffers and, with several ranks, the reduce-scatter's buffers.
std::uint64_t gradient_buffer_bytes(const GatheredSizes& g, std::uint64_t bucket, int world);

struct HostBudgetRequest {
  const model::Model& model;
  const config::DsConfig& ds;
  const PartitionPlan& plan;
  const swap::PartitionLayout& layout;
  std::size_t optimizer_states = 2;  // optim::Optimizer::state_count()
  int B = 1, T = 1;                  // the micro-batch the activations are sized for
  std::uint64_t budget = 0;          // bytes the process may hold
  std::uint64_t in_use = 0;          // bytes the process holds now (its RSS)
  bool overlap_optimizer = false;    // EngineOptions::overlap_optimizer (snapshots of the state)
};

struct HostBudgetFit {
  config::DsConfig ds;  // the request's, with the knobs lowered where they did not fit
  // fp32 elements per offload_optimizer pool buffer (OptimizerSwapConfig::buffer_size); 0: the
  // largest sub-group, as without a budget.
  std::uint64_t optimizer_buffer_size = 0;
  std::vector<MemoryTerm> terms;       // the run's host memory at the values used, margin included
  std::vector<std::string> notices;    // one per key lowered: the key, the value asked, the value used
  std::uint64_t pinned_bound = 0;      // both NVMe pools together hold at most this many bytes
  std::uint64_t live_bound = 0;        // gathered non-persistent elements at most
  // The model's bf16 weight copies at most (Model::limit_weight_copies); UINT64_MAX: all it asks.
  std::uint64_t weight_copy_bytes = UINT64_MAX;
  std::uint64_t total() const;
};

// Sizes the knobs from the budget; a budget below what the run needs at the least is
// ResourceExhausted naming the budget, that least and its largest terms.
Result<HostBudgetFit> fit_host_budget(const HostBudgetRequest& request);
// The smallest budget fit_host_budget accepts for this request (its margin included).
std::uint64_t host_budget_least_bytes(const HostBudgetRequest& request);

// The calling process's resident memory now (VmRSS), 0 where /proc does not say.
std::uint64_t process_rss_bytes();

}  // namespace zinf::zero3
