// The host gather target: aligned host blocks, filled by the tier's fp32 read and a host all-gather.
#include "zero3/gather_target.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "zero3/grad_store.h"

namespace zinf::zero3 {
namespace {

class HostGatherTarget final : public GatherTarget {
 public:
  std::string_view name() const override { return "host"; }

  GatherBlock allocate(std::size_t n) override {
    if (n == 0) return {};
    constexpr std::size_t kAlignment = 64;
    const std::size_t bytes = (n * sizeof(float) + kAlignment - 1) / kAlignment * kAlignment;
    auto* p = static_cast<float*>(std::aligned_alloc(kAlignment, bytes));
    if (p == nullptr) return {};
    return adopt(p, n);
  }

  Status gather(ParamTier& tier, std::size_t group, std::size_t per_rank, Communicator& comm,
                GatherBlock& block) override {
    const std::span<float> full = block.span();
    const std::span<float> mine = full.subspan(per_rank * static_cast<std::size_t>(comm.rank()), per_rank);
    ZINF_RETURN_IF_ERROR(tier.read_f32(group, mine));
    return comm.all_gather(mine, full);
  }

  Status zero(GatherBlock& block) override {
    if (block.size() > 0) std::memset(block.data(), 0, block.size() * sizeof(float));
    return Status::ok();
  }

 protected:
  void free(float* data, std::size_t) override { std::free(data); }
};

}  // namespace

Result<std::uint64_t> GatherTarget::start_download(const GatherBlock&, std::size_t, std::size_t) {
  return Status::internal(fmt::format("the {} gather target has no gradient downloads: its memory is read in place",
                                      name()));
}
Result<std::span<const float>> GatherTarget::finish_download(std::uint64_t, bool) {
  return Status::internal(fmt::format("the {} gather target has no gradient downloads", name()));
}
void GatherTarget::release_download(std::uint64_t) {}
Status GatherTarget::add(GatherBlock& acc, const GatherBlock& in) {
  if (in.size() < acc.size()) {
    return Status::internal(fmt::format("{} gather target: adding {} elements into {}", name(), in.size(), acc.size()));
  }
  add_into(acc.data(), std::span<const float>(in.data(), acc.size()));
  return Status::ok();
}

Status GatherTarget::reduce_scatter(GatherBlock&, std::size_t) {
  return Status::internal(fmt::format("the {} gather target does not reduce gradients: the communicator does", name()));
}

std::unique_ptr<GatherTarget> make_host_gather_target() { return std::make_unique<HostGatherTarget>(); }

}  // namespace zinf::zero3
