// HostBuffer: aligned host memory for staging arenas and CPU-tier tensor copies.
#include "swap/host_buffer.h"

#include <sys/mman.h>

#include <cassert>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include <fmt/format.h>

#include "zinf/log.h"
#include "zinf/swap/types.h"
#include "zinf/thread_pool.h"

namespace zinf::swap::detail {

Result<HostBuffer> HostBuffer::allocate(std::size_t bytes, bool pin) {
  HostBuffer buffer;
  buffer.size_ = static_cast<std::size_t>(align_up(bytes, kSwapAlignment));
  if (buffer.size_ == 0) return buffer;
  if (pin) {
    ZINF_ASSIGN_OR_RETURN(buffer.pinned_, aio::PinnedBuffer::allocate(buffer.size_, kSwapAlignment));
    return buffer;
  }
  void* ptr = nullptr;
  const int rc = posix_memalign(&ptr, aio::io_buffer_alignment(buffer.size_, kSwapAlignment), buffer.size_);
  if (rc != 0) {
    return Status(ErrorCode::kResourceExhausted,
                  fmt::format("allocating {} bytes of host memory failed: {}", buffer.size_, std::strerror(rc)),
                  rc);
  }
  aio::advise_huge_pages(ptr, buffer.size_);
  // Pre-fault now so that timed I/O never pays for first-touch page faults.
  zero_fill(ptr, buffer.size_);
  buffer.plain_.reset(static_cast<std::byte*>(ptr));
  return buffer;
}

Result<HostBuffer> HostBuffer::reserve(std::size_t bytes) {
  HostBuffer buffer;
  buffer.size_ = static_cast<std::size_t>(align_up(bytes, kSwapAlignment));
  if (buffer.size_ == 0) return buffer;
  // MAP_NORESERVE: the budget is a ceiling, not a commitment; pages exist once committed.
  // From 2 MiB up the range starts on a huge page (aio::io_buffer_alignment): reserve the slack,
  // then unmap what lies outside.
  const std::size_t align = aio::io_buffer_alignment(buffer.size_, kSwapAlignment);
  const std::size_t span = buffer.size_ + (align - kSwapAlignment);
  void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return Status(ErrorCode::kResourceExhausted,
                  fmt::format("reserving {} bytes of address space failed: {}", buffer.size_, std::strerror(errno)),
                  errno);
  }
  auto* base = static_cast<std::byte*>(p);
  const std::size_t head = (align - reinterpret_cast<std::uintptr_t>(base) % align) % align;
  std::byte* start = base + head;
  if (head > 0) ::munmap(base, head);
  if (span > head + buffer.size_) ::munmap(start + buffer.size_, span - head - buffer.size_);
  aio::advise_huge_pages(start, buffer.size_);
  buffer.reserved_ = std::unique_ptr<std::byte, UnmapDeleter>(start, UnmapDeleter{buffer.size_});
  return buffer;
}

void HostBuffer::UnmapDeleter::operator()(std::byte* p) const { ::munmap(p, bytes); }

void HostBuffer::commit(std::size_t offset, std::size_t length, bool pin) {
  if (reserved_ == nullptr || length == 0) return;
  assert(offset + length <= size_ && "HostBuffer::commit past the reserved range");
  std::byte* p = reserved_.get() + offset;
  // Pre-fault now, as allocate() does, so that timed I/O never pays for first-touch faults.
  std::memset(p, 0, length);
  if (pin && ::mlock(p, length) != 0) {
    log_once(LogLevel::kNotice, "swap.host_buffer.mlock",
             fmt::format("pinned pool growth: mlock refused ({}); its pages stay pageable", std::strerror(errno)));
  }
}

}  // namespace zinf::swap::detail
