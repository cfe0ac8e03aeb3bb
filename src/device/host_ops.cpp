// DeviceOps on the host device: the CPU functions as work items on its streams.
#include "device/host_ops.h"

#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <vector>

#include "zinf/optim/half.h"

namespace zinf::device {
namespace {

class HostOps final : public DeviceOps {
 public:
  explicit HostOps(Device& device) : device_(device) {}

  Status add(StreamRole role, float* acc, const float* in, std::size_t n) override {
    if (n == 0) return Status::ok();
    return device_.enqueue(role, [=](const StreamContext&) {
      for (std::size_t i = 0; i < n; ++i) acc[i] += in[i];
      return Status::ok();
    }, "add");
  }

  Status convert(StreamRole role, void* dst, optim::DType dst_dtype, const void* src, optim::DType src_dtype,
                 std::size_t n) override {
    if (n == 0) return Status::ok();
    using optim::DType;
    if (src_dtype != DType::kF32 && dst_dtype != DType::kF32 && src_dtype != dst_dtype) {
      return Status::invalid_argument(fmt::format("convert: {} to {} (one side must be fp32, or both the same)",
                                                  optim::dtype_name(src_dtype), optim::dtype_name(dst_dtype)));
    }
    return device_.enqueue(role, [=](const StreamContext&) {
      if (src_dtype == dst_dtype) {
        std::memcpy(dst, src, n * optim::dtype_size(src_dtype));
      } else if (src_dtype == DType::kF32) {
        const auto* s = static_cast<const float*>(src);
        auto* d = static_cast<std::uint16_t*>(dst);
        for (std::size_t i = 0; i < n; ++i) {
          d[i] = dst_dtype == DType::kBF16 ? optim::f32_to_bf16_bits(s[i]) : optim::f32_to_f16_bits(s[i]);
        }
      } else {
        const auto* s = static_cast<const std::uint16_t*>(src);
        auto* d = static_cast<float*>(dst);
        for (std::size_t i = 0; i < n; ++i) {
          d[i] = src_dtype == DType::kBF16 ? optim::bf16_bits_to_f32(s[i]) : optim::f16_bits_to_f32(s[i]);
        }
      }
      return Status::ok();
    }, "convert");
  }

  Result<optim::GradStats> grad_stats(StreamRole role, const float* x, std::size_t n) override {
    auto out = std::make_shared<Result<optim::GradStats>>(optim::GradStats{});
    ZINF_RETURN_IF_ERROR(device_.enqueue(role, [=](const StreamContext&) {
      *out = optim::grad_stats(optim::GradView{x, optim::DType::kF32, n, 1.0});
      return Status::ok();
    }, "grad_stats"));
    ZINF_ASSIGN_OR_RETURN(Event done, device_.record(role));
    ZINF_RETURN_IF_ERROR(device_.synchronize(done));
    return *out;
  }

  bool steps(const optim::Optimizer&) const override { return true; }

  Status optimizer_step(StreamRole role, const optim::Optimizer& optimizer, const optim::StepContext& ctx,
                        std::span<float> params, std::span<const std::span<float>> state, optim::GradView grad,
                        optim::HalfCopy copy) override {
    std::vector<std::span<float>> states(state.begin(), state.end());
    return device_.enqueue(role, [&optimizer, ctx, params, states = std::move(states), grad, copy](const StreamContext&) {
      return optimizer.step(ctx, params, states, grad, copy);
    }, "optimizer step");
  }

 private:
  Device& device_;
};

}  // namespace

std::unique_ptr<DeviceOps> make_host_ops(Device& device) { return std::make_unique<HostOps>(device); }

}  // namespace zinf::device
