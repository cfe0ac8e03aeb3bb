// HostBuffer: aligned host memory for staging arenas and CPU-tier tensor copies.
#include "swap/host_buffer.h"

#include <cstring>

#include <fmt/format.h>

#include "zinf/swap/types.h"

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
  const int rc = posix_memalign(&ptr, kSwapAlignment, buffer.size_);
  if (rc != 0) {
    return Status(ErrorCode::kResourceExhausted,
                  fmt::format("allocating {} bytes of host memory failed: {}", buffer.size_, std::strerror(rc)),
                  rc);
  }
  // Pre-fault now so that timed I/O never pays for first-touch page faults.
  std::memset(ptr, 0, buffer.size_);
  buffer.plain_.reset(static_cast<std::byte*>(ptr));
  return buffer;
}

}  // namespace zinf::swap::detail
