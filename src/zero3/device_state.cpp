// The training state in a device's memory (device_state.h).
#include "zero3/device_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "device/ops.h"
#include "zinf/aio/pinned.h"
#include "zinf/optim/half.h"

namespace zinf::zero3 {
namespace {

using device::StreamRole;

// Host <-> device transfers outside the step (initial weights, checkpoints, read_full_param):
// through one pinned buffer in chunks, each waited for, ordered after the compute stream's work
// (a download) or before it (an upload).
class Transfers {
 public:
  static constexpr std::size_t kChunk = std::size_t{32} << 20;  // bytes

  explicit Transfers(device::Device& device) : device_(device) {}

  Status download(void* host, const void* dev, std::size_t bytes, std::string_view what) {
    ZINF_RETURN_IF_ERROR(ensure_staging());
    ZINF_ASSIGN_OR_RETURN(device::Event computed, device_.record(StreamRole::kCompute));
    ZINF_RETURN_IF_ERROR(device_.wait(StreamRole::kD2H, computed));
    for (std::size_t off = 0; off < bytes; off += kChunk) {
      const std::size_t n = std::min(kChunk, bytes - off);
      ZINF_RETURN_IF_ERROR(device_.copy_d2h(staging_.data(), static_cast<const char*>(dev) + off, n, what));
      ZINF_ASSIGN_OR_RETURN(device::Event landed, device_.record(StreamRole::kD2H));
      ZINF_RETURN_IF_ERROR(device_.synchronize(landed).with_context(what));
      std::memcpy(static_cast<char*>(host) + off, staging_.data(), n);
    }
    return Status::ok();
  }

  Status upload(void* dev, const void* host, std::size_t bytes, std::string_view what) {
    ZINF_RETURN_IF_ERROR(ensure_staging());
    // The compute stream's earlier work may still read what this overwrites.
    ZINF_ASSIGN_OR_RETURN(device::Event computed, device_.record(StreamRole::kCompute));
    ZINF_RETURN_IF_ERROR(device_.wait(StreamRole::kH2D, computed));
    for (std::size_t off = 0; off < bytes; off += kChunk) {
      const std::size_t n = std::min(kChunk, bytes - off);
      std::memcpy(staging_.data(), static_cast<const char*>(host) + off, n);
      ZINF_RETURN_IF_ERROR(device_.copy_h2d(static_cast<char*>(dev) + off, staging_.data(), n, what));
      ZINF_ASSIGN_OR_RETURN(device::Event landed, device_.record(StreamRole::kH2D));
      ZINF_RETURN_IF_ERROR(device_.synchronize(landed).with_context(what));  // staging is free again
    }
    ZINF_ASSIGN_OR_RETURN(device::Event uploaded, device_.record(StreamRole::kH2D));
    return device_.wait(StreamRole::kCompute, uploaded);
  }

 private:
  Status ensure_staging() {
    if (staging_.size() >= kChunk) return Status::ok();
    ZINF_ASSIGN_OR_RETURN(staging_, aio::PinnedBuffer::allocate(kChunk));
    return Status::ok();
  }

  device::Device& device_;
  aio::PinnedBuffer staging_;
};

// One array per sub-group of `layout` on `device`, `elem` bytes an element, zeroed.
Result<std::vector<device::DeviceBlock>> allocate_subgroups(device::Device& device, const swap::PartitionLayout& layout,
                                                            std::size_t elem, const std::string& what) {
  std::vector<device::DeviceBlock> out;
  for (std::size_t sg = 0; sg < layout.subgroups.size(); ++sg) {
    const std::size_t bytes = std::max<std::size_t>(layout.subgroups[sg].numel * elem, 1);
    ZINF_ASSIGN_OR_RETURN(device::DeviceBlock b,
                          device.allocate(bytes, StreamRole::kCompute, fmt::format("{}, sub-group {}", what, sg)));
    ZINF_RETURN_IF_ERROR(device.fill_zero(StreamRole::kCompute, b.data(), bytes, what));
    out.push_back(std::move(b));
  }
  return out;
}

class DeviceOptimizerTier final : public OptimizerTier {
 public:
  DeviceOptimizerTier(const swap::PartitionLayout& layout, optim::Optimizer optimizer, device::Device& device)
      : layout_(layout), optimizer_(std::move(optimizer)), device_(device), ops_(*device.ops()), io_(device) {}

  Status allocate() {
    const std::size_t count = 1 + optimizer_.state_count();
    for (std::size_t which = 0; which < count; ++which) {
      const std::string what = which == 0 ? std::string("master weights")
                                          : fmt::format("optimizer state {}", optimizer_.state_name(which - 1));
      ZINF_ASSIGN_OR_RETURN(std::vector<device::DeviceBlock> a, allocate_subgroups(device_, layout_, sizeof(float), what));
      arrays_.push_back(std::move(a));
    }
    return Status::ok();
  }

