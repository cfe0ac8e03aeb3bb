// Opening files for aio requests: O_DIRECT with a buffered fallback, buffered twins, fd owners.
#include "aio/file.h"

#include <fcntl.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "zinf/log.h"

namespace zinf::aio::detail {

void UniqueFd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

int UniqueFd::close_checked() {
  if (fd_ < 0) return 0;
  const int rc = ::close(std::exchange(fd_, -1));
  // EINTR on close: the descriptor is gone on Linux; nothing to retry.
  return rc == 0 || errno == EINTR ? 0 : errno;
}

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

std::string file_system_name(const std::string& folder) {
  struct statfs st {};
  if (::statfs(folder.c_str(), &st) != 0) return "unknown file system";
  switch (static_cast<unsigned long>(st.f_type)) {
    case 0x01021994UL: return "tmpfs";
    case 0x858458f6UL: return "ramfs";
    case 0xEF53UL: return "ext4";
    case 0x58465342UL: return "xfs";
    case 0x9123683EUL: return "btrfs";
    case 0x6969UL: return "nfs";
    case 0x65735546UL: return "fuse";
    case 0x794c7630UL: return "overlayfs";
    case 0x01021997UL: return "9p";
    case 0xFF534D42UL: return "cifs";
    case 0x2fc12fc1UL: return "zfs";
    default: return fmt::format("file system 0x{:x}", static_cast<unsigned long>(st.f_type));
  }
}

namespace {

std::string folder_of(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

int open_retrying(const char* path, int flags, mode_t mode) {
  int fd = -1;
  do {
    fd = ::open(path, flags, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

}  // namespace

Result<OpenedFile> open_for_request(const std::string& path, bool is_write, bool truncate, bool want_direct) {
  int flags = O_CLOEXEC | (is_write ? (O_WRONLY | O_CREAT) : O_RDONLY);
  if (is_write && truncate) flags |= O_TRUNC;
  const char* what = is_write ? "writing" : "reading";
  OpenedFile file;
  if (want_direct) {
    const int fd = open_retrying(path.c_str(), flags | O_DIRECT, 0644);
    if (fd >= 0) {
      file.fd = UniqueFd(fd);
      file.direct = true;
      return file;
    }
    if (errno != EINVAL) return Status::sys_error(fmt::format("open {} for {}", path, what), errno);
    const std::string folder = folder_of(path);
    log_once(LogLevel::kNotice, "aio.odirect:" + folder,
             fmt::format("O_DIRECT refused by {} for files in {}; using buffered I/O there",
                         file_system_name(folder), folder));
  }
  const int fd = open_retrying(path.c_str(), flags, 0644);
  if (fd < 0) return Status::sys_error(fmt::format("open {} for {}", path, what), errno);
  file.fd = UniqueFd(fd);
  return file;
}

Result<UniqueFd> open_buffered_twin(const std::string& path, int fd, bool is_write) {
  const int flags = O_CLOEXEC | (is_write ? O_WRONLY : O_RDONLY);
  const std::string target = path.empty() ? fmt::format("/proc/self/fd/{}", fd) : path;
  const int twin = open_retrying(target.c_str(), flags, 0);
  if (twin < 0) {
    return Status::sys_error(
        fmt::format("open {} (buffered, for the unaligned head/tail of an O_DIRECT request)", target), errno);
  }
  return UniqueFd(twin);
}

}  // namespace zinf::aio::detail
