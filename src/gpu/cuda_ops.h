// Internal: DeviceOps (device/ops.h) on a CUDA GPU: kernels with the CPU's operation order, so a
// training state on the GPU steps to the host path's bits (the norm's blocks and lanes as
// optim/kernels_scalar.cpp sums them, gpu/adam.h's step). Adam and AdamW only.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>

#include "device/ops.h"

namespace zinf::gpu {

// `native_stream(role)` gives the cudaStream_t of each role of the device the ops belong to;
// `device` is its CUDA ordinal.
std::unique_ptr<device::DeviceOps> make_cuda_ops(int device, std::function<cudaStream_t(device::StreamRole)> native_stream);


}  // namespace zinf::gpu
