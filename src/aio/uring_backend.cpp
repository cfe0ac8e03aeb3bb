// io_uring backend queue (liburing): one ring per worker, batched submits, fixed buffers,
// cancellation (IORING_OP_ASYNC_CANCEL) and a drain that waits for every op in flight.
#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "aio/backend.h"

namespace zinf::aio::detail {
namespace {

constexpr int kMaxSubmitRetries = 64;
// user_data of the queue's own cancel requests; ops carry their tag (< capacity) instead.
constexpr std::uint64_t kCancelData = ~std::uint64_t{0};

class UringQueue final : public BackendQueue {
 public:
  explicit UringQueue(std::size_t depth) : depth_(depth), state_(depth, OpState::kIdle) {}
  ~UringQueue() override {
    if (initialised_) io_uring_queue_exit(&ring_);
  }
  UringQueue(const UringQueue&) = delete;
  UringQueue& operator=(const UringQueue&) = delete;

  Status init() {
    // Cooperative task running and submit-all are optional (5.18/5.19); fall back to plain.
    const unsigned preferred = IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN |
                               IORING_SETUP_TASKRUN_FLAG;
    int rc = io_uring_queue_init(static_cast<unsigned>(depth_), &ring_, preferred);
    if (rc == -EINVAL) rc = io_uring_queue_init(static_cast<unsigned>(depth_), &ring_, 0);
    if (rc < 0) return Status::sys_error(fmt::format("io_uring_queue_init({})", depth_), -rc);
    initialised_ = true;
    cqes_.resize(depth_);
    return Status::ok();
  }

  std::size_t capacity() const override { return depth_; }

  void prepare(const IoOp& op) override {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    // The caller never has more than capacity() ops staged or in flight, and submitted SQEs
    // leave the ring at once, so there is always a free SQE.
    if (sqe == nullptr) {
      refused_.push_back(IoCompletion{op.tag, -EBUSY});
      return;
    }
    const auto len = static_cast<unsigned>(op.len);
    if (op.fixed_index >= 0 && fixed_) {
      if (op.is_write) {
        io_uring_prep_write_fixed(sqe, op.fd, op.buf, len, op.offset, op.fixed_index);
      } else {
        io_uring_prep_read_fixed(sqe, op.fd, op.buf, len, op.offset, op.fixed_index);
      }
    } else if (op.is_write) {
      io_uring_prep_write(sqe, op.fd, op.buf, len, op.offset);
    } else {
      io_uring_prep_read(sqe, op.fd, op.buf, len, op.offset);
    }
    io_uring_sqe_set_data64(sqe, op.tag);
    pending_.push_back(op.tag);
    state_[op.tag] = OpState::kQueued;
  }

  void submit() override {
    int attempts = 0;
    while (!pending_.empty()) {
      const int rc = io_uring_submit(&ring_);
      if (rc > 0) {
        taken(static_cast<std::size_t>(rc));
        attempts = 0;
        continue;
      }
      if ((rc == -EINTR || rc == -EAGAIN || rc == -EBUSY || rc == 0) && ++attempts < kMaxSubmitRetries) {
        std::this_thread::sleep_for(std::chrono::microseconds(10 << std::min(attempts, 10)));
        continue;
      }
      // The kernel keeps refusing: the staged SQEs are still in the ring and must not run
      // later on buffers the caller has been told are free, so the ring is retired (its
      // cancel_and_drain never enters the kernel in a way that would submit them).
      broken_ = rc < 0 ? -rc : EIO;
      return;
    }
  }

  Result<std::size_t> reap(IoCompletion* out, std::size_t max, std::size_t min_complete,
                           Clock::time_point until) override {
    std::size_t n = take_refused(out, max);
    if (broken_ != 0) {
      return Status::sys_error("io_uring_submit", broken_);
    }
    for (;;) {
      n += take_cqes(out + n, max - n, nullptr);
      if (n >= min_complete || n >= max) return n;
      __kernel_timespec ts{};
      io_uring_cqe* cqe = nullptr;
      // Cancel requests' completions count here too, so this may wake early: then loop.
      const int rc = io_uring_wait_cqes(&ring_, &cqe, static_cast<unsigned>(min_complete - n),
                                        timeout_until(until, &ts), nullptr);
      if (rc == -ETIME) return n + take_cqes(out + n, max - n, nullptr);
      if (rc == -EINTR || rc == -EAGAIN) continue;
      if (rc < 0) return Status::sys_error("io_uring_wait_cqe", -rc);
    }
  }

  void cancel(std::uint32_t tag) override {
    if (broken_ != 0 || state_[tag] != OpState::kInFlight) return;
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) return;
    io_uring_prep_cancel64(sqe, tag, 0);
    io_uring_sqe_set_data64(sqe, kCancelData);
    pending_.push_back(kCancelData);
    state_[tag] = OpState::kCancelSent;
    submit();
  }

