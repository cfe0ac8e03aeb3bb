// Parameter tiers: host arrays per sub-group (device none/cpu) or the ParamSwapper (nvme).
#include <chrono>
#include <mutex>
#include <optional>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>

#include "zero3/tiers.h"
#include "zinf/aio/pinned.h"
#include "zinf/optim/half.h"

namespace zinf::zero3 {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One host buffer per sub-group, in the padded layout, of the compute dtype.
class MemoryParamTier final : public ParamTier {
 public:
  MemoryParamTier(const swap::PartitionLayout& layout, swap::DType dtype)
      : layout_(layout), dtype_(dtype), sink_({}, dtype) {}

  // Pinned (page-locked where RLIMIT_MEMLOCK allows, huge-page backed, pre-faulted) whatever
  // pin_memory says: the partitions are read at every gather, so they should never page out.
  // An fp32 tier over memory master weights reads them in place (no copy, no publish).
  void alias(OptimizerTier& optimizer) {
    for (std::size_t sg = 0; sg < layout_.subgroups.size(); ++sg) pointers_.push_back(optimizer.master_in_memory(sg));
    aliased_ = true;
    sink_ = swap::HostParamSink(pointers_, dtype_);
  }

  Status allocate() {
    for (const swap::SubGroup& sg : layout_.subgroups) {
      ZINF_ASSIGN_OR_RETURN(aio::PinnedBuffer b, aio::PinnedBuffer::allocate(sg.numel * swap::dtype_size(dtype_), 64));
      buffers_.push_back(std::move(b));
      pointers_.push_back(buffers_.back().data());
    }
    sink_ = swap::HostParamSink(pointers_, dtype_);
    return Status::ok();
  }

  swap::DType dtype() const override { return dtype_; }
  std::string describe() const override {
    return fmt::format("memory ({}{})", swap::dtype_name(dtype_), aliased_ ? ", the optimizer's master weights" : "");
  }
  void prefetch(std::size_t) override {}
  void drop_prefetch(std::size_t) override {}

  HostValues pinned_values(std::size_t partition) override {
    if (aliased_ || partition >= layout_.params.size()) return {};  // the master weights are not pinned
    const std::size_t sg = layout_.subgroup_of[partition];
    return {static_cast<const std::byte*>(pointers_[sg]) + layout_.offset_in_subgroup[partition] * swap::dtype_size(dtype_),
            dtype_};
  }

  Status read_f32(std::size_t partition, std::span<float> dst) override {
    const std::size_t sg = layout_.subgroup_of[partition];
    const std::byte* src = static_cast<const std::byte*>(pointers_[sg]) +
                           layout_.offset_in_subgroup[partition] * swap::dtype_size(dtype_);
    return optim::convert_to_f32(src, dtype_, dst);
  }

  swap::ParamSink& sink() override { return sink_; }
  Status flush() override { return Status::ok(); }
  double io_wait_seconds() const override { return 0.0; }

 private:
  const swap::PartitionLayout& layout_;
  swap::DType dtype_;
  std::vector<aio::PinnedBuffer> buffers_;
  std::vector<void*> pointers_;
  bool aliased_ = false;
  swap::HostParamSink sink_;  // over pointers_
};

// Partitions in the parameter swap store, keyed by PartitionLayout::params[i].key (the partition
// group's module name), staged through the swapper's pool.
class NvmeParamTier final : public ParamTier {
 public:
  NvmeParamTier(const swap::PartitionLayout& layout, std::unique_ptr<swap::ParamSwapper> swapper)
      : layout_(layout), swapper_(std::move(swapper)) {}

  Status declare() {
    for (const swap::ParamPartition& p : layout_.params) ZINF_RETURN_IF_ERROR(swapper_->add(p.key, p.numel));
    ZINF_ASSIGN_OR_RETURN(swap::SwapperParamSink sink, swap::SwapperParamSink::create(layout_, *swapper_));
    sink_.emplace(std::move(sink));
    return Status::ok();
  }

  swap::DType dtype() const override { return swapper_->config().dtype; }
  std::string describe() const override {
    return fmt::format("nvme ({}, {} x {} elements staging, max_in_cpu {})", swap::dtype_name(dtype()),
                       swapper_->config().buffer_count, swapper_->config().buffer_size, swapper_->config().max_in_cpu);
  }