  std::string describe() const override {
    return fmt::format("{} ({}, fp32 master and states in device memory)", device_.describe(), optimizer_.config().name());
  }
  const optim::Optimizer& optimizer() const override { return optimizer_; }

  Status init_master(const swap::MasterSource& source) override {
    std::vector<float> host;
    for (std::size_t p = 0; p < layout_.params.size(); ++p) {
      const std::size_t numel = layout_.params[p].numel;
      float* dst = array(0, layout_.subgroup_of[p]) + layout_.offset_in_subgroup[p];
      const std::size_t chunk = Transfers::kChunk / sizeof(float);
      for (std::size_t off = 0; off < numel; off += chunk) {
        const std::size_t n = std::min(chunk, numel - off);
        host.resize(n);
        ZINF_RETURN_IF_ERROR(source(p, off, std::span<float>(host.data(), n)));
        ZINF_RETURN_IF_ERROR(io_.upload(dst + off, host.data(), n * sizeof(float), "initial master weights"));
      }
    }
    return Status::ok();
  }

  Status step(const swap::StepArgs& in) override {
    if (in.grads.size() != layout_.subgroups.size()) {
      return Status::internal(fmt::format("device optimizer step with {} gradient views for {} sub-groups",
                                          in.grads.size(), layout_.subgroups.size()));
    }
    for (std::size_t sg = 0; sg < layout_.subgroups.size(); ++sg) {
      const std::size_t n = layout_.subgroups[sg].numel;
      std::vector<std::span<float>> state(optimizer_.state_count());
      for (std::size_t i = 0; i < state.size(); ++i) state[i] = std::span<float>(array(1 + i, sg), n);
      optim::GradView grad = in.grads[sg];
      grad.scale = in.grad_scale;
      optim::HalfCopy copy;
      if (in.sink != nullptr && in.sink->dtype() != swap::DType::kF32) {
        copy = optim::HalfCopy{in.sink->device_subgroup(sg), in.sink->dtype()};
        if (copy.data == nullptr) return Status::internal("device optimizer step: the parameter sink is not on the device");
      }
      ZINF_RETURN_IF_ERROR(ops_.optimizer_step(StreamRole::kCompute, optimizer_, in.ctx, std::span<float>(array(0, sg), n),
                                               state, grad, copy)
                               .with_context(fmt::format("optimizer step on the device, sub-group {}", sg)));
      if (in.sink != nullptr && in.sink->dtype() == swap::DType::kF32) ZINF_RETURN_IF_ERROR(hand_over_f32(sg, *in.sink));
    }
    return Status::ok();
  }

  Status write_param_copies(swap::ParamSink& sink) override {
    for (std::size_t sg = 0; sg < layout_.subgroups.size(); ++sg) {
      if (sink.dtype() == swap::DType::kF32) {
        ZINF_RETURN_IF_ERROR(hand_over_f32(sg, sink));
        continue;
      }
      void* dst = sink.device_subgroup(sg);
      if (dst == nullptr) return Status::internal("device optimizer tier: the parameter sink is not on the device");
      ZINF_RETURN_IF_ERROR(ops_.convert(StreamRole::kCompute, dst, sink.dtype(), array(0, sg), swap::DType::kF32,
                                        layout_.subgroups[sg].numel));
    }
    return Status::ok();
  }

  Status read_state(std::size_t sg, StateArray which, std::span<float> out) override {
    ZINF_RETURN_IF_ERROR(check(sg, which, out.size()));
    return io_.download(out.data(), array(which.position(), sg), out.size_bytes(),
                        fmt::format("optimizer array {} of sub-group {}", which.position(), sg));
  }
  Status load_state(std::size_t sg, StateArray which, std::span<const float> in) override {
    ZINF_RETURN_IF_ERROR(check(sg, which, in.size()));
    return io_.upload(array(which.position(), sg), in.data(), in.size_bytes(),
                      fmt::format("optimizer array {} of sub-group {}", which.position(), sg));
  }
  float* master_on_device(std::size_t sg) override { return sg < layout_.subgroups.size() ? array(0, sg) : nullptr; }
  double io_wait_seconds() const override { return 0.0; }
  std::uint64_t bytes_moved() const override { return 0; }

 private:
  float* array(std::size_t which, std::size_t sg) const { return arrays_[which][sg].as<float>(); }

