// Internal: how the engine partitions a model's parameters (one group per module), shared by the
// engine and by checkpoints, which rebuild a saved run's plan from its parameter list.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "zinf/model/model.h"
#include "zinf/status.h"
#include "zinf/swap/partition_layout.h"
#include "zinf/zero3/partition.h"

namespace zinf::zero3 {

// The partition plan the engine uses for a model's parameters on `world_size` ranks: one group per
// module that owns parameters (a module's parameters are gathered by one collective).
Result<PartitionPlan> model_partition_plan(std::span<const model::ParamSpec> params, std::size_t num_modules,
                                           int world_size);
// The partition layout's partitions for that plan: one per group, named after its module.
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

}  // namespace zinf::zero3
