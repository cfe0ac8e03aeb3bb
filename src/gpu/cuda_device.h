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

class Stream;
class CopyEngine;
// The device interface over a compute stream, copy engine and allocator someone else owns (a GPU
// model's: the engine then gathers into the memory the model computes with, and orders its
// copies against the stream its kernels run on). They must outlive the device.
Result<std::unique_ptr<device::Device>> make_cuda_device_view(int ordinal, Stream& compute, CopyEngine& copies,
                                                              device::CachingAllocator& alloc);

}  // namespace zinf::gpu
