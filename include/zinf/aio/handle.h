// Public API of the async I/O engine: a handle that reads and writes host buffers to files.
//
// A request (buffer, file, offset, nbytes) is split on aligned boundaries across
// `intra_op_parallelism` worker threads; each worker issues its slice in
// `block_size` chunks keeping up to `queue_depth` in flight on its own backend
// queue (an io_uring ring, a libaio context, or a pread/pwrite loop). Every
// completion is checked; short transfers, EINTR and EAGAIN are retried; the
// first failure of a request is returned by wait() with path, offset, length
// and errno text. A request still unfinished request_timeout_s after its submission is
// failed (see AioConfig::request_timeout_s), so a stuck device is an error, not a hang. No
// request is reported finished while an op of it can still use its buffer: a failed request's
// ops in flight are cancelled and drained first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "zinf/aio/fault.h"
#include "zinf/status.h"

namespace zinf::aio {

enum class Backend {
  kAuto,     // probe at run time: io_uring, then libaio, then threads
  kIoUring,  // liburing; fixed-buffer reads/writes for registered buffers
  kLibaio,   // Linux native AIO (io_submit/io_getevents)
  kThreads,  // portable pread/pwrite loop on the worker threads
};

std::string_view backend_name(Backend backend);  // "auto", "io_uring", "libaio", "threads"
Result<Backend> parse_backend(std::string_view name);
// Whether this build has the backend and the running kernel accepts it (probed once, cached).
bool backend_available(Backend backend);
// What kAuto resolves to on this machine.
Backend resolve_auto_backend();

// The reference's "aio" knobs, same names, same defaults, same meaning.
struct AioConfig {
  std::size_t block_size = 1048576;      // bytes per submitted chunk
  std::size_t queue_depth = 8;           // chunks in flight per worker
  std::size_t intra_op_parallelism = 1;  // worker threads one request is split across
  bool single_submit = false;            // one submit call per chunk instead of per batch
  bool overlap_events = true;            // refill as completions arrive (false: batch, drain, repeat)
  Backend backend = Backend::kAuto;
  bool use_direct_io = true;  // O_DIRECT on files the handle opens; buffered fallback with a notice
  bool pin_threads = true;    // pin workers to cores when built with hwloc
  // zinf only (not a reference knob): seconds a request may take from submission before it is
  // failed. The request's chunks not yet issued are then dropped and those in flight cancelled
  // where the backend can, then drained: waited for, so no buffer is handed back while the
  // kernel may still use it. A cancelled chunk not back within this many seconds more makes its
  // worker tear its queue down (which blocks until the kernel has let go) and go on with a new
  // one. wait() returns an IoError naming the path, offset, length and this limit.
  double request_timeout_s = 120.0;
  // When set, every chunk completion passes through this injector (tests only).
  std::shared_ptr<FaultInjector> faults;

  // Names the bad knob and the accepted range, e.g. "aio.block_size = 100: must be a multiple of 512".
  Status validate() const;
};

struct WriteOptions {
  bool truncate = false;   // open with O_TRUNC (path-based writes only)
  bool fdatasync = false;  // fdatasync the file once the whole request is written
};

using RequestId = std::uint64_t;

// Counters since the handle was created (diagnostics and tests; read without stopping I/O,
// so a snapshot taken while requests run may be mid-way).
struct HandleStats {
  std::uint64_t requests = 0;       // requests finished (ok or not)
  std::uint64_t ops = 0;            // reads/writes handed to the backend, retries included
  std::uint64_t retries = 0;        // resubmissions after short transfers, EINTR or EAGAIN
  std::uint64_t fixed_ops = 0;      // ops that used io_uring registered (fixed) buffers
  std::uint64_t bounced_bytes = 0;  // bytes copied through bounce buffers (unaligned memory)
  std::uint64_t edge_ops = 0;       // buffered ops for unaligned heads/tails of O_DIRECT files
  std::uint64_t cancels = 0;        // ops in the kernel the workers asked to cancel (request failed or late)
  std::uint64_t queue_resets = 0;   // backend queues cancelled, drained and replaced (broken, or stuck)
};

// Not copyable or movable; create() returns it owned. One handle may be used from
// several threads at once: submissions and waits are internally synchronised.
class Handle {
 public:
  static Result<std::unique_ptr<Handle>> create(const AioConfig& config);
  virtual ~Handle() = default;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  // The backend actually running (kAuto resolved).
  virtual Backend backend() const = 0;
  virtual const AioConfig& config() const = 0;
  // Alignment (bytes) that buffers, offsets and lengths need for O_DIRECT fast paths.
  // Unaligned requests are still correct: the engine bounces heads and tails.
  static std::size_t alignment();

  // Registers [base, base+bytes) (usually a pinned pool arena) for fixed-buffer I/O on
  // io_uring; other backends accept and ignore it. The range must outlive the handle
  // or be unregistered first. Requests whose buffers lie inside use fixed ops.
  virtual Status register_buffer(void* base, std::size_t bytes) = 0;
  virtual Status unregister_buffers() = 0;

  // Blocking reads/writes of nbytes between `buffer` and `path` (opened and closed by the
  // handle) or an open `fd` (whose O_DIRECT flag the caller chose) at byte `offset`.
  // A read past the end of the file is an OutOfRange error naming the path and sizes.
  virtual Status sync_pread(void* buffer, std::size_t nbytes, const std::string& path,
                            std::uint64_t offset) = 0;
  virtual Status sync_pwrite(const void* buffer, std::size_t nbytes, const std::string& path,
                             std::uint64_t offset, WriteOptions options = {}) = 0;
  virtual Status sync_pread(void* buffer, std::size_t nbytes, int fd, std::uint64_t offset) = 0;
  virtual Status sync_pwrite(const void* buffer, std::size_t nbytes, int fd,
                             std::uint64_t offset) = 0;

  // Asynchronous forms. The buffer (and fd) must stay valid until the request is waited
  // for. Errors found at submission (bad argument, open failure) are returned here;
  // I/O errors come back from wait().
  virtual Result<RequestId> async_pread(void* buffer, std::size_t nbytes, const std::string& path,
                                        std::uint64_t offset) = 0;
  virtual Result<RequestId> async_pwrite(const void* buffer, std::size_t nbytes,
                                         const std::string& path, std::uint64_t offset,
                                         WriteOptions options = {}) = 0;
  virtual Result<RequestId> async_pread(void* buffer, std::size_t nbytes, int fd,
                                        std::uint64_t offset) = 0;
  virtual Result<RequestId> async_pwrite(const void* buffer, std::size_t nbytes, int fd,
                                         std::uint64_t offset) = 0;

  // Waits for one request; returns its status. Waiting twice for the same id, or for an
  // unknown id, is an InvalidArgument error.
  virtual Status wait(RequestId id) = 0;
  // Waits for every request submitted so far. Sets *completed (if given) to how many
  // requests finished and returns the first failure among them (all are still drained).
  virtual Status wait_all(std::size_t* completed = nullptr) = 0;
  // Requests submitted but not yet waited for.
  virtual std::size_t pending() const = 0;
  // Counters (see HandleStats). Implementations other than the engine's may return zeros.
  virtual HandleStats stats() const { return {}; }

 protected:
  Handle() = default;
};

}  // namespace zinf::aio
