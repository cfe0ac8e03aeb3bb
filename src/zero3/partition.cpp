// PartitionPlan: per-parameter ceil(n/W) slices laid back to back in each rank's flat shard.
#include "zinf/zero3/partition.h"

#include <algorithm>
#include <cassert>

#include <fmt/format.h>

namespace zinf::zero3 {

Result<PartitionPlan> PartitionPlan::create(std::span<const std::size_t> numels, int world_size) {
  if (world_size < 1) {
    return Status::invalid_argument(fmt::format("world size {} must be at least 1", world_size));
  }
  PartitionPlan plan;
  plan.world_size_ = world_size;
  plan.slots_.reserve(numels.size());
  const auto w = static_cast<std::size_t>(world_size);
  for (std::size_t n : numels) {
    const std::size_t per_rank = (n + w - 1) / w;
    plan.slots_.push_back(ParamSlot{n, per_rank, plan.shard_numel_});
    plan.shard_numel_ += per_rank;
  }
  return plan;
}

ElementRange PartitionPlan::owned(std::size_t param, int rank) const {
  const ParamSlot& s = slots_[param];
  const std::size_t begin = std::min(s.numel, static_cast<std::size_t>(rank) * s.per_rank);
  const std::size_t end = std::min(s.numel, begin + s.per_rank);
  return ElementRange{begin, end};
}

void PartitionPlan::scatter(std::size_t param, std::span<const float> full, int rank,
                            std::span<float> shard) const {
  const ParamSlot& s = slots_[param];
  assert(full.size() == s.numel && shard.size() == shard_numel_);
  const ElementRange r = owned(param, rank);
  float* dst = shard.data() + s.shard_offset;
  std::copy(full.begin() + static_cast<std::ptrdiff_t>(r.begin),
            full.begin() + static_cast<std::ptrdiff_t>(r.end), dst);
  std::fill(dst + r.size(), dst + s.per_rank, 0.0f);
}

void PartitionPlan::gather(std::size_t param, std::span<const std::span<const float>> shards,
                           std::span<float> full) const {
  const ParamSlot& s = slots_[param];
  assert(full.size() == s.numel && shards.size() == static_cast<std::size_t>(world_size_));
  for (int rank = 0; rank < world_size_; ++rank) {
    const ElementRange r = owned(param, rank);
    const float* src = shards[static_cast<std::size_t>(rank)].data() + s.shard_offset;
    std::copy(src, src + r.size(), full.begin() + static_cast<std::ptrdiff_t>(r.begin));
  }
}

}  // namespace zinf::zero3
