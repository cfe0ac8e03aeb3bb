// Optimizer tiers: fp32 master and states in host arrays per sub-group, or the OptimizerSwapper.
#include <cstring>

#include <fmt/format.h>

#include "zero3/tiers.h"
#include "zinf/model/float_buffer.h"
#include "zinf/optim/half.h"

namespace zinf::zero3 {
namespace {

// Master weights and states per sub-group in host memory; the same kernels as the swapper,
// over whole sub-groups, so both tiers give the same bits.
class MemoryOptimizerTier final : public OptimizerTier {
 public:
  MemoryOptimizerTier(const swap::OptimizerLayout& layout, optim::Optimizer optimizer, optim::ExecOptions exec)
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
        std::memset(b.data(), 0, sg.numel * sizeof(float));
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

  Status step(const swap::StepInputs& in) override {
    if (in.grads.size() != layout_.subgroups.size()) {
      return Status::internal(fmt::format("{} gradient views for {} sub-groups", in.grads.size(), layout_.subgroups.size()));
    }
    std::vector<std::span<float>> state(optimizer_.state_count());
    for (std::size_t sg = 0; sg < layout_.subgroups.size(); ++sg) {
      for (std::size_t i = 0; i < state.size(); ++i) state[i] = arrays_[1 + i][sg].span();
      optim::GradView grad = in.grads[sg];
      grad.scale = in.grad_scale;
      optim::HalfCopy copy;
      if (!in.param_copies.empty()) copy = optim::HalfCopy{in.param_copies[sg], in.copy_dtype};
      if (in.param_swapper != nullptr) copy = optim::HalfCopy{staging(sg), in.param_swapper->config().dtype};
      ZINF_RETURN_IF_ERROR(optimizer_.step(in.ctx, arrays_[0][sg].span(), state, grad, copy, exec_)
                               .with_context(fmt::format("optimizer step, sub-group {}", sg)));
      if (in.param_swapper != nullptr) ZINF_RETURN_IF_ERROR(swap_out_copies(sg, *in.param_swapper));
    }
    return Status::ok();
  }

  Status write_param_copies(const swap::StepInputs& outputs) override {
    for (std::size_t sg = 0; sg < layout_.subgroups.size(); ++sg) {
      if (!outputs.param_copies.empty()) {
        ZINF_RETURN_IF_ERROR(optim::convert_from_f32(arrays_[0][sg].span(), outputs.param_copies[sg],
                                                     outputs.copy_dtype, exec_));
      }
      if (outputs.param_swapper != nullptr) {
        ZINF_RETURN_IF_ERROR(optim::convert_from_f32(arrays_[0][sg].span(), staging(sg),
                                                     outputs.param_swapper->config().dtype, exec_));
        ZINF_RETURN_IF_ERROR(swap_out_copies(sg, *outputs.param_swapper));
      }
    }
    return Status::ok();
  }

  Status read_state(std::size_t sg, std::size_t which, std::span<float> out) override {
    ZINF_RETURN_IF_ERROR(check(sg, which, out.size()));
    std::memcpy(out.data(), arrays_[which][sg].data(), out.size_bytes());
    return Status::ok();
  }
  Status load_state(std::size_t sg, std::size_t which, std::span<const float> in) override {
    ZINF_RETURN_IF_ERROR(check(sg, which, in.size()));
    std::memcpy(arrays_[which][sg].data(), in.data(), in.size_bytes());
    return Status::ok();
  }
  float* master_in_memory(std::size_t sg) override { return arrays_[0][sg].data(); }
  double io_wait_seconds() const override { return 0.0; }
  std::uint64_t bytes_moved() const override { return 0; }

 private:
  Status check(std::size_t sg, std::size_t which, std::size_t n) const {
    if (which >= arrays_.size() || sg >= layout_.subgroups.size() || n != layout_.subgroups[sg].numel) {
      return Status::internal(fmt::format("optimizer state {} of sub-group {} with {} elements", which, sg, n));
    }
    return Status::ok();
  }
  // A 16-bit copy of one sub-group, for parameters that live in the parameter swap store.
  void* staging(std::size_t sg) {
    staging_.resize(layout_.subgroups[sg].numel);
    return staging_.data();
  }
  // Writes sub-group sg's partitions from the staging copy to the parameter swapper.
  Status swap_out_copies(std::size_t sg, swap::ParamSwapper& swapper) {
    const swap::SubGroup& g = layout_.subgroups[sg];
    std::vector<swap::SwapTicket> tickets;
    for (std::size_t p = g.first_param; p < g.first_param + g.param_count; ++p) {
      tickets.push_back(swapper.write(layout_.params[p].key, staging_.data() + layout_.offset_in_subgroup[p]));
    }
    Status first;
    for (const swap::SwapTicket& t : tickets) {
      Status s = t.wait();
      if (first.is_ok()) first = s;
    }
    return first;
  }

  const swap::OptimizerLayout& layout_;
  optim::Optimizer optimizer_;
  optim::ExecOptions exec_;
  std::vector<std::vector<model::FloatBuffer>> arrays_;  // [which][sub-group]
  std::vector<std::uint16_t> staging_;
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
  Status step(const swap::StepInputs& in) override {
    Status s = swapper_->step(in);
    account();
    return s;
  }
  Status write_param_copies(const swap::StepInputs& outputs) override {
    return swapper_->write_param_copies(outputs);
  }
  Status read_state(std::size_t sg, std::size_t which, std::span<float> out) override {
    return swapper_->read_state(sg, which, out);
  }
  Status load_state(std::size_t sg, std::size_t which, std::span<const float> in) override {
    return swapper_->load_state(sg, which, in);
  }
  double io_wait_seconds() const override { return io_wait_; }
  std::uint64_t bytes_moved() const override { return bytes_; }

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

Result<std::unique_ptr<OptimizerTier>> make_memory_optimizer_tier(const swap::OptimizerLayout& layout,
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
