// Internal: the caching allocator on a CUDA device (cudaMalloc/cudaFree, cudaEvents as fences).
#pragma once

#include <cstddef>
#include <memory>

#include "device/caching_allocator.h"
#include "zinf/status.h"

namespace zinf::gpu {

// The caching allocator lives in the device layer (CUDA-free); this file gives it its CUDA backend.
using device::AllocatorBackend;
using device::AllocatorStats;
using device::CachingAllocator;
using device::CachingAllocatorOptions;
using device::DeviceBlock;
using device::FenceKey;
using device::StreamKey;

// A backend for GPU `device`: every call runs with that device current, so blocks may be
// allocated and returned from any thread. Events are pooled, so a step that returns blocks used
// on other streams creates no new events once warm.
Result<std::unique_ptr<AllocatorBackend>> make_cuda_backend(int device);

// A caching allocator on GPU `device` holding at most `cap_bytes` (0: no cap but the device's
// memory). Its errors are named "GPU <device> memory".
Result<std::unique_ptr<CachingAllocator>> make_device_allocator(int device, std::size_t cap_bytes);

}  // namespace zinf::gpu
