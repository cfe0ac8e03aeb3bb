// Internal: owned file descriptors, aligned scratch memory and how the aio engine opens files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "zinf/status.h"

namespace zinf::aio::detail {

// Move-only owner of a file descriptor; closes it on destruction (errors ignored there:
// callers that must see a close error call close_checked()).
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset();
  // Closes now; returns 0 or the errno of a failed close (e.g. a delayed write error on NFS).
  int close_checked();

 private:
  int fd_ = -1;
};

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

// A file opened for one request. `direct` says whether O_DIRECT is on (alignment rules apply).
struct OpenedFile {
  UniqueFd fd;
  bool direct = false;
};

// Opens `path` for a request: reads O_RDONLY, writes O_WRONLY|O_CREAT (|O_TRUNC), mode 0644,
// with O_DIRECT when `want_direct`. A file system that refuses O_DIRECT (EINVAL) gets the
// file reopened buffered and a once-per-folder notice naming the file system.
Result<OpenedFile> open_for_request(const std::string& path, bool is_write, bool truncate, bool want_direct);

// A second, buffered descriptor for the same file (for unaligned heads and tails of an
// O_DIRECT request): by path, or through /proc/self/fd for a caller's descriptor.
Result<UniqueFd> open_buffered_twin(const std::string& path, int fd, bool is_write);

// File system name for a folder ("tmpfs", "ext4", ... or the magic number in hex).
std::string file_system_name(const std::string& folder);

}  // namespace zinf::aio::detail
