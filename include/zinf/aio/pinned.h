// Pinned host memory: aligned, page-locked buffers for O_DIRECT and (with CUDA) fast GPU copies.
#pragma once

#include <cstddef>

#include "zinf/status.h"

namespace zinf::aio {

// Move-only owner of one aligned allocation (posix_memalign + mlock; also
// cudaHostRegister when zinf is built with CUDA and a GPU is present). Memory is
// pre-faulted (touched) on allocation so first I/O does not pay for page faults.
// If mlock is refused (RLIMIT_MEMLOCK), the buffer stays usable, unlocked, and a
// one-time notice says so; locked() reports which.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  // bytes may be 0 (an empty buffer). alignment must be a power of two >= sizeof(void*).
  static Result<PinnedBuffer> allocate(std::size_t bytes, std::size_t alignment = 4096);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return data_; }
  std::byte* bytes() const { return static_cast<std::byte*>(data_); }
  std::size_t size() const { return size_; }
  bool locked() const { return locked_; }
  bool cuda_registered() const { return cuda_registered_; }

 private:
  void reset();
  void* data_ = nullptr;
  std::size_t size_ = 0;
  bool locked_ = false;
  bool cuda_registered_ = false;
};

// Whether this build can register host memory with CUDA (true only when built with CUDA).
bool pinned_cuda_support();

}  // namespace zinf::aio
