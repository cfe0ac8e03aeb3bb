// DeviceBuffer: cudaMalloc/cudaFree under a device guard.
#include "gpu/device_buffer.h"

#include <cuda_runtime_api.h>

#include <utility>

#include <fmt/format.h>

#include "gpu/cuda_error.h"
#include "gpu/device.h"

namespace zinf::gpu {

Result<DeviceBuffer> DeviceBuffer::allocate(int device, std::size_t bytes, std::string_view what) {
  DeviceBuffer buffer;
  buffer.device_ = device;
  if (bytes == 0) return buffer;
  ZINF_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::enter(device));
  const cudaError_t err = cudaMalloc(&buffer.data_, bytes);
  if (err != cudaSuccess) {
    buffer.data_ = nullptr;
    std::size_t free = 0, total = 0;
    const cudaError_t info = cudaMemGetInfo(&free, &total);
    const bool known = info == cudaSuccess;
    forget_error(info);
    forget_error(err);
    return cuda_status(err, fmt::format("cudaMalloc of {} bytes for {} on device {}{}", bytes, what, device,
                                        known ? fmt::format(" ({} of {} bytes free)", free, total) : std::string()));
  }
  buffer.size_ = bytes;
  return buffer;
}

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)), device_(other.device_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    device_ = other.device_;
  }
  return *this;
}

void DeviceBuffer::reset() noexcept {
  if (data_ == nullptr) return;
  // cudaFree waits for the device's pending work before it returns the memory, so work still
  // using the buffer completes first.
  Result<DeviceGuard> guard = DeviceGuard::enter(device_);
  forget_error(cudaFree(data_));
  data_ = nullptr;
  size_ = 0;
}

}  // namespace zinf::gpu