  // Only partitions that fit one staging buffer are staged ahead; larger ones stream at use.
  // At most buffer_count - 1 are staged at once (one buffer stays for streaming), so every
  // staged copy fits in the pool together: a prefetch never waits for memory that only a
  // later prefetch's consumer would free (which would deadlock the reader of the earlier one).
  void prefetch(std::size_t partition) override {
    const swap::ParamSwapConfig& c = swapper_->config();
    if (layout_.params[partition].numel > c.buffer_size) return;
    std::lock_guard lock(mutex_);
    if (staged_.size() + 1 >= c.buffer_count) return;
    if (staged_.insert(partition).second) (void)swapper_->fetch(layout_.params[partition].key);
  }

  void drop_prefetch(std::size_t partition) override {
    std::lock_guard lock(mutex_);
    if (staged_.erase(partition) > 0) (void)swapper_->release(layout_.params[partition].key).wait();
  }

  Status read_f32(std::size_t partition, std::span<float> dst) override {
    const std::string& key = layout_.params[partition].key;
    bool staged = false;
    {
      std::lock_guard lock(mutex_);
      staged = staged_.erase(partition) > 0;
    }
    const auto t0 = Clock::now();
    if (!staged) {
      // Stream through the pool's chunks, converting each as it lands.
      const swap::DType dt = dtype();
      Status s = swapper_->fetch_into(key, [&](std::uint64_t offset, std::span<const std::byte> bytes) {
                             const std::size_t first = offset / swap::dtype_size(dt);
                             const std::size_t n = bytes.size() / swap::dtype_size(dt);
                             return optim::convert_to_f32(bytes.data(), dt, dst.subspan(first, n));
                           }).wait();
      io_wait_ += since(t0);
      return s;
    }
    auto view = swapper_->get(key);
    io_wait_ += since(t0);
    if (!view.is_ok()) return view.status();
    Status s = optim::convert_to_f32(view->data(), dtype(), dst);
    view->reset();
    Status r = swapper_->release(key).wait();
    return s.is_ok() ? r : s;
  }

  // The optimizer writes the partitions as it steps (fp32 ones from its master weights).
  swap::ParamSink& sink() override { return *sink_; }
  Status flush() override { return swapper_->flush(); }
  double io_wait_seconds() const override { return io_wait_; }
  swap::ParamSwapper* nvme_swapper() override { return swapper_.get(); }
  PinnedUse pinned_use() const override { return pinned_use_of(swapper_->pool()); }

 private:
  const swap::PartitionLayout& layout_;
  std::unique_ptr<swap::ParamSwapper> swapper_;
  std::mutex mutex_;
  std::unordered_set<std::size_t> staged_;  // prefetched, not yet read
  double io_wait_ = 0.0;
  std::optional<swap::SwapperParamSink> sink_;  // set by declare()
};

}  // namespace

Result<std::unique_ptr<ParamTier>> make_memory_param_tier(const swap::PartitionLayout& layout, swap::DType dtype,
                                                          OptimizerTier* optimizer) {
  auto tier = std::make_unique<MemoryParamTier>(layout, dtype);
  const bool in_place = dtype == swap::DType::kF32 && optimizer != nullptr && !layout.subgroups.empty() &&
                        optimizer->master_in_memory(0) != nullptr;
  if (in_place) {
    tier->alias(*optimizer);
    return std::unique_ptr<ParamTier>(std::move(tier));
  }
  ZINF_RETURN_IF_ERROR(tier->allocate().with_context("parameter partitions in memory"));
  return std::unique_ptr<ParamTier>(std::move(tier));
}

Result<std::unique_ptr<ParamTier>> make_nvme_param_tier(const swap::PartitionLayout& layout,
                                                        const swap::ParamSwapConfig& config, aio::Handle& handle) {
  ZINF_ASSIGN_OR_RETURN(auto swapper, swap::ParamSwapper::create(config, handle));
  auto tier = std::make_unique<NvmeParamTier>(layout, std::move(swapper));
  ZINF_RETURN_IF_ERROR(tier->declare().with_context("parameter swap store"));
  return std::unique_ptr<ParamTier>(std::move(tier));
}

}  // namespace zinf::zero3
