// The partition layout: this rank's parameter partitions packed, in order, into sub-groups that
// close once they hold sub_group_size elements (a partition is never split). In a sub-group every
// partition starts at a multiple of PartitionLayout::kAlign elements (the gap is zero padding),
// so every transfer is 4 KiB aligned. Parameter copies, gradients, the optimizer's master weights
// and states, and checkpoints all use this layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zinf::swap {

struct ParamPartition {
  std::string key;  // the parameter swapper's key for it: the partition group's module, e.g. "h.3.attn"
  std::uint64_t numel = 0;
};

struct SubGroup {
  std::size_t first_param = 0;
  std::size_t param_count = 0;
  std::uint64_t numel = 0;       // flat length with padding (a multiple of kAlign)
  std::uint64_t param_numel = 0; // elements of its partitions
};

// Packs parameter partitions into aligned sub-groups: the one layout of parameter partitions,
// gradients, 16-bit copies, optimizer state and checkpoints.
struct PartitionLayout {
  static constexpr std::uint64_t kAlign = 2048;  // elements: 4 KiB of 16-bit values

  std::vector<ParamPartition> params;
  std::vector<std::size_t> subgroup_of;  // per partition
  std::vector<std::uint64_t> offset_in_subgroup;  // per partition, a multiple of kAlign
  std::vector<SubGroup> subgroups;
  std::uint64_t sub_group_size = 0;

  static PartitionLayout build(std::vector<ParamPartition> params, std::uint64_t sub_group_size);
  std::uint64_t largest_subgroup() const;
  // Changes when partitions, sizes or sub_group_size do (stored to refuse a mismatched reopen).
  std::string fingerprint() const;
};

}  // namespace zinf::swap
