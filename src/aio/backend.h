// Internal: the per-worker backend queue interface (io_uring ring, libaio context, pread loop).
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "zinf/aio/fault.h"
#include "zinf/aio/handle.h"
#include "zinf/status.h"

namespace zinf::aio::detail {

// One read or write of `len` bytes between `buf` and `fd` at `offset`. `tag` comes back in
// the completion (it is the worker's slot index, < capacity()). `fixed_index` >= 0 names a
// registered buffer that contains [buf, buf+len) (io_uring only; others ignore it).
// `path` points at the request's path (or "fd:<n>") and stays valid while the op is in flight;
// only the fault wrapper reads it.
struct IoOp {
  bool is_write = false;
  int fd = -1;
  void* buf = nullptr;
  std::size_t len = 0;
  std::uint64_t offset = 0;
  std::uint32_t tag = 0;
  int fixed_index = -1;
  const std::string* path = nullptr;
};

// result: bytes transferred (>= 0) or -errno.
struct IoCompletion {
  std::uint32_t tag = 0;
  std::int64_t result = 0;
};

// A queue owned by one worker thread and used only from it (not thread-safe).
// Contract: every op passed to prepare() produces exactly one completion from reap(), also
// when the kernel refuses it at submission (then its result is -errno). At most capacity()
// ops may be prepared or in flight at once; the caller enforces this.
class BackendQueue {
 public:
  virtual ~BackendQueue() = default;
  virtual std::size_t capacity() const = 0;
  // Stages one op; it is not started before submit().
  virtual void prepare(const IoOp& op) = 0;
  // Starts every staged op (one system call where the backend allows it). Retries EINTR and
  // EAGAIN with a bounded backoff; ops the kernel still refuses complete with -errno.
  virtual void submit() = 0;
  // Waits until at least `min_complete` completions are available (0: do not block), then
  // stores up to `max` of them in `out`. Returns how many were stored. Fails only when the
  // queue itself is broken (the worker then fails every op it has in flight).
  virtual Result<std::size_t> reap(IoCompletion* out, std::size_t max, std::size_t min_complete) = 0;
  // Replaces the registered (fixed) buffers with `ranges` (empty: none). Only called while
  // nothing is in flight. Returns false when the backend has no fixed buffers or the kernel
  // refused them (then ops must use fixed_index -1); `why` says what happened.
  virtual bool set_fixed_buffers(std::span<const iovec> ranges, std::string* why) {
    (void)ranges;
    if (why != nullptr) why->clear();
    return false;
  }
  virtual bool supports_fixed_buffers() const { return false; }
};

// Factories; each is defined by its backend's file, or by *_missing.cpp when the build lacks it.
Result<std::unique_ptr<BackendQueue>> make_uring_queue(std::size_t depth);
Result<std::unique_ptr<BackendQueue>> make_libaio_queue(std::size_t depth);
Result<std::unique_ptr<BackendQueue>> make_thread_queue(std::size_t depth);
// Wraps `inner` so every completion passes through `faults` first.
std::unique_ptr<BackendQueue> make_fault_queue(std::unique_ptr<BackendQueue> inner,
                                               std::shared_ptr<FaultInjector> faults);

// Whether the kernel accepts the backend (uncached; backend_available() caches). `why` says
// why not.
bool probe_uring(std::string* why);
bool probe_libaio(std::string* why);

// The queue for `backend` (not kAuto) with `depth` slots, wrapped for faults when given.
Result<std::unique_ptr<BackendQueue>> make_backend_queue(Backend backend, std::size_t depth,
                                                         const std::shared_ptr<FaultInjector>& faults);

// Ok when `backend` (not kAuto) can run here; otherwise Unsupported naming aio.backend and why.
Status check_backend(Backend backend);

// Largest length one io_uring fixed-buffer registration entry may cover.
inline constexpr std::size_t kMaxFixedEntryBytes = std::size_t{1} << 30;

}  // namespace zinf::aio::detail
