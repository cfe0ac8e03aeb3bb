// Internal: the engine's state, shared by engine.cpp and checkpoint.cpp.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "zero3/coordinator.h"
#include "zero3/tiers.h"
#include "zinf/aio/handle.h"
#include "zinf/model/float_buffer.h"
#include "zinf/optim/loss_scaler.h"
#include "zinf/optim/lr_schedule.h"
#include "zinf/swap/optimizer_swapper.h"
#include "zinf/zero3/engine.h"
#include "zinf/zero3/partition.h"

namespace zinf::zero3 {

// The partition plan the engine uses for a model's parameters on `world_size` ranks: one group per
// module that owns parameters (a module's parameters are gathered by one collective).
Result<PartitionPlan> model_partition_plan(std::span<const model::ParamSpec> params, std::size_t num_modules,
                                           int world_size);
// The optimizer layout's partitions for that plan: one per group, named after its module.
std::vector<swap::ParamPartition> layout_partitions(std::span<const model::ParamSpec> params,
                                                    std::span<const model::ModuleSpec> modules,
                                                    const PartitionPlan& plan);

// Calls fn(param, first element of param, count, position in out) for the pieces of `out`
// that hold real parameter values, where `out` is elements [offset, offset + out.size()) of
// `rank`'s slice of `group`. Elements it does not name are padding.
template <typename Fn>
Status for_each_param_piece(const PartitionPlan& plan, std::size_t group, int rank, std::uint64_t offset,
                            std::size_t count, Fn&& fn) {
  const GroupSlot& g = plan.group(group);
  const std::size_t begin = static_cast<std::size_t>(rank) * g.per_rank + offset;  // group flat index
  const std::size_t end = std::min(begin + count, g.numel);
  for (std::size_t p : g.params) {
    const ParamPlace& pl = plan.place(p);
    const std::size_t lo = std::max(begin, pl.offset), hi = std::min(end, pl.offset + pl.numel);
    if (lo < hi) ZINF_RETURN_IF_ERROR(fn(p, lo - pl.offset, hi - lo, lo - begin));
  }
  return Status::ok();
}

struct Engine::Impl {
  static Result<std::unique_ptr<Impl>> build(std::unique_ptr<model::Model> model, const EngineOptions& options,
                                             Communicator& comm);

  Status init();
  Status init_master_weights();
  Status publish_params();
  Result<StepReport> train_step(std::span<const MicroBatch> micro_batches);
  void sync_scaler_counters();
  // Bytes of this rank's checkpoint file (checkpoint.cpp's layout).
  std::uint64_t rank_file_bytes(std::size_t optimizer_states) const;

  EngineOptions options;
  Communicator& comm;
  std::unique_ptr<model::Model> model;
  swap::DType dtype;
  PartitionPlan plan;
  swap::PartitionLayout layout;
  double base_lr = 0;
  std::unique_ptr<optim::LrSchedule> schedule;
  std::optional<optim::LossScaler> scaler;
  std::unique_ptr<aio::Handle> handle;
  std::unique_ptr<OptimizerTier> optimizer;
  std::unique_ptr<ParamTier> params;  // after optimizer: may read its master weights in place
  std::unique_ptr<GatherTarget> gather;  // where the coordinator gathers; outlives it
  std::unique_ptr<GradStore> grads;  // fp32 gradient partitions (memory or the optimizer's swap)
  std::unique_ptr<Coordinator> coordinator;
  EngineCounters counters;

 private:
  Impl(std::unique_ptr<model::Model> model, const EngineOptions& options, Communicator& comm);
};

}  // namespace zinf::zero3
