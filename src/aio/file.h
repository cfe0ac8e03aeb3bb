// Internal: owned file descriptors, aligned scratch memory and how the aio engine opens files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/file_io.h"
#include "zinf/status.h"

namespace zinf::aio::detail {

// The common toolkit's descriptor owner and opened-file pair.
using fileio::OpenedFile;
using fileio::UniqueFd;

// Move-only owner of `bytes` of memory aligned to `alignment`, zero-filled (pre-faulted).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  static Result<AlignedBuffer> allocate(std::size_t bytes, std::size_t alignment);
  std::byte* data() const { return data_.get(); }
  std::size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> data_;
  std::size_t size_ = 0;
};

// Opens `path` for a request: reads O_RDONLY, writes O_WRONLY|O_CREAT (|O_TRUNC), mode 0644,
// with O_DIRECT when `want_direct`. A file system that refuses O_DIRECT (EINVAL) gets the
// file reopened buffered and a once-per-folder notice naming the file system.
Result<OpenedFile> open_for_request(const std::string& path, bool is_write, bool truncate, bool want_direct);

// A second, buffered descriptor for the same file (for unaligned heads and tails of an
// O_DIRECT request): by path, or through /proc/self/fd for a caller's descriptor.
Result<UniqueFd> open_buffered_twin(const std::string& path, int fd, bool is_write);

}  // namespace zinf::aio::detail
