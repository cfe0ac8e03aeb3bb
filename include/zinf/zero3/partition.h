// ZeRO-3 partition math: how parameters are grouped and each group's elements split across W
// ranks into flat shards.
//
// Parameters are partitioned in groups (the engine makes one group of the parameters each
// module owns). A group's parameters lie back to back in one flat array of n elements; that
// array is split into W contiguous slices of c = ceil(n / W): rank r holds group elements
// [r*c, min((r+1)*c, n)), padded with zeros to c. All-gathering the W slices in rank order
// therefore yields the group's flat values, and every parameter of the group is a view at its
// offset into the gathered buffer: one collective per group, no copies. Each rank's shard is
// its group slices back to back in group order, so every rank's shard has the same length and
// the same per-group offsets.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "zinf/status.h"

namespace zinf::zero3 {

struct GroupSlot {
  std::size_t numel = 0;             // elements of the whole group (its parameters back to back)
  std::size_t per_rank = 0;          // c = ceil(numel / W), the slice length on every rank
  std::size_t shard_offset = 0;      // where this group's slice starts in every rank's shard
  std::vector<std::size_t> params;   // its parameters, in flat order (increasing index)
};

struct ParamPlace {
  std::size_t group = 0;
  std::size_t offset = 0;  // where the parameter starts in its group's flat array
  std::size_t numel = 0;
};

struct ElementRange {
  std::size_t begin = 0;  // a flat index (of a parameter or a group)
  std::size_t end = 0;    // exclusive; begin == end when the rank holds none of it
  std::size_t size() const { return end - begin; }
};

class PartitionPlan {
 public:
  // Every parameter its own group. world_size >= 1; parameters may have any size, even 0.
  static Result<PartitionPlan> create(std::span<const std::size_t> numels, int world_size);
  // group_of[p]: parameter p's group; groups are numbered 0 .. G-1 and none may be empty.
  static Result<PartitionPlan> create(std::span<const std::size_t> numels, std::span<const std::size_t> group_of,
                                      int world_size);

  int world_size() const { return world_size_; }
  std::size_t num_params() const { return places_.size(); }
  std::size_t num_groups() const { return groups_.size(); }
  const GroupSlot& group(std::size_t g) const { return groups_[g]; }
  const ParamPlace& place(std::size_t param) const { return places_[param]; }
  // Elements per rank, padding included (the same for every rank).
  std::size_t shard_numel() const { return shard_numel_; }

  // The group elements `rank` holds: [rank*c, min((rank+1)*c, n)).
  ElementRange owned_in_group(std::size_t group, int rank) const;
  // The elements of `param` (its own flat index) that `rank` holds: always one contiguous range.
  ElementRange owned(std::size_t param, int rank) const;
  // Where owned(param, rank).begin sits inside rank's slice of the group (0 .. c).
  std::size_t slice_offset(std::size_t param, int rank) const;

  // Copies rank `rank`'s slice of a full group into its place in `shard`, zero padding.
  void scatter(std::size_t group, std::span<const float> full, int rank, std::span<float> shard) const;
  // Rebuilds a full group from every rank's shard (shards[r] is rank r's shard).
  void gather(std::size_t group, std::span<const std::span<const float>> shards, std::span<float> full) const;

 private:
  int world_size_ = 1;
  std::size_t shard_numel_ = 0;
  std::vector<GroupSlot> groups_;
  std::vector<ParamPlace> places_;
};

}  // namespace zinf::zero3
