// Internal: the per-worker backend queue interface (io_uring ring, libaio context, pread loop).
#pragma once

#include <sys/uio.h>

#include <algorithm>

#include <chrono>
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

using Clock = std::chrono::steady_clock;

// The timeout a kernel wait takes for `until`: what is left of it (possibly 0) in `ts`, a
// timespec or io_uring's __kernel_timespec, or nullptr for no limit (Clock::time_point::max()).
template <typename Timespec>
Timespec* timeout_until(Clock::time_point until, Timespec* ts) {
  if (until == Clock::time_point::max()) return nullptr;
  const auto left = std::max(until - Clock::now(), Clock::duration::zero());
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
  ts->tv_sec = ns / 1000000000;
  ts->tv_nsec = ns % 1000000000;
  return ts;
}

// What BackendQueue::cancel_and_drain found. Every op not yet reaped when it was called is in
// exactly one of the three counts (an op the kernel refused at submission counts as cancelled).
struct DrainReport {
  std::size_t cancelled = 0;  // stopped before they moved data (-ECANCELED), or never started
  std::size_t finished = 0;   // completed anyway, in the kernel's own time (their results are dropped)
  std::size_t late = 0;       // still out at the deadline: the queue's teardown waited for them
};

// A queue owned by one worker thread and used only from it (not thread-safe).
// Contract: every op passed to prepare() produces exactly one completion from reap(), also
// when the kernel refuses it at submission (then its result is -errno) or cancel() stops it,
// unless cancel_and_drain() consumes it. At most capacity() ops may be prepared or in flight at
// once; the caller enforces this. While an op is in flight the kernel (or the thread pool) may
// read or write its buffer: the caller must not reuse or free that memory before the op's
// completion has been reaped or cancel_and_drain() has returned.
class BackendQueue {
 public:
  virtual ~BackendQueue() = default;
  virtual std::size_t capacity() const = 0;
  // Stages one op; it is not started before submit().
  virtual void prepare(const IoOp& op) = 0;
  // Starts every staged op (one system call where the backend allows it). Retries EINTR and
  // EAGAIN with a bounded backoff; ops the kernel still refuses complete with -errno.
  virtual void submit() = 0;
  // Waits until at least `min_complete` completions are available (0: do not block) or `until`
  // has passed (Clock::time_point::max(): no limit), then stores up to `max` of them in `out`.
  // Returns how many were stored, which is fewer than `min_complete` only when `until` passed.
  // Fails only when the queue itself is broken; the caller must then cancel_and_drain() it
  // before it reports any of its ops failed, and use a new queue.
  virtual Result<std::size_t> reap(IoCompletion* out, std::size_t max, std::size_t min_complete,
                                   Clock::time_point until) = 0;
  // Asks the kernel to stop op `tag` (submitted, not yet reaped) early; does not block. Best
  // effort: the op still completes through reap(), with -ECANCELED when it was stopped before
  // it moved data, else with whatever result it reached (ops on regular files that a device
  // already works on usually cannot be stopped). io_uring: IORING_OP_ASYNC_CANCEL on the op;
  // libaio: io_cancel; threads: an op not yet started is dropped (-ECANCELED).
  virtual void cancel(std::uint32_t tag) = 0;
  // Tears the queue down safely: cancels every op staged or in flight where the backend can,
  // waits until `deadline` for all of them to come back, and past it waits on without a bound,
  // in the way that returns only once the kernel has released every op (libaio: io_destroy,
  // which blocks until all requests are done; io_uring: waiting for every op's completion).
  // When it returns Ok, no op ever prepared on this queue reads or writes memory any more: the
  // caller may reuse or free every buffer, and report the ops failed. Completions of those ops
  // are consumed here (reap() does not return them). The queue takes no op afterwards; destroy
  // it. Works on a broken queue (the reason to call it). Fails only when the kernel could not be
  // shown to have let go (the queue's completion ring itself is unusable); the caller must then
  // keep the queue (never destroy it) and treat the ops' memory as in use.
  virtual Result<DrainReport> cancel_and_drain(Clock::time_point deadline) = 0;
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