  Result<DrainReport> cancel_and_drain(Clock::time_point deadline) override {
    DrainReport report;
    report.cancelled += refused_.size();
    refused_.clear();
    // Op SQEs the kernel never took (a refused submit) never start as long as nothing submits
    // again: then no cancel is sent either, and, on kernels without IORING_FEAT_EXT_ARG (5.11),
    // only untimed waits are used (liburing's timed wait would submit them with its timeout).
    bool stale_ops = false;
    for (const std::uint64_t data : pending_) {
      if (data == kCancelData) continue;
      stale_ops = true;
      state_[data] = OpState::kIdle;
      ++report.cancelled;
    }
    if (!stale_ops && broken_ == 0) {
      for (std::uint32_t tag = 0; tag < depth_; ++tag) cancel(tag);
    }
    const bool timed = !stale_ops || (ring_.features & IORING_FEAT_EXT_ARG) != 0;
    bool past = false;
    while (in_flight_ > 0) {
      take_cqes(nullptr, depth_, past ? nullptr : &report);
      if (in_flight_ == 0) break;
      if (!past && (!timed || Clock::now() >= deadline)) {
        // Past the deadline: there is no teardown that returns before the kernel lets go of
        // an op's memory (io_uring_queue_exit does not wait for them), so wait without a bound.
        past = true;
        report.late = in_flight_;
        continue;
      }
      __kernel_timespec ts{};
      io_uring_cqe* cqe = nullptr;
      const int rc = past ? io_uring_wait_cqe(&ring_, &cqe)
                          : io_uring_wait_cqes(&ring_, &cqe, 1, timeout_until(deadline, &ts), nullptr);
      if (rc == 0 || rc == -ETIME || rc == -EINTR || rc == -EAGAIN) continue;
      return Status::sys_error(fmt::format("io_uring_wait_cqe while draining the ring ({} ops still in the kernel, "
                                           "which may still use their buffers)",
                                           in_flight_),
                               -rc);
    }
    broken_ = broken_ != 0 ? broken_ : ESHUTDOWN;  // takes no op any more
    return report;
  }

  bool supports_fixed_buffers() const override { return true; }

  bool set_fixed_buffers(std::span<const iovec> ranges, std::string* why) override {
    if (why != nullptr) why->clear();
    if (fixed_) {
      io_uring_unregister_buffers(&ring_);
      fixed_ = false;
    }
    if (ranges.empty()) return false;
    const int rc = io_uring_register_buffers(&ring_, ranges.data(), static_cast<unsigned>(ranges.size()));
    if (rc < 0) {
      if (why != nullptr) *why = std::strerror(-rc);
      return false;
    }
    fixed_ = true;
    return true;
  }

 private:
  enum class OpState : std::uint8_t {
    kIdle,
    kQueued,      // its SQE is written, the kernel has not taken it yet
    kInFlight,    // the kernel has it
    kCancelSent,  // the kernel has it, and a cancel request for it was submitted
  };

  std::size_t take_refused(IoCompletion* out, std::size_t max) {
    std::size_t n = 0;
    while (!refused_.empty() && n < max) {
      out[n++] = refused_.back();
      refused_.pop_back();
    }
    return n;
  }

  // The kernel took the first `count` pending SQEs.
  void taken(std::size_t count) {
    for (std::size_t i = 0; i < count && !pending_.empty(); ++i) {
      const std::uint64_t data = pending_.front();
      pending_.pop_front();
      if (data == kCancelData) continue;
      state_[data] = OpState::kInFlight;
      ++in_flight_;
    }
  }

  // Takes the CQEs that are ready (up to `room` op completions' worth): op completions go to
  // `out` (when given) or are tallied in `report` (when given); cancel requests' are dropped.
  std::size_t take_cqes(IoCompletion* out, std::size_t room, DrainReport* report) {
    const unsigned got = io_uring_peek_batch_cqe(&ring_, cqes_.data(),
                                                 static_cast<unsigned>(std::min(room, cqes_.size())));
    std::size_t n = 0;
    for (unsigned i = 0; i < got; ++i) {
      const std::uint64_t data = io_uring_cqe_get_data64(cqes_[i]);
      if (data == kCancelData) continue;
      state_[data] = OpState::kIdle;
      --in_flight_;
      if (out != nullptr) out[n] = IoCompletion{static_cast<std::uint32_t>(data), cqes_[i]->res};
      ++n;
      if (report != nullptr) ++(cqes_[i]->res == -ECANCELED ? report->cancelled : report->finished);
    }
    io_uring_cq_advance(&ring_, got);
    return out != nullptr ? n : 0;
  }

  std::size_t depth_;
  io_uring ring_{};
  bool initialised_ = false;
  bool fixed_ = false;
  int broken_ = 0;
  std::deque<std::uint64_t> pending_;  // user_data of SQEs written and not yet taken, in ring order
  std::vector<OpState> state_;         // by tag
  std::size_t in_flight_ = 0;          // ops the kernel has and has not completed to us
  std::vector<io_uring_cqe*> cqes_;
  std::vector<IoCompletion> refused_;
};

}  // namespace

Result<std::unique_ptr<BackendQueue>> make_uring_queue(std::size_t depth) {
  auto queue = std::make_unique<UringQueue>(depth);
  ZINF_RETURN_IF_ERROR(queue->init());
  return std::unique_ptr<BackendQueue>(std::move(queue));
}

bool probe_uring(std::string* why) {
  io_uring ring{};
  const int rc = io_uring_queue_init(2, &ring, 0);
  if (rc < 0) {
    if (why != nullptr) *why = fmt::format("io_uring_queue_init: {}", std::strerror(-rc));
    return false;
  }
  io_uring_probe* probe = io_uring_get_probe_ring(&ring);
  bool ok = probe != nullptr && io_uring_opcode_supported(probe, IORING_OP_READ) &&
            io_uring_opcode_supported(probe, IORING_OP_WRITE) &&
            io_uring_opcode_supported(probe, IORING_OP_READ_FIXED);
  if (probe != nullptr) io_uring_free_probe(probe);
  io_uring_queue_exit(&ring);
  if (!ok && why != nullptr) *why = "the kernel's io_uring lacks IORING_OP_READ/WRITE (needs Linux 5.6+)";
  return ok;
}

}  // namespace zinf::aio::detail
