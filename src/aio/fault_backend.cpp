// Fault-injecting wrapper around any backend queue: fails, shortens or delays completions, breaks
// the queue, or holds ops back until they are cancelled or the queue is torn down.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>
#include <vector>

#include "aio/backend.h"
#include "aio/file.h"

namespace zinf::aio::detail {
namespace {

// Waits until `until`; a queue whose only ops are held back never completes them by itself,
// so a caller with no limit waits as on a device that does not answer.
void sleep_until(Clock::time_point until) {
  while (Clock::now() < until) {
    std::this_thread::sleep_for(std::min<Clock::duration>(until - Clock::now(), std::chrono::hours(1)));
  }
}

class FaultQueue final : public BackendQueue {
 public:
  FaultQueue(std::unique_ptr<BackendQueue> inner, std::shared_ptr<FaultInjector> faults)
      : inner_(std::move(inner)), faults_(std::move(faults)), ops_(inner_->capacity()) {}
  // Ops still held when the queue goes away run now, as a device would answer at last. A queue
  // that was drained holds none; one that was not shows it here, in the caller's memory.
  ~FaultQueue() override {
    for (Held& held : held_) run(held);
  }
  FaultQueue(const FaultQueue&) = delete;
  FaultQueue& operator=(const FaultQueue&) = delete;

  std::size_t capacity() const override { return inner_->capacity(); }

  void prepare(const IoOp& op) override {
    ops_[op.tag] = Seen{op.is_write, op.path};
    const FaultDecision d = faults_->on_issue(op.is_write, op.path != nullptr ? *op.path : kNoPath);
    if (d.stall) {
      // The kernel holds a reference to the file of an op in flight: so does the held op.
      held_.push_back(Held{op, UniqueFd(::fcntl(op.fd, F_DUPFD_CLOEXEC, 0)), d.stall_cancellable});
      return;
    }
    inner_->prepare(op);
    ++inner_out_;
  }

  void submit() override { inner_->submit(); }

  Result<std::size_t> reap(IoCompletion* out, std::size_t max, std::size_t min_complete,
                           Clock::time_point until) override {
    if (!broken_.is_ok()) return broken_;
    std::size_t n = 0;
    while (!ready_.empty() && n < max) {
      out[n++] = ready_.back();
      ready_.pop_back();
    }
    const std::size_t want = min_complete > n ? min_complete - n : 0;
    // Held ops complete only through cancel(): ask the inner queue for no more than it has.
    const std::size_t inner_want = std::min(want, inner_out_);
    if (n < max) {
      Result<std::size_t> got = inner_->reap(out + n, max - n, inner_want, until);
      if (!got.is_ok()) return got;
      inner_out_ -= got.value();
      ZINF_RETURN_IF_ERROR(apply_faults(out + n, got.value()));
      n += got.value();
    }
    if (n < min_complete) sleep_until(until);
    return n;
  }

  void cancel(std::uint32_t tag) override {
    for (auto it = held_.begin(); it != held_.end(); ++it) {
      if (it->op.tag != tag) continue;
      if (it->cancellable) {
        ready_.push_back(IoCompletion{tag, -ECANCELED});
        held_.erase(it);
      }
      return;
    }
    inner_->cancel(tag);
  }

  Result<DrainReport> cancel_and_drain(Clock::time_point deadline) override {
    DrainReport report;
    for (const IoCompletion& c : ready_) ++(c.result == -ECANCELED ? report.cancelled : report.finished);
    ready_.clear();
    ZINF_ASSIGN_OR_RETURN(const DrainReport inner, inner_->cancel_and_drain(deadline));
    report.cancelled += inner.cancelled;
    report.finished += inner.finished;
    report.late += inner.late;
    // Held ops: cancellable ones stop; the others never answer before the deadline, and then
    // the teardown makes the device finish them (they move their data now, before this returns).
    std::vector<Held> uncancellable;
    for (Held& held : held_) {
      if (held.cancellable) {
        ++report.cancelled;
      } else {
        uncancellable.push_back(std::move(held));
      }
    }
    held_.clear();
    if (!uncancellable.empty()) {
      sleep_until(deadline);
      report.late += uncancellable.size();
      for (Held& held : uncancellable) run(held);
    }
    return report;
  }

  bool supports_fixed_buffers() const override { return inner_->supports_fixed_buffers(); }
  bool set_fixed_buffers(std::span<const iovec> ranges, std::string* why) override {
    return inner_->set_fixed_buffers(ranges, why);
  }

 private:
  struct Seen {
    bool is_write = false;
    const std::string* path = nullptr;
  };
  // An op held back by kStall, with its own reference to the file.
  struct Held {
    IoOp op;
    UniqueFd fd;
    bool cancellable = true;
  };

  static void run(const Held& held) {
    const IoOp& op = held.op;
    const auto offset = static_cast<off_t>(op.offset);
    (void)(op.is_write ? ::pwrite(held.fd.get(), op.buf, op.len, offset) : ::pread(held.fd.get(), op.buf, op.len, offset));
  }

  // Passes `count` completions of the inner queue through the rules. A broken queue loses them.
  Status apply_faults(IoCompletion* out, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) {
      const Seen& seen = ops_[out[i].tag];
      const FaultDecision d = faults_->on_completion(seen.is_write, seen.path ? *seen.path : kNoPath);
      if (d.delay.count() > 0) std::this_thread::sleep_for(d.delay);
      if (d.break_queue) {
        broken_ = Status::sys_error("reap: the backend queue broke (injected fault)", d.errno_value);
        return broken_;
      }
      std::int64_t& result = out[i].result;
      if (d.fail) {
        result = -static_cast<std::int64_t>(d.errno_value);
      } else if (d.zero && result > 0) {
        result = 0;
      } else if (d.shorten_by > 0 && result > 1) {
        // Never shorten to 0: for a read that would mean end of file, not a short transfer.
        const auto by = static_cast<std::int64_t>(d.shorten_by);
        result = result > by ? result - by : 1;
      }
    }
    return Status::ok();
  }

  static inline const std::string kNoPath;
  std::unique_ptr<BackendQueue> inner_;
  std::shared_ptr<FaultInjector> faults_;
  std::vector<Seen> ops_;             // by tag (slot index)
  std::vector<Held> held_;            // kStall ops, not yet cancelled
  std::vector<IoCompletion> ready_;   // held ops that cancel() stopped, not yet reaped
  std::size_t inner_out_ = 0;         // ops handed to the inner queue and not yet reaped from it
  Status broken_;
};

}  // namespace

std::unique_ptr<BackendQueue> make_fault_queue(std::unique_ptr<BackendQueue> inner,
                                               std::shared_ptr<FaultInjector> faults) {
  return std::make_unique<FaultQueue>(std::move(inner), std::move(faults));
}

}  // namespace zinf::aio::detail
