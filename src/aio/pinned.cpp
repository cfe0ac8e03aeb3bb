// PinnedBuffer: aligned, pre-faulted, mlock'ed host allocations (CUDA registration in pinned_cuda*.cpp).
#include "zinf/aio/pinned.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "aio/pinned_cuda.h"
#include "zinf/log.h"
#include "zinf/thread_pool.h"

namespace zinf::aio {

std::size_t io_buffer_alignment(std::size_t bytes, std::size_t alignment) {
  return bytes >= kHugePageBytes && alignment < kHugePageBytes ? kHugePageBytes : alignment;
}

void advise_huge_pages(void* p, std::size_t bytes) {
  // Also fewer TLB misses when the CPU streams the buffer.
  if (bytes >= kHugePageBytes) (void)madvise(p, bytes, MADV_HUGEPAGE);
}

Result<PinnedBuffer> PinnedBuffer::allocate(std::size_t bytes, std::size_t alignment) {
  if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0) {
    return Status::invalid_argument(
        fmt::format("pinned buffer alignment {} must be a power of two >= {}", alignment, sizeof(void*)));
  }
  PinnedBuffer buffer;
  if (bytes == 0) return buffer;
  void* ptr = nullptr;
  // Round the allocation up to whole alignment units so O_DIRECT tails stay inside it (the start
  // may be aligned further, for huge pages; the size is not rounded to them).
  const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  const int rc = posix_memalign(&ptr, io_buffer_alignment(rounded, alignment), rounded);
  if (rc != 0) {
    return Status(ErrorCode::kResourceExhausted,
                  fmt::format("posix_memalign of {} bytes (alignment {}) failed: {}", rounded, alignment,
                              std::strerror(rc)),
                  rc);
  }
  buffer.data_ = ptr;
  buffer.size_ = bytes;
  advise_huge_pages(ptr, rounded);
  // Pre-fault: touch every page now so timed I/O never pays for first-touch faults.
  zero_fill(ptr, rounded);
  if (mlock(ptr, rounded) == 0) {
    buffer.locked_ = true;
  } else {
    const int err = errno;
    log_once(LogLevel::kNotice, "pinned.mlock",
             fmt::format("mlock of {} bytes refused ({}); pinned buffers stay pageable. "
                         "Raise RLIMIT_MEMLOCK (ulimit -l) to page-lock them.",
                         rounded, std::strerror(err)));
  }
  buffer.cuda_registered_ = detail::cuda_host_register(ptr, rounded);
  return buffer;
}

PinnedBuffer::~PinnedBuffer() { reset(); }

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      locked_(std::exchange(other.locked_, false)),
      cuda_registered_(std::exchange(other.cuda_registered_, false)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    locked_ = std::exchange(other.locked_, false);
    cuda_registered_ = std::exchange(other.cuda_registered_, false);
  }
  return *this;
}

void PinnedBuffer::reset() {
  if (data_ == nullptr) return;
  if (cuda_registered_) detail::cuda_host_unregister(data_);
  // munlock is implied by free() returning the pages; call it so the locked budget is returned now.
  if (locked_) munlock(data_, size_);
  std::free(data_);
  data_ = nullptr;
  size_ = 0;
  locked_ = false;
  cuda_registered_ = false;
}

bool pinned_cuda_support() { return detail::cuda_host_register_supported(); }

}  // namespace zinf::aio
