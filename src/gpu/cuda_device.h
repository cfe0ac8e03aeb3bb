// Internal: the CUDA implementation of the device interface (device/device.h): a compute stream,
// the copy engine's H2D and D2H streams, cudaEvents, and the caching allocator on cudaMalloc.
#pragma once

#include <cstddef>
#include <memory>

#include "device/device.h"
#include "zinf/status.h"

namespace zinf::gpu {

struct CudaDeviceOptions {
  int device = 0;               // CUDA ordinal
  std::size_t memory_cap = 0;   // bytes the caching allocator may hold; 0: the device's memory
  bool require_pinned_host = true;  // as CopyEngineOptions: pageable host memory is refused
};

// kUnsupported naming CUDA's reason when there is no usable device. Work items run at enqueue
// time on the calling thread and must launch their kernels on ctx.native_stream (a
// cudaStream_t); a launch error is reported by enqueue, naming the item.
Result<std::unique_ptr<device::Device>> make_cuda_device(CudaDeviceOptions options = {});

}  // namespace zinf::gpu
