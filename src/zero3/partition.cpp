// PartitionPlan: groups of parameters, each split into W contiguous ceil(n/W) slices that lie
// back to back in every rank's flat shard.
#include "zinf/zero3/partition.h"

#include <algorithm>
#include <cassert>
#include <numeric>

#include <fmt/format.h>

namespace zinf::zero3 {

Result<PartitionPlan> PartitionPlan::create(std::span<const std::size_t> numels, int world_size) {
  std::vector<std::size_t> own(numels.size());
  std::iota(own.begin(), own.end(), std::size_t{0});
  return create(numels, own, world_size);
}

Result<PartitionPlan> PartitionPlan::create(std::span<const std::size_t> numels,
                                            std::span<const std::size_t> group_of, int world_size) {
  if (world_size < 1) {
    return Status::invalid_argument(fmt::format("world size {} must be at least 1", world_size));
  }
  if (group_of.size() != numels.size()) {
    return Status::invalid_argument(
        fmt::format("partition groups: {} group indices for {} parameters", group_of.size(), numels.size()));
  }
  PartitionPlan plan;
  plan.world_size_ = world_size;
  const std::size_t groups = numels.empty() ? 0 : *std::max_element(group_of.begin(), group_of.end()) + 1;
  plan.groups_.resize(groups);
  plan.places_.resize(numels.size());
  for (std::size_t p = 0; p < numels.size(); ++p) {
    GroupSlot& g = plan.groups_[group_of[p]];
    plan.places_[p] = ParamPlace{group_of[p], g.numel, numels[p]};
    g.numel += numels[p];
    g.params.push_back(p);
  }
  const auto w = static_cast<std::size_t>(world_size);
  for (std::size_t gi = 0; gi < groups; ++gi) {
    GroupSlot& g = plan.groups_[gi];
    if (g.params.empty()) return Status::invalid_argument(fmt::format("partition group {} has no parameters", gi));
    g.per_rank = (g.numel + w - 1) / w;
    g.shard_offset = plan.shard_numel_;
    plan.shard_numel_ += g.per_rank;
  }
  return plan;
}

ElementRange PartitionPlan::owned_in_group(std::size_t group, int rank) const {
  const GroupSlot& g = groups_[group];
  const std::size_t begin = std::min(g.numel, static_cast<std::size_t>(rank) * g.per_rank);
  return ElementRange{begin, std::min(g.numel, begin + g.per_rank)};
}

ElementRange PartitionPlan::owned(std::size_t param, int rank) const {
  const ParamPlace& pl = places_[param];
  const ElementRange in_group = owned_in_group(pl.group, rank);
  const std::size_t begin = std::clamp(in_group.begin, pl.offset, pl.offset + pl.numel);
  const std::size_t end = std::clamp(in_group.end, begin, pl.offset + pl.numel);
  return ElementRange{begin - pl.offset, end - pl.offset};
}

std::size_t PartitionPlan::slice_offset(std::size_t param, int rank) const {
  const ParamPlace& pl = places_[param];
  const ElementRange in_group = owned_in_group(pl.group, rank);
  return std::clamp(pl.offset, in_group.begin, in_group.end) - in_group.begin;
}

void PartitionPlan::scatter(std::size_t group, std::span<const float> full, int rank, std::span<float> shard) const {
  const GroupSlot& g = groups_[group];
  assert(full.size() == g.numel && shard.size() == shard_numel_);
  const ElementRange r = owned_in_group(group, rank);
  float* dst = shard.data() + g.shard_offset;
  std::copy(full.begin() + static_cast<std::ptrdiff_t>(r.begin), full.begin() + static_cast<std::ptrdiff_t>(r.end),
            dst);
  std::fill(dst + r.size(), dst + g.per_rank, 0.0f);
}

void PartitionPlan::gather(std::size_t group, std::span<const std::span<const float>> shards,
                           std::span<float> full) const {
  const GroupSlot& g = groups_[group];
  assert(full.size() == g.numel && shards.size() == static_cast<std::size_t>(world_size_));
  for (int rank = 0; rank < world_size_; ++rank) {
    const ElementRange r = owned_in_group(group, rank);
    const float* src = shards[static_cast<std::size_t>(rank)].data() + g.shard_offset;
    std::copy(src, src + r.size(), full.begin() + static_cast<std::ptrdiff_t>(r.begin));
  }
}

}  // namespace zinf::zero3
