// The blocking file toolkit: descriptor owner, opens with the O_DIRECT fallback, exact transfers, atomic replace.
#include "common/file_io.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "zinf/log.h"

namespace zinf::fileio {

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

namespace {

std::string open_what(const std::string& path, std::string_view what) {
  return what.empty() ? fmt::format("open {}", path) : fmt::format("open {} for {}", path, what);
}

Status open_error(const std::string& path, int flags, std::string_view what, int err) {
  if (err == ELOOP && (flags & O_NOFOLLOW) != 0) {
    return Status::sys_error(
        fmt::format("{} (it is a symbolic link, and zinf does not follow links for files it writes there)",
                    open_what(path, what)),
        err);
  }
  return Status::sys_error(open_what(path, what), err);
}

int open_retrying(const std::string& path, int flags, mode_t mode) {
  int fd = -1;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

}  // namespace

Result<UniqueFd> open_file(const std::string& path, int flags, mode_t mode, std::string_view what) {
  const int fd = open_retrying(path, flags, mode);
  if (fd < 0) return open_error(path, flags, what, errno);
  return UniqueFd(fd);
}

Result<OpenedFile> open_direct_or_buffered(const std::string& path, int flags, mode_t mode, bool want_direct,
                                           std::string_view what) {
  OpenedFile file;
  if (want_direct) {
    const int fd = open_retrying(path, flags | O_DIRECT, mode);
    if (fd >= 0) {
      file.fd = UniqueFd(fd);
      file.direct = true;
      return file;
    }
    if (errno != EINVAL) return open_error(path, flags, what, errno);
    const std::string folder = parent_dir(path);
    log_once(LogLevel::kNotice, "odirect:" + folder,
             fmt::format("O_DIRECT refused by {} for files in {}; using buffered I/O there",
                         file_system_name(folder), folder));
  }
  ZINF_ASSIGN_OR_RETURN(file.fd, open_file(path, flags, mode, what));
  return file;
}

namespace {

// The installed test hook (set_fault_hook); `hook_installed` keeps the common path to one load.
std::atomic<bool> hook_installed{false};
FaultHook fault_hook;

InjectedFault consult_hook(std::string_view op, const std::string& path, std::size_t remaining,
                           const std::string* new_path = nullptr) {
  if (!hook_installed.load(std::memory_order_acquire)) return {};
  return fault_hook(FaultSite{op, path, remaining, new_path});
}

// One system call of a transfer, through the hook: `call(len)` moves up to `len` bytes.
template <typename Call>
ssize_t hooked_call(std::string_view op, const std::string& path, std::size_t remaining, const Call& call) {
  const InjectedFault f = consult_hook(op, path, remaining);
  switch (f.kind) {
    case FaultKind::kErrno:
      errno = f.err;
      return -1;
    case FaultKind::kZero:
      return 0;
    case FaultKind::kShort:
      return call(std::max<std::size_t>(1, remaining / 2));
    case FaultKind::kNone:
      break;
  }
  return call(remaining);
}

// A call that moves no bytes (fsync, rename, mkdir) through the hook: an injected errno fails
// it, other kinds run the real call; retried on EINTR like every other call here.
template <typename Call>
int hooked_plain_call(std::string_view op, const std::string& path, const std::string* new_path, const Call& call) {
  for (;;) {
    const InjectedFault f = consult_hook(op, path, 0, new_path);
    int rc = 0;
    if (f.kind == FaultKind::kErrno) {
      errno = f.err;
      rc = -1;
    } else {
      rc = call();
    }
    if (rc == 0 || errno != EINTR) return rc;
  }
}

int hooked_fsync(int fd, const std::string& path) {
  return hooked_plain_call("fsync", path, nullptr, [&] { return ::fsync(fd); });
}

int hooked_rename(const std::string& from, const std::string& to) {
  return hooked_plain_call("rename", from, &to, [&] { return ::rename(from.c_str(), to.c_str()); });
}

int hooked_mkdir(const std::string& path, mode_t mode) {
  return hooked_plain_call("mkdir", path, nullptr, [&] { return ::mkdir(path.c_str(), mode); });
}

using LengthStep = std::function<ssize_t(std::size_t done, std::size_t len)>;

Status transfer_loop(std::string_view op, const std::string& path, std::uint64_t offset, std::size_t bytes,
                     bool reading, int fd, const LengthStep& step) {
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t n = hooked_call(op, path, bytes - done, [&](std::size_t len) { return step(done, len); });
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) {
      if (reading) {
        return Status::out_of_range(fmt::format("{} {} offset {} length {}: the file ends at byte {}", op, path,
                                                offset, bytes, offset + done));
      }
      return Status(ErrorCode::kIoError,
                    fmt::format("{} {} offset {} length {}: the system call wrote nothing", op, path,
                                offset + done, bytes - done),
                    EIO);
    }
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      if (fd >= 0) {
        pollfd p{fd, static_cast<short>(reading ? POLLIN : POLLOUT), 0};
        (void)::poll(&p, 1, -1);  // an error here shows up again in the next call
      }
      continue;
    }
    return Status::io_error(op, path, offset + done, bytes - done, err);
  }
  return Status::ok();
}

}  // namespace

