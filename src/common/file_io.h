// Internal: the one blocking file toolkit every layer uses (fd owner, opens, exact transfers, atomic replace).
//
// Guarantees, the same in every layer that uses them:
//  - every system call is retried on EINTR, and on EAGAIN after waiting for the descriptor;
//  - pread_exact / pwrite_all move every byte or fail: short transfers are continued, a file
//    that ends early is an OutOfRange error naming the path, the offset and where it ended;
//  - every error carries the operation, the path, the offset and length where there is one, and
//    the errno text (Status::io_error / sys_error);
//  - AtomicFile / write_file_atomic: readers see the old file or the whole new one, never a part;
//    the temporary file is new (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600), so nothing planted at its
//    name is followed or overwritten;
//  - read_small_file refuses a file over its size cap instead of taking unbounded memory.
// All functions are thread-safe (they share no state beyond a counter for temporary names).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zinf/status.h"

namespace zinf::fileio {

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
  // Gives up ownership without closing.
  int release() { return std::exchange(fd_, -1); }
  void reset();
  // Closes now; returns 0 or the errno of a failed close (e.g. a delayed write error on NFS).
  int close_checked();

 private:
  int fd_ = -1;
};

// Permissions of files and folders that hold swap data and checkpoints: owner only.
inline constexpr mode_t kPrivateFileMode = 0600;
inline constexpr mode_t kPrivateDirMode = 0700;

// open(2) with O_CLOEXEC added, retried on EINTR. The error names `path` and `what`
// ("open /x/y for reading: Permission denied"); a symlink refused by O_NOFOLLOW says so.
Result<UniqueFd> open_file(const std::string& path, int flags, mode_t mode = kPrivateFileMode,
                           std::string_view what = {});

// A file opened, possibly with O_DIRECT. `direct` says whether O_DIRECT is on (alignment rules apply).
struct OpenedFile {
  UniqueFd fd;
  bool direct = false;
};

// Opens with O_DIRECT when `want_direct`; a file system that refuses O_DIRECT (EINVAL) gets the
// file opened buffered, with a once-per-folder notice naming the file system.
Result<OpenedFile> open_direct_or_buffered(const std::string& path, int flags, mode_t mode, bool want_direct,
                                           std::string_view what = {});

// Reads exactly `bytes` at `offset`. A file that ends first is OutOfRange: "pread <path> offset
// <o> length <n>: the file ends at byte <e>".
Status pread_exact(int fd, const std::string& path, void* out, std::size_t bytes, std::uint64_t offset);
// Opens `path` read-only and reads exactly `bytes` at `offset`.
Status pread_exact(const std::string& path, void* out, std::size_t bytes, std::uint64_t offset);
// Writes all `bytes` at `offset`, continuing short writes.
Status pwrite_all(int fd, const std::string& path, const void* data, std::size_t bytes, std::uint64_t offset);
// write(2) / read(2) at the descriptor's position (pipes, sockets, O_APPEND files), same guarantees.
Status write_all(int fd, const std::string& path, const void* data, std::size_t bytes);
Status read_exact(int fd, const std::string& path, void* out, std::size_t bytes);

// The loop behind the four functions above, exposed so that tests can drive it with a system
// call that returns short counts, EINTR, EAGAIN or 0. `step(done)` moves the bytes from `done`
// on and returns what the system call returned (errno set on -1). `op` names the call in
// errors ("pread"); `reading` decides whether 0 means end of file (reads) or an error (writes).
// `fd` is polled on EAGAIN; -1 skips the poll.
using TransferStep = std::function<ssize_t(std::size_t done)>;
Status transfer_exact(std::string_view op, const std::string& path, std::uint64_t offset, std::size_t bytes,
                      bool reading, int fd, const TransferStep& step);

// Test-only fault injection (RocksDB's FaultInjectionTestFS in spirit): while a hook is installed,
// every transfer of this toolkit (the four calls above, read_small_file, AtomicFile) asks it before
// each system call; so do fsync in AtomicFile::commit and sync_dir, and every rename and mkdir of
// the toolkit (rename_path, make_dir, AtomicFile::commit, make_private_dirs). Production code never
// installs one; with none installed the cost is one relaxed atomic load per system call.
enum class FaultKind {
  kNone,   // the real system call runs
  kErrno,  // the call "returns" -1 with `err` (ENOSPC, EIO, EINTR, EAGAIN, ...); nothing moves
  kShort,  // the real call runs on half of what is left (at least 1 byte): a short transfer
  kZero,   // the call "returns" 0: a zero-byte write, or end of file for a read
};
struct InjectedFault {
  FaultKind kind = FaultKind::kNone;
  int err = 0;
};
// Where a system call is about to happen: `op` is "pread", "pwrite", "read", "write", "fsync",
// "rename" or "mkdir". For fsync, rename and mkdir only kErrno applies (the other kinds run the
// real call).
struct FaultSite {
  std::string_view op;
  const std::string& path;  // rename: the old name
  std::size_t remaining;    // bytes still to move (0 for fsync, rename and mkdir)
  const std::string* new_path = nullptr;  // rename: the new name
};
using FaultHook = std::function<InjectedFault(const FaultSite& site)>;
// Installs `hook` for the whole process (an empty function removes it). The hook may be called
// from any thread that does file I/O through this toolkit, concurrently: it must be thread-safe.
// Install and remove it only while no other thread does such I/O.
void set_fault_hook(FaultHook hook);

