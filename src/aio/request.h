// Internal: one aio request, its per-worker slices (tasks) and the tracker that waiters block on.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "aio/file.h"
#include "zinf/aio/handle.h"
#include "zinf/status.h"

namespace zinf::aio::detail {

struct Request;

// The part of a request one worker issues: the file range [begin, end). Touched only by the
// worker it was posted to, from posting until the worker reports it finished.
struct Task {
  Request* request = nullptr;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t cursor = 0;     // next file byte to issue
  std::uint32_t in_flight = 0;  // chunks issued and not yet completed
};

// Immutable after submission except where noted. Owned by the RequestTracker; workers hold
// raw pointers until the last task finishes (finish_task), after which they never touch it.
struct Request {
  RequestId id = 0;
  bool is_write = false;
  std::byte* buffer = nullptr;  // caller's memory (written to only for reads)
  std::size_t nbytes = 0;
  std::uint64_t offset = 0;
  std::string path;  // the file, or "fd:<n>" for fd-based requests
  UniqueFd owned_fd;  // path-based requests: opened here, closed when the request finishes
  int fd = -1;        // the descriptor the I/O goes to (owned_fd or the caller's)
  bool direct = false;  // fd has O_DIRECT: offsets, lengths and buffers of ops must be aligned
  UniqueFd edge_fd;     // buffered twin for unaligned heads/tails of an O_DIRECT request
  bool fdatasync = false;
  std::chrono::steady_clock::time_point deadline;  // set by the tracker at submission
  std::vector<Task> tasks;

  std::atomic<std::size_t> tasks_left{0};
  std::atomic<bool> failed{false};  // set with the first error; workers stop issuing its chunks
  std::mutex error_mutex;
  Status error;  // first failure, under error_mutex

  // Guarded by the tracker's mutex.
  bool done = false;
  bool claimed = false;  // a wait() has taken it
  bool expired = false;  // failed for its deadline

  const char* op_name() const { return is_write ? "pwrite" : "pread"; }
  // Records `status` if it is the request's first failure.
  void fail(Status status);
};

// Owns requests from submission until a wait() returns them; wakes waiters on completion.
class RequestTracker {
 public:
  // `timeout`: how long a request may run from submission before a wait fails it.
  explicit RequestTracker(std::chrono::nanoseconds timeout) : timeout_(timeout) {}

  // Takes ownership and assigns the id. A request added `claimed` (a blocking call's) is
  // invisible to wait(), wait_all() and pending(); only wait_claimed() returns it.
  Request* add(std::unique_ptr<Request> request, bool claimed);
  // Final step of a request (after its I/O, fdatasync and closes): marks it done.
  void complete(Request& request);
  Status wait(RequestId id);
  Status wait_claimed(RequestId id);
  Status wait_all(std::size_t* completed);
  std::size_t pending() const;
  std::uint64_t finished() const;
  // Blocks until every request, waited for or not, has completed.
  void drain();
  // Fails `request`, unfinished and past its deadline, for that deadline (once) and logs it. For
  // the worker that holds its chunks in flight (any thread; takes the tracker's lock).
  void expire_late(Request& request);

 private:
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  // Waits for a claimed request and removes it. Called with mutex_ held through `lock`.
  Status take(std::unique_lock<std::mutex>& lock, RequestId id);
  // Waits until `request` is done. Past its deadline it is failed (its chunks not yet issued
  // are dropped by the workers) and the wait goes on until those in flight have drained.
  void wait_done(std::unique_lock<std::mutex>& lock, Request& request);
  // Fails `request` for its deadline (once) and logs it; its chunks in flight still drain.
  void expire(Request& request);

  const std::chrono::nanoseconds timeout_;
  std::unordered_map<RequestId, std::unique_ptr<Request>> requests_;
  std::size_t unclaimed_ = 0;
  std::size_t running_ = 0;
  std::uint64_t finished_ = 0;
  RequestId next_id_ = 1;
};

// Called by the worker that finishes a request's last task (or by the submitter for an empty
// request): fdatasync if asked, close the handle's descriptors (a failed close of a written
// file is an error), then complete it in `tracker`.
void finish_request(Request& request, RequestTracker& tracker);

}  // namespace zinf::aio::detail