void set_fault_hook(FaultHook hook) {
  hook_installed.store(false, std::memory_order_release);
  fault_hook = std::move(hook);
  if (fault_hook) hook_installed.store(true, std::memory_order_release);
}

Status transfer_exact(std::string_view op, const std::string& path, std::uint64_t offset, std::size_t bytes,
                      bool reading, int fd, const TransferStep& step) {
  return transfer_loop(op, path, offset, bytes, reading, fd, [&](std::size_t done, std::size_t) { return step(done); });
}

Status pread_exact(int fd, const std::string& path, void* out, std::size_t bytes, std::uint64_t offset) {
  auto* p = static_cast<char*>(out);
  return transfer_loop("pread", path, offset, bytes, true, fd, [&](std::size_t done, std::size_t len) {
    return ::pread(fd, p + done, len, static_cast<off_t>(offset + done));
  });
}

Status pread_exact(const std::string& path, void* out, std::size_t bytes, std::uint64_t offset) {
  ZINF_ASSIGN_OR_RETURN(UniqueFd fd, open_file(path, O_RDONLY, 0, "reading"));
  return pread_exact(fd.get(), path, out, bytes, offset);
}

Status pwrite_all(int fd, const std::string& path, const void* data, std::size_t bytes, std::uint64_t offset) {
  const auto* p = static_cast<const char*>(data);
  return transfer_loop("pwrite", path, offset, bytes, false, fd, [&](std::size_t done, std::size_t len) {
    return ::pwrite(fd, p + done, len, static_cast<off_t>(offset + done));
  });
}

Status write_all(int fd, const std::string& path, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  return transfer_loop("write", path, 0, bytes, false, fd,
                       [&](std::size_t done, std::size_t len) { return ::write(fd, p + done, len); });
}

Status read_exact(int fd, const std::string& path, void* out, std::size_t bytes) {
  auto* p = static_cast<char*>(out);
  return transfer_loop("read", path, 0, bytes, true, fd,
                       [&](std::size_t done, std::size_t len) { return ::read(fd, p + done, len); });
}

Result<std::uint64_t> file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::sys_error(fmt::format("stat {}", path), errno);
  return static_cast<std::uint64_t>(st.st_size);
}

Result<std::uint64_t> file_size(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::sys_error(fmt::format("fstat {}", path), errno);
  return static_cast<std::uint64_t>(st.st_size);
}

Result<std::string> read_small_file(const std::string& path, std::uint64_t max_bytes) {
  ZINF_ASSIGN_OR_RETURN(UniqueFd fd, open_file(path, O_RDONLY, 0, "reading"));
  ZINF_ASSIGN_OR_RETURN(std::uint64_t size, file_size(fd.get(), path));
  auto too_big = [&](std::uint64_t at_least) {
    return Status::resource_exhausted(fmt::format(
        "{}: {} bytes or more, over the {}-byte limit for this file (damaged, or not the file zinf expects)", path,
        at_least, max_bytes));
  };
  if (size > max_bytes) return too_big(size);
  std::string text;
  text.reserve(static_cast<std::size_t>(size));
  char chunk[65536];
  for (;;) {
    const ssize_t n =
        hooked_call("read", path, sizeof(chunk), [&](std::size_t len) { return ::read(fd.get(), chunk, len); });
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Status::io_error("read", path, text.size(), sizeof(chunk), errno);
    }
    if (n == 0) break;
    if (text.size() + static_cast<std::size_t>(n) > max_bytes) return too_big(text.size() + static_cast<std::size_t>(n));
    text.append(chunk, static_cast<std::size_t>(n));
  }
  return text;
}

