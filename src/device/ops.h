// Internal: the arithmetic the engine runs on a device's memory when the training state lives
// there (offload none on a device: zero3/device_state.h): gradient accumulation, the gradient
// norm, the optimizer step, and copies with dtype conversion. Each call enqueues on a stream of
// the device it belongs to (Device::ops()), in that stream's order, as the device's other work.
//
// Two implementations, bit for bit the CPU's arithmetic: the host device's runs the CPU
// functions themselves (optim::grad_stats, optim::Optimizer::step) as work items; the CUDA one
// (gpu/cuda_ops.h) runs kernels that follow the same operation order (optim/kernels_scalar.cpp:
// the norm's 8192-element blocks of 16 lanes; gpu/adam.h). So a run whose state lives on a
// device gives the same bits as the host path for the same gradients.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include "device/device.h"
#include "zinf/optim/grad_stats.h"
#include "zinf/optim/optimizer.h"
#include "zinf/status.h"

namespace zinf::device {

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;

  // acc[i] += in[i] for i < n (device memory, fp32).
  virtual Status add(StreamRole role, float* acc, const float* in, std::size_t n) = 0;
  // dst[i] = src[i] converted from src_dtype to dst_dtype for i < n (device memory): a copy when
  // the dtypes are equal; fp32 -> bf16/fp16 rounds to nearest even as optim/half.h does.
  virtual Status convert(StreamRole role, void* dst, optim::DType dst_dtype, const void* src, optim::DType src_dtype,
                         std::size_t n) = 0;
  // optim::grad_stats of x[0, n) (fp32 device memory), bit for bit: enqueued on `role`, then the
  // calling thread waits for that stream and reads the result.
  virtual Result<optim::GradStats> grad_stats(StreamRole role, const float* x, std::size_t n) = 0;
  // Whether optimizer_step runs `optimizer` (the CUDA ops: Adam and AdamW).
  virtual bool steps(const optim::Optimizer& optimizer) const = 0;
  // optimizer.step over device arrays: params and each state (n elements), grad.data (device,
  // grad.size == n), copy.data (device, or null). Same checks and messages.
  virtual Status optimizer_step(StreamRole role, const optim::Optimizer& optimizer, const optim::StepContext& ctx,
                                std::span<float> params, std::span<const std::span<float>> state,
                                optim::GradView grad, optim::HalfCopy copy) = 0;
};

}  // namespace zinf::device
