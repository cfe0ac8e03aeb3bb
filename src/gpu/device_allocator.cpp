// The CUDA backend of the caching allocator.
#include "gpu/device_allocator.h"

#include <cuda_runtime_api.h>

#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpu/cuda_error.h"
#include "gpu/device.h"

namespace zinf::gpu {

namespace {

class CudaBackend final : public AllocatorBackend {
 public:
  CudaBackend(int device, std::string device_name) : device_(device), device_name_(std::move(device_name)) {}

  ~CudaBackend() override {
    Result<DeviceGuard> guard = DeviceGuard::enter(device_);
    for (cudaEvent_t event : idle_events_) forget_error(cudaEventDestroy(event));
  }

  Result<void*> allocate(std::size_t bytes) override {
    ZINF_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::enter(device_));
    void* ptr = nullptr;
    const cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err != cudaSuccess) {
      forget_error(err);  // out of memory is not sticky; do not let it name a later launch
      return cuda_status(err, fmt::format("cudaMalloc of {} bytes on {}", bytes, where()));
    }
    return ptr;
  }

  // cudaFree waits for the device's pending work before it returns the memory, so work on the
  // block's own stream that still uses it (which the allocator does not fence) finishes first.
  void deallocate(void* ptr, std::size_t) noexcept override {
    Result<DeviceGuard> guard = DeviceGuard::enter(device_);
    forget_error(cudaFree(ptr));
  }

  Result<FenceKey> record_fence(StreamKey stream) override {
    ZINF_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::enter(device_));
    cudaEvent_t event = nullptr;
    if (!idle_events_.empty()) {
      event = idle_events_.back();
      idle_events_.pop_back();
    } else {
      ZINF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                                fmt::format("creating an allocator fence on GPU {}", device_));
    }
    const cudaError_t err = cudaEventRecord(event, reinterpret_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) {
      forget_error(err);  // reported here, as a Status
      idle_events_.push_back(event);
      return cuda_status(err, fmt::format("recording an allocator fence on stream {:#x} of GPU {}", stream, device_));
    }
    return reinterpret_cast<FenceKey>(event);
  }

  Result<bool> fence_done(FenceKey fence) override {
    const cudaError_t err = cudaEventQuery(reinterpret_cast<cudaEvent_t>(fence));
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) {
      forget_error(err);
      return false;
    }
    return cuda_status(err, fmt::format("querying an allocator fence on GPU {}", device_));
  }

  Status wait_fence(FenceKey fence) override {
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(reinterpret_cast<cudaEvent_t>(fence)),
                              fmt::format("waiting for an allocator fence on GPU {}", device_));
    return Status::ok();
  }

  void release_fence(FenceKey fence) noexcept override {
    idle_events_.push_back(reinterpret_cast<cudaEvent_t>(fence));
  }

  // "GPU 0 (NVIDIA H100 80GB HBM3; 1288490188 of 85520809984 bytes free)", for out-of-memory errors.
  std::string where() {
    std::size_t free = 0, total = 0;
    Result<DeviceGuard> guard = DeviceGuard::enter(device_);
    const cudaError_t err = guard.is_ok() ? cudaMemGetInfo(&free, &total) : cudaErrorInvalidDevice;
    if (err != cudaSuccess) {
      forget_error(err);
      return fmt::format("GPU {} ({})", device_, device_name_);
    }
    return fmt::format("GPU {} ({}; {} of {} bytes free)", device_, device_name_, free, total);
  }

 private:
  int device_;
  std::string device_name_;
  std::vector<cudaEvent_t> idle_events_;  // called under the allocator's lock: no lock of its own
};

}  // namespace

Result<std::unique_ptr<AllocatorBackend>> make_cuda_backend(int device) {
  ZINF_ASSIGN_OR_RETURN(const DeviceInfo info, device_info(device));
  return std::unique_ptr<AllocatorBackend>(std::make_unique<CudaBackend>(device, info.name));
}

Result<std::unique_ptr<CachingAllocator>> make_device_allocator(int device, std::size_t cap_bytes) {
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<AllocatorBackend> backend, make_cuda_backend(device));
  CachingAllocatorOptions options;
  options.cap_bytes = cap_bytes;
  options.name = fmt::format("GPU {} memory", device);
  return std::make_unique<CachingAllocator>(std::move(backend), std::move(options));
}

}  // namespace zinf::gpu
