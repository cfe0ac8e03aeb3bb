// Optimizer tiers: fp32 master and states in host arrays per sub-group, or the OptimizerSwapper.
#include <cstring>

#include <fmt/format.h>

#include "zero3/tiers.h"
#include "zinf/model/float_buffer.h"
#include "zinf/optim/half.h"
#include "zinf/thread_pool.h"

namespace zinf::zero3 {
namespace {

// Master weights and states per sub-group in host memory; the same kernels as the swapper,
// over whole sub-groups, so both tiers give the same bits.
class MemoryOptimizerTier final : public OptimizerTier {
 public:
  MemoryOptimizerTier(const swap::PartitionLayout& layout, optim::Optimizer optimizer, optim::ExecOptions exec)
      : layout_(layout), optimizer_(std::move(optimizer)), exec_(exec) {}

  Status allocate() {
    const std::size_t count = 1 + optimizer_.state_count();
    arrays_.resize(count);
    for (std::size_t which = 0; which < count; ++which) {
      for (const swap::SubGroup& sg : layout_.subgroups) {
        model::FloatBuffer b = model::FloatBuffer::allocate(sg.numel);
        if (b.data() == nullptr && sg.numel > 0) {
          return Status::resource_exhausted(
              fmt::format("optimizer state in memory: cannot allocate {} fp32 elements", sg.numel));
        }
        zero_fill(b.data(), sg.numel * sizeof(float));
        arrays_[which].push_back(std::move(b));
      }
    }
    return Status::ok();
  }

  std::string describe() const override { return fmt::format("memory ({})", optimizer_.config().name()); }
  const optim::Optimizer& optimizer() const override { return optimizer_; }

  Status init_master(const swap::MasterSource& source) override {
    for (std::size_t p = 0; p < layout_.params.size(); ++p) {
      float* dst = arrays_[0][layout_.subgroup_of[p]].data() + layout_.offset_in_subgroup[p];
      ZINF_RETURN_IF_ERROR(source(p, 0, std::span<float>(dst, layout_.params[p].numel)));
    }
    return Status::ok();
  }

  Status step(const swap::StepArgs& in) override {
    for (std::size_t sg = 0; sg < layout_.subgroups.size(); ++sg) ZINF_RETURN_IF_ERROR(step_subgroup(in, sg));
    return Status::ok();
  }

  bool steps_subgroups() const override { return true; }

  Status step_subgroup(const swap::StepArgs& in, std::size_t sg) override {
    if (in.grads.size() != layout_.subgroups.size() || sg >= layout_.subgroups.size()) {
      return Status::internal(fmt::format("step of sub-group {} with {} gradient views for {} sub-groups", sg,
                                          in.grads.size(), layout_.subgroups.size()));
    }
    std::vector<std::span<float>> state(optimizer_.state_count());
    for (std::size_t i = 0; i < state.size(); ++i) state[i] = arrays_[1 + i][sg].span();
    optim::GradView grad = in.grads[sg];
    grad.scale = in.grad_scale;
    // 16-bit copies come out of the kernel, into the sink's memory or staging for its write().
    optim::HalfCopy copy;
    if (in.sink != nullptr && in.sink->dtype() != swap::DType::kF32) {
      void* host = in.sink->host_subgroup(sg);
      copy = optim::HalfCopy{host != nullptr ? host : staging(sg), in.sink->dtype()};
    }
    ZINF_RETURN_IF_ERROR(optimizer_.step(in.ctx, arrays_[0][sg].span(), state, grad, copy, exec_)
                             .with_context(fmt::format("optimizer step, sub-group {}", sg)));
    if (in.sink != nullptr) ZINF_RETURN_IF_ERROR(hand_over(sg, *in.sink, /*converted=*/true));
    return Status::ok();
  }

