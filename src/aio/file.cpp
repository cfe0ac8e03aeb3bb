// Opening files for aio requests (through the common toolkit) and aligned bounce memory.
#include "aio/file.h"

#include <fcntl.h>

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace zinf::aio::detail {

void AlignedBuffer::Free::operator()(std::byte* p) const { std::free(p); }

Result<AlignedBuffer> AlignedBuffer::allocate(std::size_t bytes, std::size_t alignment) {
  AlignedBuffer buffer;
  if (bytes == 0) return buffer;
  void* ptr = nullptr;
  const int rc = posix_memalign(&ptr, alignment, bytes);
  if (rc != 0) {
    return Status(ErrorCode::kResourceExhausted,
                  fmt::format("aio: allocating a {}-byte bounce buffer failed: {}", bytes, std::strerror(rc)),
                  rc);
  }
  std::memset(ptr, 0, bytes);
  buffer.data_.reset(static_cast<std::byte*>(ptr));
  buffer.size_ = bytes;
  return buffer;
}

Result<OpenedFile> open_for_request(const std::string& path, bool is_write, bool truncate, bool want_direct) {
  int flags = is_write ? (O_WRONLY | O_CREAT) : O_RDONLY;
  if (is_write && truncate) flags |= O_TRUNC;
  return fileio::open_direct_or_buffered(path, flags, 0644, want_direct, is_write ? "writing" : "reading");
}

Result<UniqueFd> open_buffered_twin(const std::string& path, int fd, bool is_write) {
  const int flags = is_write ? O_WRONLY : O_RDONLY;
  const std::string target = path.empty() ? fmt::format("/proc/self/fd/{}", fd) : path;
  return fileio::open_file(target, flags, 0, "buffered I/O (the unaligned head/tail of an O_DIRECT request)");
}

}  // namespace zinf::aio::detail