Result<std::uint64_t> file_size(const std::string& path);
Result<std::uint64_t> file_size(int fd, const std::string& path);

// read_small_file's default cap: config files, manifests, engine.json, "latest".
inline constexpr std::uint64_t kSmallFileCap = std::uint64_t{64} << 20;
// The whole file, refused with ResourceExhausted (naming the path, its size and the cap) when it
// holds more than `max_bytes`. Reads to end of file, so files that stat as 0 bytes (procfs) work.
Result<std::string> read_small_file(const std::string& path, std::uint64_t max_bytes = kSmallFileCap);

// fsync of a folder, so a rename or a new file inside it is durable.
Status sync_dir(const std::string& dir);
// rename(2), retried on EINTR; the error names both paths ("rename <from> to <to>: ...").
Status rename_path(const std::string& from, const std::string& to);
// mkdir(2) with `mode`, retried on EINTR; a folder (or anything) already at `path` is not an error
// (callers that care check what is there). The error names the path ("mkdir <path>: ...").
Status make_dir(const std::string& path, mode_t mode = kPrivateDirMode);
// The folder part of a path ("." when there is none).
std::string parent_dir(const std::string& path);
// File system name for a folder ("tmpfs", "ext4", ... or the magic number in hex).
std::string file_system_name(const std::string& folder);

// A new, empty file next to `path`, open for writing: a fresh "<path>.tmp.<pid>.<n>" created
// O_EXCL|O_NOFOLLOW with `mode`; a name already taken (a stale temporary of a crashed run, or a
// planted symlink) is skipped for the next. AtomicFile's temporary, and the one of writers that
// reopen it their own way (O_DIRECT) and rename it over `path` themselves.
struct TempFile {
  std::string path;
  UniqueFd fd;
};
Result<TempFile> create_temp_beside(const std::string& path, mode_t mode);

// Writes a new file next to `path` (create_temp_beside's, with `mode`); commit() fsyncs it,
// renames it over `path` and fsyncs the folder, so readers see either the old or the whole new
// file. Destroyed without a successful commit(), the
// temporary file is removed and `path` is untouched. One thread at a time.
class AtomicFile {
 public:
  static Result<AtomicFile> create(const std::string& path, mode_t mode = kPrivateFileMode);
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&&) = delete;
  AtomicFile(const AtomicFile&) = delete;
  ~AtomicFile();

  Status append(const void* data, std::size_t bytes);
  Status commit();
  const std::string& temp_path() const { return tmp_path_; }

 private:
  AtomicFile() = default;
  std::string path_;
  std::string tmp_path_;
  UniqueFd fd_;
  std::uint64_t written_ = 0;
};

// An exclusive flock(2) on the file `path` (created O_NOFOLLOW, 0600 if new), held until the
// object is destroyed or the process ends (a crash releases it: no stale locks). The holder's pid
// is written into the file so that a refused process can name it. Note that flock is per open
// file: a second FileLock on the same path is refused even within one process.
class FileLock {
 public:
  // Taken at once or refused at once: InvalidArgument "<what> is in use by another zinf process
  // (pid N); ..." naming `path`. `what` names the guarded thing ("swap folder /nvme/...").
  static Result<FileLock> acquire(const std::string& path, std::string_view what);
  const std::string& path() const { return path_; }

 private:
  FileLock() = default;
  UniqueFd fd_;
  std::string path_;
};

// Creates base/parts[0]/parts[1]/... one level at a time with mode `mode` (base itself, the
// user's folder, with create_directories if missing). Each part, new or not, must be a real
// folder owned by this user, not a symbolic link, so that nothing planted there redirects what
// is written below it; a violation is an error naming the path.
Status make_private_dirs(const std::string& base, const std::vector<std::string>& parts,
                         mode_t mode = kPrivateDirMode);

// Replaces `path` with `text` through an AtomicFile.
Status write_file_atomic(const std::string& path, std::string_view text, mode_t mode = kPrivateFileMode);

}  // namespace zinf::fileio