  Status check(std::size_t sg, StateArray which, std::size_t n) const {
    if (which.position() >= arrays_.size() || sg >= layout_.subgroups.size() || n != layout_.subgroups[sg].numel) {
      return Status::internal(fmt::format("optimizer state {} of sub-group {} with {} elements", which.position(), sg, n));
    }
    return Status::ok();
  }

  // An fp32 sink: nothing when its memory is the master itself, else a device copy.
  Status hand_over_f32(std::size_t sg, swap::ParamSink& sink) {
    void* dst = sink.device_subgroup(sg);
    if (dst == nullptr) return Status::internal("device optimizer tier: the parameter sink is not on the device");
    if (dst == array(0, sg)) return Status::ok();
    return ops_.convert(StreamRole::kCompute, dst, swap::DType::kF32, array(0, sg), swap::DType::kF32,
                        layout_.subgroups[sg].numel);
  }

  const swap::PartitionLayout& layout_;
  optim::Optimizer optimizer_;
  device::Device& device_;
  device::DeviceOps& ops_;
  Transfers io_;
  std::vector<std::vector<device::DeviceBlock>> arrays_;  // [master, states...][sub-group]
};

// The copies in device memory; what the optimizer tier writes (its sink) and the coordinator reads.
class DeviceParamSink final : public swap::ParamSink {
 public:
  DeviceParamSink(std::vector<void*> subgroups, swap::DType dtype) : subgroups_(std::move(subgroups)), dtype_(dtype) {}
  swap::DType dtype() const override { return dtype_; }
  void* host_subgroup(std::size_t) override { return nullptr; }
  Status write(std::size_t sg, std::uint64_t, std::uint64_t, const void*, std::vector<swap::SwapTicket>&) override {
    return Status::internal(fmt::format("sub-group {}'s parameters are in device memory: only a device optimizer tier "
                                        "writes them",
                                        sg));
  }
  void* device_subgroup(std::size_t sg) override { return sg < subgroups_.size() ? subgroups_[sg] : nullptr; }

 private:
  std::vector<void*> subgroups_;
  swap::DType dtype_;
};

class DeviceParamTier final : public ParamTier {
 public:
  DeviceParamTier(const swap::PartitionLayout& layout, swap::DType dtype, device::Device& device)
      : layout_(layout), dtype_(dtype), device_(device), io_(device) {}

  // fp32: the optimizer tier's master weights; 16-bit: arrays of our own.
  Status init(OptimizerTier& optimizer) {
    std::vector<void*> pointers;
    if (dtype_ == swap::DType::kF32) {
      for (std::size_t sg = 0; sg < layout_.subgroups.size(); ++sg) {
        float* m = optimizer.master_on_device(sg);
        if (m == nullptr) return Status::internal("device parameter tier: the optimizer tier's master weights are not on the device");
        pointers.push_back(m);
      }
    } else {
      ZINF_ASSIGN_OR_RETURN(own_, allocate_subgroups(device_, layout_, swap::dtype_size(dtype_), "parameters"));
      for (device::DeviceBlock& b : own_) pointers.push_back(b.data());
    }
    sink_.emplace(std::move(pointers), dtype_);
    return Status::ok();
  }

  swap::DType dtype() const override { return dtype_; }
  std::string describe() const override {
    return fmt::format("{} ({} in device memory)", device_.describe(), swap::dtype_name(dtype_));
  }
  void prefetch(std::size_t) override {}
  void drop_prefetch(std::size_t) override {}
  Status read_f32(std::size_t p, std::span<float> dst) override {
    if (p >= layout_.params.size() || dst.size() != layout_.params[p].numel) {
      return Status::internal(fmt::format("read_f32 of partition {} with {} elements", p, dst.size()));
    }
    const DeviceValues v = device_values(p);
    if (dtype_ == swap::DType::kF32) {
      return io_.download(dst.data(), v.data, dst.size_bytes(), fmt::format("parameter partition {}", p));
    }
    std::vector<std::uint16_t> bits(dst.size());
    ZINF_RETURN_IF_ERROR(io_.download(bits.data(), v.data, bits.size() * sizeof(std::uint16_t),
                                      fmt::format("parameter partition {}", p)));
    for (std::size_t i = 0; i < bits.size(); ++i) {
      dst[i] = dtype_ == swap::DType::kBF16 ? optim::bf16_bits_to_f32(bits[i]) : optim::f16_bits_to_f32(bits[i]);
    }
    return Status::ok();
  }
  DeviceValues device_values(std::size_t p) override {
    if (p >= layout_.params.size()) return {};
    const auto* base = static_cast<const char*>(sink_->device_subgroup(layout_.subgroup_of[p]));
    return {base + layout_.offset_in_subgroup[p] * swap::dtype_size(dtype_), dtype_};
  }
  swap::ParamSink& sink() override { return *sink_; }
  Status flush() override { return Status::ok(); }  // the optimizer's writes are on the compute stream
  double io_wait_seconds() const override { return 0.0; }

