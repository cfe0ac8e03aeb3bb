// Internal: one aio worker thread: takes tasks, cuts them into chunks, keeps its queue full.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "aio/backend.h"
#include "aio/file.h"
#include "aio/request.h"
#include "zinf/aio/handle.h"

namespace zinf::aio::detail {

// Owns a backend queue and the thread that drives it. post() and set_fixed_buffers() may be
// called from any thread; everything else runs on the worker thread.
class Worker {
 public:
  Worker(std::size_t index, const AioConfig& config, Backend backend, RequestTracker& tracker,
         std::unique_ptr<BackendQueue> queue);
  ~Worker();  // stops and joins (the handle drains requests first)
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void start();
  // Asks the thread to exit once it has no work; the destructor joins it. Stopping every
  // worker first lets their queues be torn down in parallel.
  void request_stop();
  void post(Task* task);
  // Replaces the fixed buffers at the worker's next idle moment and waits until it has.
  // Returns false (with `why`) when the backend refused them; ops then run unfixed.
  bool set_fixed_buffers(std::vector<iovec> ranges, std::string* why);
  // Fixed at construction (the queue itself goes away when the thread exits).
  bool supports_fixed_buffers() const { return supports_fixed_; }
  // Adds this worker's counters to `stats` (any thread).
  void add_stats(HandleStats& stats) const;

 private:
  enum class ChunkKind : std::uint8_t {
    kDirect,   // the op uses the caller's memory on the request's descriptor
    kBounced,  // O_DIRECT file, unaligned caller memory: the op uses an aligned bounce buffer
    kEdge,     // unaligned head or tail of an O_DIRECT request: exact bytes on the buffered twin
  };
  enum class PlanResult : std::uint8_t { kPlanned, kBlocked, kFailed };
  // One chunk in flight or waiting for a retry. `done` bytes of [0, len) are complete;
  // the op in the kernel covers [issued, len).
  struct Slot {
    Task* task = nullptr;
    ChunkKind kind = ChunkKind::kDirect;
    std::uint64_t file_offset = 0;
    std::byte* user = nullptr;  // caller's memory for this chunk
    std::byte* io = nullptr;    // memory the op uses (user, or a bounce buffer)
    std::size_t len = 0;
    std::size_t done = 0;
    std::size_t issued = 0;
    int fd = -1;
    int fixed_index = -1;
    int bounce = -1;
    std::uint32_t stalls = 0;  // retries without progress (EINTR, EAGAIN, no bytes)
    bool queued = false;       // its op is in the backend queue (issued, not yet completed)
    bool cancel_sent = false;  // the backend was asked to cancel that op (its request failed)
    Clock::time_point drain_by{};  // after cancel_sent: when the queue is torn down if it is not back
  };

  void run();
  // Blocks until there is work; false when the worker should exit.
  bool wait_for_work();
  bool take_posted();
  // Issues pending retries and, when `new_chunks`, new chunks until the queue is full.
  void fill(bool new_chunks);
  PlanResult plan_chunk(Task& task, Slot& slot);
  void issue(std::uint32_t tag);
  void reap();
  void on_complete(std::uint32_t tag, std::int64_t result);
  void on_no_progress(std::uint32_t tag);
  void retry(std::uint32_t tag);
  void finish_slot(std::uint32_t tag);
  void fail_slot(std::uint32_t tag, Status status);
  void maybe_finish_task(Task& task);
  void apply_fixed_buffers();
  // Expires requests past their deadline, cancels the ops of failed requests, and tears the
  // queue down when a cancelled op is not back within the grace period. Sets next_check_.
  void check_in_flight();
  // Cancels and drains the queue (waiting for its ops until `deadline`, then for as long as the
  // kernel takes), then fails every chunk it held and goes on with a new queue.
  void fail_all_in_flight(const Status& status, Clock::time_point deadline);
  int find_fixed(const std::byte* p, std::size_t len) const;
  Status ensure_bounce();

  const std::size_t index_;
  const AioConfig config_;
  const Backend backend_;
  RequestTracker& tracker_;
  std::unique_ptr<BackendQueue> queue_;
  const bool supports_fixed_;
  // How long a cancelled op may take to come back (aio.request_timeout_s), and how long a
  // broken queue's ops are waited for before its teardown.
  const Clock::duration grace_;
  // Queues whose drain could not show that the kernel let go of their ops: kept (not torn down)
  // until the worker exits.
  std::vector<std::unique_ptr<BackendQueue>> retired_;
  std::thread thread_;

  // Written only by the worker thread, read by stats().
  struct Counters {
    std::atomic<std::uint64_t> ops{0};
    std::atomic<std::uint64_t> retries{0};
    std::atomic<std::uint64_t> fixed_ops{0};
    std::atomic<std::uint64_t> bounced_bytes{0};
    std::atomic<std::uint64_t> edge_ops{0};
    std::atomic<std::uint64_t> cancels{0};
    std::atomic<std::uint64_t> queue_resets{0};
  };
  static void bump(std::atomic<std::uint64_t>& counter, std::uint64_t by = 1) {
    counter.store(counter.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
  }
  Counters counters_;

  // Shared with posting threads.
  std::mutex mutex_;
  std::condition_variable wake_cv_;
  std::condition_variable fixed_cv_;
  std::deque<Task*> posted_;
  std::atomic<std::size_t> posted_count_{0};
  bool stop_ = false;
  std::atomic<std::uint64_t> fixed_wanted_{0};
  std::uint64_t fixed_applied_ = 0;
  std::vector<iovec> fixed_pending_;
  bool fixed_ok_ = false;
  std::string fixed_why_;

  // Worker-thread state.
  std::deque<Task*> active_;
  std::vector<Slot> slots_;
  std::vector<std::uint32_t> free_slots_;
  std::vector<std::uint32_t> retries_;
  std::vector<IoCompletion> completions_;
  std::size_t submitted_ = 0;  // ops handed to the queue and not yet reaped
  std::size_t staged_ = 0;     // ops prepared and not yet submitted
  // When check_in_flight() must next run: the earliest deadline of a queued op's request, or of
  // a cancelled op's drain_by (max: none queued).
  Clock::time_point next_check_ = Clock::time_point::max();
  std::uint64_t fixed_seen_ = 0;  // generation of fixed buffers this thread has applied
  std::vector<iovec> fixed_;      // registered ranges in kernel index order (when fixed_in_use_)
  bool fixed_in_use_ = false;
  AlignedBuffer bounce_memory_;
  std::size_t bounce_size_ = 0;
  std::vector<int> free_bounces_;
};

}  // namespace zinf::aio::detail
