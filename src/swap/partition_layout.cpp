// PartitionLayout: packing parameter partitions into aligned sub-groups.
#include <algorithm>

#include <fmt/format.h>

#include "common/checksum.h"
#include "zinf/swap/partition_layout.h"
#include "zinf/swap/types.h"

namespace zinf::swap {

PartitionLayout PartitionLayout::build(std::vector<ParamPartition> params, std::uint64_t sub_group_size) {
  PartitionLayout l;
  l.sub_group_size = sub_group_size;
  l.params = std::move(params);
  SubGroup open;
  auto close = [&] {
    if (open.param_count == 0) return;
    open.numel = align_up(open.numel, kAlign);
    l.subgroups.push_back(open);
    open = SubGroup{l.params.size(), 0, 0, 0};
  };
  for (std::size_t i = 0; i < l.params.size(); ++i) {
    if (open.param_count == 0) open.first_param = i;
    const std::uint64_t offset = align_up(open.numel, kAlign);
    l.subgroup_of.push_back(l.subgroups.size());
    l.offset_in_subgroup.push_back(offset);
    open.numel = offset + l.params[i].numel;
    open.param_numel += l.params[i].numel;
    ++open.param_count;
    // The reference closes a sub-group once its parameters reach sub_group_size elements.
    if (open.param_numel >= sub_group_size) close();
  }
  close();
  return l;
}

std::uint64_t PartitionLayout::largest_subgroup() const {
  std::uint64_t n = 0;
  for (const SubGroup& g : subgroups) n = std::max(n, g.numel);
  return n;
}

std::string PartitionLayout::fingerprint() const {
  // XXH3 over the partition keys and sizes. Named "xxh3" in the text, so a fingerprint from
  // before (FNV-1a, "hash ...") visibly differs in kind, not just in value.
  Checksum64 h;
  for (const ParamPartition& p : params) {
    h.add(p.key);
    h.add_value(p.numel);
  }
  return fmt::format("{} partitions, {} sub-groups of {}, xxh3 {:016x}", params.size(), subgroups.size(),
                     sub_group_size, h.value());
}

}  // namespace zinf::swap
