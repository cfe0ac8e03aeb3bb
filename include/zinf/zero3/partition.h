// ZeRO-3 partition math: how each parameter's elements are split across W ranks into flat shards.
//
// As in the reference (and its consolidation script): a parameter of n elements owns
// c = ceil(n / W) elements on every rank; rank r holds elements [r*c, min((r+1)*c, n)),
// padded with zeros to c. Each rank's flat shard is these slices back to back in parameter
// order, so every rank's shard has the same length and the same per-parameter offsets.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "zinf/status.h"

namespace zinf::zero3 {

struct ParamSlot {
  std::size_t numel = 0;         // elements of the full parameter
  std::size_t per_rank = 0;      // c = ceil(numel / W), the slice length on every rank
  std::size_t shard_offset = 0;  // where this parameter's slice starts in every rank's shard
};

struct ElementRange {
  std::size_t begin = 0;  // in the full parameter's flat index
  std::size_t end = 0;    // exclusive; begin == end when the rank holds only padding
  std::size_t size() const { return end - begin; }
};

class PartitionPlan {
 public:
  // world_size >= 1. Parameters may have any size, including 0 elements.
  static Result<PartitionPlan> create(std::span<const std::size_t> numels, int world_size);

  int world_size() const { return world_size_; }
  std::size_t num_params() const { return slots_.size(); }
  const ParamSlot& slot(std::size_t param) const { return slots_[param]; }
  // Elements per rank, padding included (the same for every rank).
  std::size_t shard_numel() const { return shard_numel_; }
  // The real (unpadded) elements of `param` that `rank` holds.
  ElementRange owned(std::size_t param, int rank) const;

  // Copies rank `rank`'s slice of a full parameter into its place in `shard`, zero padding.
  void scatter(std::size_t param, std::span<const float> full, int rank, std::span<float> shard) const;
  // Rebuilds a full parameter from every rank's shard (shards[r] is rank r's shard).
  void gather(std::size_t param, std::span<const std::span<const float>> shards, std::span<float> full) const;

 private:
  int world_size_ = 1;
  std::size_t shard_numel_ = 0;
  std::vector<ParamSlot> slots_;
};

}  // namespace zinf::zero3
