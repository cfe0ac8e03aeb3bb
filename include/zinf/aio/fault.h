// Fault injection for the aio engine: fail, shorten or delay chosen chunk completions, break a
// backend queue, or hold ops back as a device that does not answer would (tests).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace zinf::aio {

enum class FaultOp { kAny, kRead, kWrite };
enum class FaultAction {
  kFail,     // the chunk completes with -errno_value
  kShorten,  // the chunk completes with fewer bytes than asked (once; the engine must retry)
  kDelay,    // the chunk completes after `delay`
  kZero,     // the chunk completes with 0 bytes moved (once; the engine must retry)
  // The completion is lost and the backend queue breaks: its reap() fails from then on, as when
  // io_uring_wait_cqe or io_getevents fails. The engine must cancel and drain the queue's ops
  // before it reports them failed, then go on with a new queue.
  kBreakQueue,
  // Decided when the chunk's op is handed to the backend, not at completion: the op is held
  // back, as by a device that does not answer. It starts only when cancel() stops it
  // (-ECANCELED, nothing moved; never when `cancellable` is false) or when its queue is torn
  // down (cancel_and_drain past its deadline, or the queue's destruction), which runs it then:
  // it reads or writes the caller's memory at that moment, as a late kernel op would. An engine
  // that reported the request failed without draining the op sees its buffer change afterwards.
  kStall,
};

struct FaultRule {
  FaultAction action = FaultAction::kFail;
  FaultOp op = FaultOp::kAny;
  std::string path_contains;  // empty: any path (fd-based requests have path "fd:<n>")
  std::uint64_t skip = 0;     // let this many matching chunks through first
  std::uint64_t count = 1;    // then apply to this many (UINT64_MAX: every one after)
  int errno_value = 5;        // EIO
  std::size_t shorten_by = 512;
  std::chrono::microseconds delay{1000};
  bool cancellable = true;  // kStall: whether cancel() stops the held op
};

struct FaultDecision {
  bool fail = false;
  int errno_value = 0;
  std::size_t shorten_by = 0;
  std::chrono::microseconds delay{0};
  bool zero = false;
  bool break_queue = false;
  bool stall = false;
  bool stall_cancellable = true;
};

// Thread-safe. Shared by the test and the handle (AioConfig::faults).
class FaultInjector {
 public:
  void add(FaultRule rule);
  void clear();
  // Called by the engine for each chunk completion before it is processed (every rule but kStall).
  FaultDecision on_completion(bool is_write, const std::string& path);
  // Called when a chunk's op is handed to the backend (kStall rules only).
  FaultDecision on_issue(bool is_write, const std::string& path);
  // How many completions some rule changed.
  std::uint64_t injected() const { return injected_.load(); }

 private:
  struct Active {
    FaultRule rule;
    std::uint64_t seen = 0;
  };
  FaultDecision decide(bool is_write, const std::string& path, bool at_issue);

  std::mutex mutex_;
  std::vector<Active> rules_;
  std::atomic<std::uint64_t> injected_{0};
};

}  // namespace zinf::aio
