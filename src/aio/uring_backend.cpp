// io_uring backend queue (liburing): one ring per worker, batched submits, fixed buffers.
#include <liburing.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "aio/backend.h"

namespace zinf::aio::detail {
namespace {

constexpr int kMaxSubmitRetries = 64;

class UringQueue final : public BackendQueue {
 public:
  explicit UringQueue(std::size_t depth) : depth_(depth) {}
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
    ++staged_;
  }

  void submit() override {
    int attempts = 0;
    while (staged_ > 0) {
      const int rc = io_uring_submit(&ring_);
      if (rc > 0) {
        staged_ -= std::min<std::size_t>(staged_, static_cast<std::size_t>(rc));
        attempts = 0;
        continue;
      }
      if ((rc == -EINTR || rc == -EAGAIN || rc == -EBUSY || rc == 0) && ++attempts < kMaxSubmitRetries) {
        std::this_thread::sleep_for(std::chrono::microseconds(10 << std::min(attempts, 10)));
        continue;
      }
      // The kernel keeps refusing: the staged SQEs are still in the ring and must not run
      // later on buffers the caller has been told are free, so the ring is retired.
      broken_ = rc < 0 ? -rc : EIO;
      return;
    }
  }

  Result<std::size_t> reap(IoCompletion* out, std::size_t max, std::size_t min_complete) override {
    std::size_t n = take_refused(out, max);
    if (broken_ != 0) {
      return Status::sys_error("io_uring_submit", broken_);
    }
    if (n >= max) return n;
    const std::size_t want = min_complete > n ? min_complete - n : 0;
    if (want > 0) {
      io_uring_cqe* cqe = nullptr;
      int rc = 0;
      do {
        rc = io_uring_wait_cqe_nr(&ring_, &cqe, static_cast<unsigned>(want));
      } while (rc == -EINTR || rc == -EAGAIN);
      if (rc < 0) return Status::sys_error("io_uring_wait_cqe", -rc);
    }
    const unsigned got = io_uring_peek_batch_cqe(&ring_, cqes_.data(), static_cast<unsigned>(max - n));
    for (unsigned i = 0; i < got; ++i) {
      out[n++] = IoCompletion{static_cast<std::uint32_t>(io_uring_cqe_get_data64(cqes_[i])),
                              cqes_[i]->res};
    }
    io_uring_cq_advance(&ring_, got);
    return n;
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
  std::size_t take_refused(IoCompletion* out, std::size_t max) {
    std::size_t n = 0;
    while (!refused_.empty() && n < max) {
      out[n++] = refused_.back();
      refused_.pop_back();
    }
    return n;
  }

  std::size_t depth_;
  io_uring ring_{};
  bool initialised_ = false;
  bool fixed_ = false;
  int broken_ = 0;
  std::size_t staged_ = 0;
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
