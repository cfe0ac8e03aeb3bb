// Portable backend queue: the worker thread itself runs each staged op with pread/pwrite.
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "aio/backend.h"

namespace zinf::aio::detail {
namespace {

// One system call per op; short transfers and EINTR come back as completions so the engine's
// single retry path handles them for every backend alike. Ops run inside reap() on the calling
// thread, so when reap() has returned no op is running: cancel() and cancel_and_drain() only
// drop the ones not yet started.
class ThreadQueue final : public BackendQueue {
 public:
  explicit ThreadQueue(std::size_t depth) : depth_(depth), ring_(depth) {}

  std::size_t capacity() const override { return depth_; }
  // A ring of depth entries: the engine never has more than depth ops staged at once.
  void prepare(const IoOp& op) override {
    ring_[(head_ + count_) % depth_] = Entry{op, false};
    ++count_;
  }
  void submit() override {}

  Result<std::size_t> reap(IoCompletion* out, std::size_t max, std::size_t min_complete,
                           Clock::time_point until) override {
    (void)min_complete;  // every staged op completes here, so any minimum up to staged is met
    (void)until;         // and nothing is waited for but the system calls themselves
    std::size_t n = 0;
    while (count_ > 0 && n < max) {
      const Entry& e = ring_[head_];
      head_ = (head_ + 1) % depth_;
      --count_;
      if (e.cancelled) {
        out[n++] = IoCompletion{e.op.tag, -ECANCELED};
        continue;
      }
      const IoOp& op = e.op;
      const ssize_t rc = op.is_write ? ::pwrite(op.fd, op.buf, op.len, static_cast<off_t>(op.offset))
                                     : ::pread(op.fd, op.buf, op.len, static_cast<off_t>(op.offset));
      out[n++] = IoCompletion{op.tag, rc < 0 ? -static_cast<std::int64_t>(errno) : rc};
    }
    return n;
  }

  void cancel(std::uint32_t tag) override {
    for (std::size_t i = 0; i < count_; ++i) {
      Entry& e = ring_[(head_ + i) % depth_];
      if (e.op.tag == tag) e.cancelled = true;
    }
  }

  Result<DrainReport> cancel_and_drain(Clock::time_point deadline) override {
    (void)deadline;
    DrainReport report;
    report.cancelled = count_;
    count_ = 0;
    return report;
  }

 private:
  struct Entry {
    IoOp op;
    bool cancelled = false;
  };
  std::size_t depth_;
  std::vector<Entry> ring_;
  std::size_t head_ = 0;
  std::size_t count_ = 0;
};

}  // namespace

Result<std::unique_ptr<BackendQueue>> make_thread_queue(std::size_t depth) {
  return std::unique_ptr<BackendQueue>(std::make_unique<ThreadQueue>(depth));
}

}  // namespace zinf::aio::detail
