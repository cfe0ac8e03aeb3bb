// Pinned host memory: aligned, page-locked buffers for O_DIRECT and (with CUDA) fast GPU copies.
#pragma once

#include <cstddef>

#include "zinf/status.h"

namespace zinf::aio {

// Move-only owner of one aligned allocation (posix_memalign + mlock; also
// cudaHostRegister when zinf is built with CUDA and a GPU is present), with huge pages from
// 2 MiB up (io_buffer_alignment below). Memory is
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

// Host memory that O_DIRECT transfers use. From 2 MiB up, a buffer is 2 MiB aligned and asks for
// transparent huge pages (MADV_HUGEPAGE; a no-op where THP is off), so that a request's memory
// is a few large segments: a 1 MiB request on 4 KiB pages is 256 segments, more than a virtio
// disk takes in one request (254), so the kernel splits it. What that costs: docs/aio.md,
// "Huge pages".
inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;
// The alignment to allocate `bytes` with: `alignment`, raised to kHugePageBytes from that size up.
std::size_t io_buffer_alignment(std::size_t bytes, std::size_t alignment);
// Asks for huge pages over [p, p + bytes) when bytes >= kHugePageBytes; call it before the
// pages are first touched. Best effort: a refusal leaves the memory as it was.
void advise_huge_pages(void* p, std::size_t bytes);

// Whether this build can register host memory with CUDA (true only when built with CUDA).
bool pinned_cuda_support();

}  // namespace zinf::aio
