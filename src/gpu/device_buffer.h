// Internal: a move-only owner of one cudaMalloc allocation, for long-lived device memory that does
// not go through the caching allocator (resident parameters, communicator scratch).
#pragma once

#include <cstddef>
#include <string_view>

#include "zinf/status.h"

namespace zinf::gpu {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // `bytes` of device memory on `device` (bytes may be 0: an empty buffer). Out of memory is
  // kResourceExhausted naming `what`, the size and the device's free memory.
  static Result<DeviceBuffer> allocate(int device, std::size_t bytes, std::string_view what);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  std::size_t size() const { return size_; }
  int device() const { return device_; }

 private:
  void reset() noexcept;
  void* data_ = nullptr;
  std::size_t size_ = 0;
  int device_ = -1;
};

}  // namespace zinf::gpu