  Status snapshot(std::size_t sg) override {
    if (snapshots_.empty()) snapshots_.resize(layout_.subgroups.size());
    std::vector<model::FloatBuffer>& copy = snapshots_.at(sg);
    copy.resize(arrays_.size());
    for (std::size_t which = 0; which < arrays_.size(); ++which) {
      const model::FloatBuffer& from = arrays_[which][sg];
      if (copy[which].size() != from.size()) copy[which] = model::FloatBuffer::allocate(from.size());
      if (copy[which].data() == nullptr && from.size() > 0) {
        return Status::resource_exhausted(fmt::format(
            "early optimizer step: cannot allocate {} fp32 elements to keep sub-group {}'s state", from.size(), sg));
      }
      std::memcpy(copy[which].data(), from.data(), from.size() * sizeof(float));
    }
    return Status::ok();
  }

  Status restore(std::size_t sg) override {
    if (sg >= snapshots_.size() || snapshots_[sg].size() != arrays_.size()) {
      return Status::internal(fmt::format("restore of sub-group {} without a snapshot", sg));
    }
    for (std::size_t which = 0; which < arrays_.size(); ++which) {
      std::memcpy(arrays_[which][sg].data(), snapshots_[sg][which].data(), arrays_[which][sg].size() * sizeof(float));
    }
    return Status::ok();
  }

  Status write_param_copies(swap::ParamSink& sink) override {
    for (std::size_t sg = 0; sg < layout_.subgroups.size(); ++sg) {
      ZINF_RETURN_IF_ERROR(hand_over(sg, sink, /*converted=*/false));
    }
    return Status::ok();
  }

  Status read_state(std::size_t sg, StateArray array, std::span<float> out) override {
    ZINF_RETURN_IF_ERROR(check(sg, array, out.size()));
    std::memcpy(out.data(), arrays_[array.position()][sg].data(), out.size_bytes());
    return Status::ok();
  }
  Status load_state(std::size_t sg, StateArray array, std::span<const float> in) override {
    ZINF_RETURN_IF_ERROR(check(sg, array, in.size()));
    std::memcpy(arrays_[array.position()][sg].data(), in.data(), in.size_bytes());
    return Status::ok();
  }
  float* master_in_memory(std::size_t sg) override { return arrays_[0][sg].data(); }
  double io_wait_seconds() const override { return 0.0; }
  std::uint64_t bytes_moved() const override { return 0; }

 private:
  Status check(std::size_t sg, StateArray array, std::size_t n) const {
    if (array.position() >= arrays_.size() || sg >= layout_.subgroups.size() || n != layout_.subgroups[sg].numel) {
      return Status::internal(
          fmt::format("optimizer state {} of sub-group {} with {} elements", array.position(), sg, n));
    }
    return Status::ok();
  }
  // A 16-bit copy of one sub-group, for a sink without host memory.
  void* staging(std::size_t sg) {
    staging_.resize(layout_.subgroups[sg].numel);
    return staging_.data();
  }
  // Gives sub-group sg's updated copy to the sink. converted: the step's kernel already wrote
  // the 16-bit copy (into the sink's memory or staging). fp32 copies are the master weights:
  // copied into host memory unless that memory is the master itself, else written from it.
  Status hand_over(std::size_t sg, swap::ParamSink& sink, bool converted) {
    const std::span<const float> master = arrays_[0][sg].span();
    void* host = sink.host_subgroup(sg);
    const void* src = master.data();
    if (sink.dtype() == swap::DType::kF32) {
      if (host != nullptr) {
        if (host != master.data()) std::memcpy(host, master.data(), master.size_bytes());
        return Status::ok();
      }
    } else {
      if (!converted) {
        ZINF_RETURN_IF_ERROR(optim::convert_from_f32(master, host != nullptr ? host : staging(sg), sink.dtype(), exec_));
      }
      if (host != nullptr) return Status::ok();
      src = staging_.data();
    }
    std::vector<swap::SwapTicket> tickets;
    Status first = sink.write(sg, 0, layout_.subgroups[sg].numel, src, tickets);
    for (const swap::SwapTicket& t : tickets) {
      Status s = t.wait();  // every write is waited for before the source may change
      if (first.is_ok()) first = s;
    }
    return first;
  }

