// OptimizerLayout: packing parameter partitions into aligned sub-groups.
#include <algorithm>

#include <fmt/format.h>

#include "zinf/swap/optimizer_swapper.h"

namespace zinf::swap {

OptimizerLayout OptimizerLayout::build(std::vector<ParamPartition> params, std::uint64_t sub_group_size) {
  OptimizerLayout l;
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

std::uint64_t OptimizerLayout::largest_subgroup() const {
  std::uint64_t n = 0;
  for (const SubGroup& g : subgroups) n = std::max(n, g.numel);
  return n;
}

std::string OptimizerLayout::fingerprint() const {
  // FNV-1a over the partition keys and sizes.
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* data, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      h ^= static_cast<const unsigned char*>(data)[i];
      h *= 1099511628211ull;
    }
  };
  for (const ParamPartition& p : params) {
    mix(p.key.data(), p.key.size());
    mix(&p.numel, sizeof(p.numel));
  }
  return fmt::format("{} partitions, {} sub-groups of {}, hash {:016x}", params.size(), subgroups.size(),
                     sub_group_size, h);
}

}  // namespace zinf::swap