 private:
  const swap::PartitionLayout& layout_;
  swap::DType dtype_;
  device::Device& device_;
  Transfers io_;
  std::vector<device::DeviceBlock> own_;
  std::optional<DeviceParamSink> sink_;
};

class DeviceGradStore final : public GradStore {
 public:
  DeviceGradStore(const swap::PartitionLayout& layout, device::Device& device)
      : layout_(layout), device_(device), ops_(*device.ops()) {}

  Status allocate() {
    ZINF_ASSIGN_OR_RETURN(acc_, allocate_subgroups(device_, layout_, sizeof(float), "gradient partitions"));
    return Status::ok();
  }

  Status begin_step() override {
    for (std::size_t sg = 0; sg < acc_.size(); ++sg) {
      ZINF_RETURN_IF_ERROR(device_.fill_zero(StreamRole::kCompute, acc_[sg].data(),
                                             layout_.subgroups[sg].numel * sizeof(float), "gradient partitions"));
    }
    return Status::ok();
  }
  Status accumulate(std::size_t partition, std::span<const float>) override {
    return Status::internal(fmt::format(
        "gradient store: partition {}'s gradient given in host memory, but the store is in device memory", partition));
  }
  bool on_device() const override { return true; }
  Status accumulate_on_device(std::size_t p, const float* in) override {
    if (p >= layout_.params.size()) return Status::internal(fmt::format("gradient store: partition {}", p));
    float* acc = acc_[layout_.subgroup_of[p]].as<float>() + layout_.offset_in_subgroup[p];
    return ops_.add(StreamRole::kCompute, acc, in, layout_.params[p].numel);
  }
  Result<optim::GradStats> stats() override {
    optim::GradStats all;
    for (std::size_t sg = 0; sg < acc_.size(); ++sg) {
      ZINF_ASSIGN_OR_RETURN(optim::GradStats s,
                            ops_.grad_stats(StreamRole::kCompute, acc_[sg].as<float>(), layout_.subgroups[sg].numel));
      all += s;
    }
    return all;
  }
  std::vector<optim::GradView> step_views() const override {
    std::vector<optim::GradView> out;
    for (std::size_t sg = 0; sg < acc_.size(); ++sg) {
      out.push_back(optim::GradView{acc_[sg].data(), optim::DType::kF32, layout_.subgroups[sg].numel, 1.0});
    }
    return out;
  }
  std::uint64_t host_bytes() const override { return 0; }

 private:
  const swap::PartitionLayout& layout_;
  device::Device& device_;
  device::DeviceOps& ops_;
  std::vector<device::DeviceBlock> acc_;
};

Status need_ops(device::Device& device) {
  if (device.ops() == nullptr) {
    return Status::internal(fmt::format("{}: no device arithmetic for a device-resident state", device.describe()));
  }
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<OptimizerTier>> make_device_optimizer_tier(const swap::PartitionLayout& layout,
                                                                  optim::Optimizer optimizer, device::Device& device) {
  ZINF_RETURN_IF_ERROR(need_ops(device));
  if (!device.ops()->steps(optimizer)) {
    return Status::unsupported(
        fmt::format("{}: no {} step on this device", device.describe(), optimizer.config().name()));
  }
  auto tier = std::make_unique<DeviceOptimizerTier>(layout, std::move(optimizer), device);
  ZINF_RETURN_IF_ERROR(tier->allocate().with_context("optimizer state in device memory"));
  return std::unique_ptr<OptimizerTier>(std::move(tier));
}

Result<std::unique_ptr<ParamTier>> make_device_param_tier(const swap::PartitionLayout& layout, swap::DType dtype,
                                                          OptimizerTier& optimizer, device::Device& device) {
  auto tier = std::make_unique<DeviceParamTier>(layout, dtype, device);
  ZINF_RETURN_IF_ERROR(tier->init(optimizer).with_context("parameters in device memory"));
  return std::unique_ptr<ParamTier>(std::move(tier));
}

Result<std::unique_ptr<GradStore>> make_device_grad_store(const swap::PartitionLayout& layout, device::Device& device) {
  ZINF_RETURN_IF_ERROR(need_ops(device));
  auto store = std::make_unique<DeviceGradStore>(layout, device);
  ZINF_RETURN_IF_ERROR(store->allocate().with_context("gradients in device memory"));
  return std::unique_ptr<GradStore>(std::move(store));
}

}  // namespace zinf::zero3