  const swap::PartitionLayout& layout_;
  optim::Optimizer optimizer_;
  optim::ExecOptions exec_;
  std::vector<std::vector<model::FloatBuffer>> arrays_;  // [which][sub-group]
  std::vector<std::uint16_t> staging_;
  std::vector<std::vector<model::FloatBuffer>> snapshots_;  // [sub-group][which], kept for reuse
};

class NvmeOptimizerTier final : public OptimizerTier {
 public:
  explicit NvmeOptimizerTier(std::unique_ptr<swap::OptimizerSwapper> swapper) : swapper_(std::move(swapper)) {}

  std::string describe() const override {
    const auto& c = swapper_->config();
    return fmt::format("nvme ({}, pipeline_read {}, pipeline_write {}, tile {} elements)",
                       swapper_->optimizer().config().name(), c.pipeline_read, c.pipeline_write,
                       swapper_->tile_elements());
  }
  const optim::Optimizer& optimizer() const override { return swapper_->optimizer(); }
  Status init_master(const swap::MasterSource& source) override { return swapper_->init_master(source); }
  Status read_ahead() override { return swapper_->read_ahead(); }
  Status step(const swap::StepArgs& in) override {
    Status s = swapper_->step(in);
    account();
    return s;
  }
  Status write_param_copies(swap::ParamSink& sink) override { return swapper_->write_param_copies(sink); }
  Status read_state(std::size_t sg, StateArray array, std::span<float> out) override {
    return swapper_->read_state(sg, array.position(), out);
  }
  Status load_state(std::size_t sg, StateArray array, std::span<const float> in) override {
    return swapper_->load_state(sg, array.position(), in);
  }
  double io_wait_seconds() const override { return io_wait_; }
  std::uint64_t bytes_moved() const override { return bytes_; }
  PinnedUse pinned_use() const override { return pinned_use_of(swapper_->pool()); }
  swap::OptimizerSwapper* swapper() override { return swapper_.get(); }

 private:
  void account() {
    const swap::StepStats& s = swapper_->last_stats();
    io_wait_ += s.read_wait_seconds + s.write_wait_seconds;
    bytes_ += s.bytes_read + s.bytes_written;
  }
  std::unique_ptr<swap::OptimizerSwapper> swapper_;
  double io_wait_ = 0.0;
  std::uint64_t bytes_ = 0;
};

}  // namespace

Status OptimizerTier::step_subgroup(const swap::StepArgs&, std::size_t) {
  return Status::unsupported(fmt::format("{}: no early steps of single sub-groups", describe()));
}
Status OptimizerTier::snapshot(std::size_t) {
  return Status::unsupported(fmt::format("{}: no sub-group snapshots", describe()));
}
Status OptimizerTier::restore(std::size_t) {
  return Status::unsupported(fmt::format("{}: no sub-group snapshots", describe()));
}

Result<std::unique_ptr<OptimizerTier>> make_memory_optimizer_tier(const swap::PartitionLayout& layout,
                                                                  optim::Optimizer optimizer,
                                                                  const optim::ExecOptions& exec) {
  auto tier = std::make_unique<MemoryOptimizerTier>(layout, std::move(optimizer), exec);
  ZINF_RETURN_IF_ERROR(tier->allocate());
  return std::unique_ptr<OptimizerTier>(std::move(tier));
}

Result<std::unique_ptr<OptimizerTier>> make_nvme_optimizer_tier(const swap::OptimizerSwapConfig& config,
                                                                std::vector<swap::ParamPartition> partitions,
                                                                optim::Optimizer optimizer, aio::Handle& handle,
                                                                swap::OpenMode mode) {
  ZINF_ASSIGN_OR_RETURN(auto swapper,
                        swap::OptimizerSwapper::create(config, std::move(partitions), std::move(optimizer), handle, mode));
  return std::unique_ptr<OptimizerTier>(std::make_unique<NvmeOptimizerTier>(std::move(swapper)));
}

}  // namespace zinf::zero3
