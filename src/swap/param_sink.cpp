// The parameter sinks of the swap layer: host memory, and the parameter swapper.
#include "zinf/swap/param_sink.h"

#include <cstring>

#include <fmt/format.h>

#include "swap/optimizer_slot.h"
#include "zinf/swap/param_swapper.h"

namespace zinf::swap {

Status HostParamSink::write(std::size_t sg, std::uint64_t first, std::uint64_t count, const void* src,
                            std::vector<SwapTicket>&) {
  if (sg >= subgroups_.size() || subgroups_[sg] == nullptr) {
    return Status::internal(fmt::format("host parameter sink: no memory for sub-group {} ({} sub-groups)", sg,
                                        subgroups_.size()));
  }
  const std::size_t esize = dtype_size(dtype_);
  std::memcpy(static_cast<std::byte*>(subgroups_[sg]) + first * esize, src, count * esize);
  return Status::ok();
}

Result<SwapperParamSink> SwapperParamSink::create(const PartitionLayout& layout, ParamSwapper& swapper) {
  for (const ParamPartition& p : layout.params) {
    Result<TensorInfo> info = swapper.info(p.key);
    if (!info.is_ok() || info->numel != p.numel || info->dtype != swapper.config().dtype) {
      return Status::invalid_argument(fmt::format(
          "partition '{}' ({} elements of {}) is not in the parameter swapper with that size and dtype", p.key,
          p.numel, dtype_name(swapper.config().dtype)));
    }
  }
  return SwapperParamSink(layout, swapper);
}

DType SwapperParamSink::dtype() const { return swapper_->config().dtype; }

// Each partition of sub-group sg that overlaps the range gets one write_range of its part.
Status SwapperParamSink::write(std::size_t sg, std::uint64_t first, std::uint64_t count, const void* src,
                               std::vector<SwapTicket>& pending) {
  if (sg >= layout_->subgroups.size()) {
    return Status::internal(fmt::format("parameter sink: sub-group {} of {}", sg, layout_->subgroups.size()));
  }
  const SubGroup& g = layout_->subgroups[sg];
  const std::size_t esize = dtype_size(dtype());
  for (std::size_t p = g.first_param; p < g.first_param + g.param_count; ++p) {
    const detail::Overlap o = detail::overlap(*layout_, p, first, first + count);
    if (o.empty()) continue;
    const auto* from = static_cast<const std::byte*>(src) + (o.first - first) * esize;
    // Readable to the partition's kAlign-aligned end (the contract on first + count), so an
    // aligned source is written without staging.
    pending.push_back(swapper_->write_range(layout_->params[p].key, o.first - layout_->offset_in_subgroup[p],
                                            o.last - o.first, from, /*src_padded=*/true));
  }
  return Status::ok();
}

}  // namespace zinf::swap
