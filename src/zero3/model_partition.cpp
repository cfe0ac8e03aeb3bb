// The engine's partition of a model: one group per module that owns parameters.
#include "zero3/model_partition.h"

namespace zinf::zero3 {

Result<PartitionPlan> model_partition_plan(std::span<const model::ParamSpec> params, std::size_t num_modules,
                                           int world_size) {
  std::vector<std::size_t> numels, group_of;
  std::vector<int> group_of_module(num_modules, -1);
  int groups = 0;
  for (const model::ParamSpec& p : params) {
    int& g = group_of_module[static_cast<std::size_t>(p.module)];
    if (g < 0) g = groups++;
    numels.push_back(p.numel);
    group_of.push_back(static_cast<std::size_t>(g));
  }
  return PartitionPlan::create(numels, group_of, world_size);
}

std::vector<swap::ParamPartition> layout_partitions(std::span<const model::ParamSpec> params,
                                                    std::span<const model::ModuleSpec> modules,
                                                    const PartitionPlan& plan) {
  std::vector<swap::ParamPartition> partitions;
  for (std::size_t g = 0; g < plan.num_groups(); ++g) {
    const model::ParamSpec& first = params[plan.group(g).params.front()];
    partitions.push_back({modules[static_cast<std::size_t>(first.module)].name, plan.group(g).per_rank});
  }
  return partitions;
}

}  // namespace zinf::zero3
