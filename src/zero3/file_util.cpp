// Blocking file helpers: atomic replace (temp + fsync + rename + dir fsync) and exact reads.
#include "zero3/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include <fmt/format.h>

namespace zinf::zero3 {
namespace {

std::string parent_dir(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

Result<AtomicFile> AtomicFile::create(const std::string& path) {
  AtomicFile f;
  f.path_ = path;
  f.tmp_path_ = fmt::format("{}.tmp.{}", path, ::getpid());
  f.fd_ = ::open(f.tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd_ < 0) return Status::sys_error(fmt::format("create {}", f.tmp_path_), errno);
  return f;
}

AtomicFile::AtomicFile(AtomicFile&& other) noexcept
    : path_(std::move(other.path_)),
      tmp_path_(std::move(other.tmp_path_)),
      fd_(std::exchange(other.fd_, -1)),
      written_(other.written_) {}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

Status AtomicFile::append(const void* data, std::size_t bytes) {
  const char* p = static_cast<const char*>(data);
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::write(fd_, p + done, bytes - done);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Status::io_error("write", tmp_path_, written_ + done, bytes - done, errno);
    }
    done += static_cast<std::size_t>(n);
  }
  written_ += bytes;
  return Status::ok();
}

Status AtomicFile::commit() {
  if (::fsync(fd_) != 0) return Status::sys_error(fmt::format("fsync {}", tmp_path_), errno);
  if (::close(std::exchange(fd_, -1)) != 0) {
    const int err = errno;
    ::unlink(tmp_path_.c_str());
    return Status::sys_error(fmt::format("close {}", tmp_path_), err);
  }
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_path_.c_str());
    return Status::sys_error(fmt::format("rename {} to {}", tmp_path_, path_), err);
  }
  return sync_dir(parent_dir(path_));
}

Result<std::uint64_t> file_size_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::sys_error(fmt::format("stat {}", path), errno);
  return static_cast<std::uint64_t>(st.st_size);
}

Status read_exact(const std::string& path, std::uint64_t offset, void* out, std::size_t bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::sys_error(fmt::format("open {}", path), errno);
  char* p = static_cast<char*>(out);
  std::size_t done = 0;
  Status status;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, p + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      status = Status::io_error("pread", path, offset + done, bytes - done, errno);
      break;
    }
    if (n == 0) {
      status = Status::corruption(fmt::format("{}: file ends at byte {}, expected {} bytes at offset {}", path,
                                              offset + done, bytes, offset));
      break;
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return status;
}

Status write_file_atomic(const std::string& path, const std::string& text) {
  ZINF_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
  ZINF_RETURN_IF_ERROR(f.append(text.data(), text.size()));
  return f.commit();
}

Result<std::string> read_small_file(const std::string& path) {
  ZINF_ASSIGN_OR_RETURN(std::uint64_t size, file_size_of(path));
  std::string text(size, '\0');
  ZINF_RETURN_IF_ERROR(read_exact(path, 0, text.data(), size));
  return text;
}

Status sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::sys_error(fmt::format("open folder {}", dir), errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return Status::sys_error(fmt::format("fsync folder {}", dir), err);
  return Status::ok();
}

}  // namespace zinf::zero3