std::string parent_dir(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status sync_dir(const std::string& dir) {
  ZINF_ASSIGN_OR_RETURN(UniqueFd fd, open_file(dir, O_RDONLY | O_DIRECTORY, 0, "syncing the folder"));
  if (hooked_fsync(fd.get(), dir) != 0) return Status::sys_error(fmt::format("fsync folder {}", dir), errno);
  return Status::ok();
}

Status rename_path(const std::string& from, const std::string& to) {
  if (hooked_rename(from, to) != 0) return Status::sys_error(fmt::format("rename {} to {}", from, to), errno);
  return Status::ok();
}

Status make_dir(const std::string& path, mode_t mode) {
  if (hooked_mkdir(path, mode) != 0 && errno != EEXIST) return Status::sys_error(fmt::format("mkdir {}", path), errno);
  return Status::ok();
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
std::atomic<unsigned> temp_counter{0};
constexpr int kTempAttempts = 64;
}  // namespace

Result<TempFile> create_temp_beside(const std::string& path, mode_t mode) {
  // A fresh name each time: O_EXCL refuses anything already there (a stale temporary of a
  // crashed run, or a planted symlink), and we move on to the next name.
  for (int attempt = 0; attempt < kTempAttempts; ++attempt) {
    std::string name = fmt::format("{}.tmp.{}.{}", path, ::getpid(), temp_counter.fetch_add(1));
    const int fd = open_retrying(name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode);
    if (fd >= 0) return TempFile{std::move(name), UniqueFd(fd)};
    if (errno != EEXIST) return open_error(name, O_NOFOLLOW, "writing (a temporary file)", errno);
  }
  return Status::sys_error(fmt::format("create a temporary file next to {} ({} names tried)", path, kTempAttempts),
                           EEXIST);
}

Result<AtomicFile> AtomicFile::create(const std::string& path, mode_t mode) {
  ZINF_ASSIGN_OR_RETURN(TempFile temp, create_temp_beside(path, mode));
  AtomicFile f;
  f.path_ = path;
  f.tmp_path_ = std::move(temp.path);
  f.fd_ = std::move(temp.fd);
  return f;
}

AtomicFile::AtomicFile(AtomicFile&& other) noexcept
    : path_(std::move(other.path_)),
      tmp_path_(std::move(other.tmp_path_)),
      fd_(std::move(other.fd_)),
      written_(other.written_) {}

AtomicFile::~AtomicFile() {
  if (fd_.valid()) {
    fd_.reset();
    ::unlink(tmp_path_.c_str());
  }
}

Status AtomicFile::append(const void* data, std::size_t bytes) {
  if (!fd_.valid()) return Status::internal(fmt::format("append to {} after commit", tmp_path_));
  ZINF_RETURN_IF_ERROR(pwrite_all(fd_.get(), tmp_path_, data, bytes, written_));
  written_ += bytes;
  return Status::ok();
}

Status AtomicFile::commit() {
  if (!fd_.valid()) return Status::internal(fmt::format("{} committed twice", tmp_path_));
  Status st;
  if (hooked_fsync(fd_.get(), tmp_path_) != 0) st = Status::sys_error(fmt::format("fsync {}", tmp_path_), errno);
  const int close_err = fd_.close_checked();
  if (st.is_ok() && close_err != 0) st = Status::sys_error(fmt::format("close {}", tmp_path_), close_err);
  if (st.is_ok()) st = rename_path(tmp_path_, path_);
  if (!st.is_ok()) {
    ::unlink(tmp_path_.c_str());
    return st;
  }
  return sync_dir(parent_dir(path_));
}

Result<FileLock> FileLock::acquire(const std::string& path, std::string_view what) {
  FileLock lock;
  lock.path_ = path;
  ZINF_ASSIGN_OR_RETURN(lock.fd_, open_file(path, O_RDWR | O_CREAT | O_NOFOLLOW, kPrivateFileMode, "locking"));
  int rc = 0;
  do {
    rc = ::flock(lock.fd_.get(), LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0 && errno != EWOULDBLOCK) return Status::sys_error(fmt::format("flock {}", path), errno);
  if (rc != 0) {
    char text[32] = {};
    const ssize_t n = ::pread(lock.fd_.get(), text, sizeof(text) - 1, 0);
    const long pid = n > 0 ? std::strtol(text, nullptr, 10) : 0;
    const std::string holder =
        pid <= 0 ? std::string("pid not yet recorded")
                 : fmt::format("pid {}{}", pid, pid == static_cast<long>(::getpid()) ? ", this very process" : "");
    return Status::invalid_argument(fmt::format(
        "{} is in use by another zinf process ({}; lock file {}): two runs must not share it; give this run "
        "its own folder, or stop the other run first",
        what, holder, path));
  }
  const std::string pid = fmt::format("{}\n", ::getpid());
  if (::ftruncate(lock.fd_.get(), 0) != 0) return Status::sys_error(fmt::format("ftruncate {}", path), errno);
  ZINF_RETURN_IF_ERROR(pwrite_all(lock.fd_.get(), path, pid.data(), pid.size(), 0));
  return lock;
}

Status make_private_dirs(const std::string& base, const std::vector<std::string>& parts, mode_t mode) {
  std::error_code ec;
  std::filesystem::create_directories(base, ec);
  if (ec) return Status::sys_error(fmt::format("create folder {}", base), ec.value());
  std::string path = base;
  for (const std::string& part : parts) {
    path += "/" + part;
    if (hooked_mkdir(path, mode) != 0 && errno != EEXIST) {
      return Status::sys_error(fmt::format("create folder {}", path), errno);
    }
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return Status::sys_error(fmt::format("lstat {}", path), errno);
    if (S_ISLNK(st.st_mode)) {
      return Status::invalid_argument(
          fmt::format("refusing to use {}: it is a symbolic link, and zinf does not follow links there", path));
    }
    if (!S_ISDIR(st.st_mode)) return Status::invalid_argument(fmt::format("{} exists and is not a folder", path));
    if (st.st_uid != ::geteuid()) {
      return Status::invalid_argument(fmt::format(
          "refusing to use {}: the folder belongs to user id {}, not to this user ({})", path, st.st_uid, ::geteuid()));
    }
  }
  return Status::ok();
}

Status write_file_atomic(const std::string& path, std::string_view text, mode_t mode) {
  ZINF_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path, mode));
  ZINF_RETURN_IF_ERROR(f.append(text.data(), text.size()));
  return f.commit();
}

}  // namespace zinf::fileio
