// Fault injection for the aio engine: fail, shorten or delay chosen chunk completions (tests).
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
};

struct FaultDecision {
  bool fail = false;
  int errno_value = 0;
  std::size_t shorten_by = 0;
  std::chrono::microseconds delay{0};
  bool zero = false;
};

// Thread-safe. Shared by the test and the handle (AioConfig::faults).
class FaultInjector {
 public:
  void add(FaultRule rule);
  void clear();
  // Called by the engine for each chunk completion before it is processed.
  FaultDecision on_completion(bool is_write, const std::string& path);
  // How many completions some rule changed.
  std::uint64_t injected() const { return injected_.load(); }

 private:
  struct Active {
    FaultRule rule;
    std::uint64_t seen = 0;
  };
  std::mutex mutex_;
  std::vector<Active> rules_;
  std::atomic<std::uint64_t> injected_{0};
};

}  // namespace zinf::aio
