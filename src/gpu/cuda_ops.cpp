// DeviceOps on a CUDA GPU (cuda_ops.h).
#include "gpu/cuda_ops.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <utility>
#include <variant>

#include "gpu/adam.h"
#include "gpu/cuda_error.h"
#include "gpu/cuda_ops_kernels.h"
#include "gpu/device.h"

namespace zinf::gpu {
namespace {

using device::StreamRole;
using optim::DType;

class CudaOps final : public device::DeviceOps {
 public:
  CudaOps(int device, std::function<cudaStream_t(StreamRole)> native) : device_(device), native_(std::move(native)) {}
  ~CudaOps() override {
    if (scratch_ != nullptr) (void)cudaFree(scratch_);
    if (result_ != nullptr) (void)cudaFreeHost(result_);
  }

  Status add(StreamRole role, float* acc, const float* in, std::size_t n) override {
    if (n == 0) return Status::ok();
    ZINF_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::enter(device_));
    return launch_add(acc, in, n, native_(role));
  }

  Status convert(StreamRole role, void* dst, DType dst_dtype, const void* src, DType src_dtype,
                 std::size_t n) override {
    if (n == 0) return Status::ok();
    ZINF_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::enter(device_));
    const cudaStream_t s = native_(role);
    if (src_dtype == dst_dtype) {
      ZINF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n * optim::dtype_size(src_dtype), cudaMemcpyDeviceToDevice, s),
                                fmt::format("device copy of {} {} elements", n, optim::dtype_name(src_dtype)));
      return Status::ok();
    }
    return launch_convert(dst, dst_dtype, src, src_dtype, n, s);
  }

  Result<optim::GradStats> grad_stats(StreamRole role, const float* x, std::size_t n) override {
    optim::GradStats stats;
    stats.elements = n;
    if (n == 0) return stats;
    ZINF_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::enter(device_));
    const cudaStream_t s = native_(role);
    const std::size_t blocks = norm_blocks(n);
    ZINF_RETURN_IF_ERROR(reserve(blocks));
    ZINF_RETURN_IF_ERROR(launch_sq_norm(x, n, scratch_, s));
    ZINF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(result_, scratch_ + blocks, sizeof(double), cudaMemcpyDeviceToHost, s),
                              "the gradient norm's D2H copy");
    ZINF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s), "waiting for the gradient norm");
    stats.sq_norm = *result_;
    return stats;
  }

  bool steps(const optim::Optimizer& optimizer) const override {
    return optimizer.config().kind() == optim::OptimizerKind::kAdam;
  }

  Status optimizer_step(StreamRole role, const optim::Optimizer& optimizer, const optim::StepContext& ctx,
                        std::span<float> params, std::span<const std::span<float>> state, optim::GradView grad,
                        optim::HalfCopy copy) override {
    if (!steps(optimizer)) {
      return Status::unsupported(fmt::format("GPU {}: the {} step runs on the CPU only (the GPU has Adam and AdamW)",
                                             device_, optimizer.config().name()));
    }
    if (state.size() != 2 || state[0].size() != params.size() || state[1].size() != params.size() ||
        grad.size != params.size()) {
      return Status::invalid_argument(fmt::format("Adam step on GPU {}: {} parameters, {} states, {} gradients",
                                                  device_, params.size(), state.size(), grad.size));
    }
    optim::AdamParams hp = std::get<optim::AdamParams>(optimizer.config().params);
    hp.lr = ctx.lr.value_or(hp.lr);
    hp.beta1 = ctx.beta1.value_or(hp.beta1);
    AdamArrays a;
    a.params = params.data();
    a.exp_avg = state[0].data();
    a.exp_avg_sq = state[1].data();
    a.grad = grad.data;
    a.grad_dtype = grad.dtype;
    a.copy = copy.data;
    a.copy_dtype = copy.dtype;
    a.n = params.size();
    ZINF_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::enter(device_));
    return adam_step(hp, ctx.step, grad.scale, a, native_(role));
  }

 private:
  // Device scratch for `blocks` block sums and the folded sum, and the pinned result slot.
  Status reserve(std::size_t blocks) {
    if (result_ == nullptr) {
      ZINF_CUDA_RETURN_IF_ERROR(cudaMallocHost(reinterpret_cast<void**>(&result_), sizeof(double)),
                                "the gradient norm's pinned result");
    }
    if (blocks + 1 <= scratch_n_) return Status::ok();
    if (scratch_ != nullptr) {
      ZINF_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "before growing the norm scratch");
      ZINF_CUDA_RETURN_IF_ERROR(cudaFree(scratch_), "the old norm scratch");
      scratch_ = nullptr;
    }
    ZINF_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&scratch_), (blocks + 1) * sizeof(double)),
                              fmt::format("the gradient norm's scratch ({} blocks)", blocks));
    scratch_n_ = blocks + 1;
    return Status::ok();
  }

  int device_;
  std::function<cudaStream_t(StreamRole)> native_;
  double* scratch_ = nullptr;
  std::size_t scratch_n_ = 0;
  double* result_ = nullptr;
};

}  // namespace

std::unique_ptr<device::DeviceOps> make_cuda_ops(int device, std::function<cudaStream_t(StreamRole)> native_stream) {
  return std::make_unique<CudaOps>(device, std::move(native_stream));
}

}  // namespace zinf::gpu
