// Linux native AIO backend queue (libaio): one io_context per worker, io_submit/io_getevents,
// io_cancel, and a drain that ends in io_destroy (which waits for every request).
#include <libaio.h>

#include <algorithm>
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

class LibaioQueue final : public BackendQueue {
 public:
  explicit LibaioQueue(std::size_t depth) : depth_(depth), in_kernel_(depth, false) {}
  ~LibaioQueue() override {
    if (initialised_) io_destroy(ctx_);
  }
  LibaioQueue(const LibaioQueue&) = delete;
  LibaioQueue& operator=(const LibaioQueue&) = delete;

  Status init() {
    const int rc = io_setup(static_cast<int>(depth_), &ctx_);
    if (rc < 0) {
      Status status = Status::sys_error(fmt::format("io_setup({})", depth_), -rc);
      if (rc == -EAGAIN) {
        status = status.with_context(
            "the system-wide limit /proc/sys/fs/aio-max-nr is exhausted (lower aio.queue_depth or "
            "aio.intra_op_parallelism, or raise the limit)");
      }
      return status;
    }
    initialised_ = true;
    iocbs_.resize(depth_);
    staged_.reserve(depth_);
    events_.resize(depth_);
    return Status::ok();
  }

  std::size_t capacity() const override { return depth_; }

  void prepare(const IoOp& op) override {
    // Tags are slot indices < depth, so each op has its own iocb for as long as it is in flight.
    iocb* cb = &iocbs_[op.tag];
    if (op.is_write) {
      io_prep_pwrite(cb, op.fd, op.buf, op.len, static_cast<long long>(op.offset));
    } else {
      io_prep_pread(cb, op.fd, op.buf, op.len, static_cast<long long>(op.offset));
    }
    cb->data = reinterpret_cast<void*>(static_cast<std::uintptr_t>(op.tag));
    staged_.push_back(cb);
  }

  void submit() override {
    std::size_t done = 0;
    int attempts = 0;
    while (done < staged_.size()) {
      const int rc = io_submit(ctx_, static_cast<long>(staged_.size() - done), staged_.data() + done);
      if (rc > 0) {
        for (int i = 0; i < rc; ++i) in_kernel_[tag_of(staged_[done + static_cast<std::size_t>(i)])] = true;
        in_flight_ += static_cast<std::size_t>(rc);
        done += static_cast<std::size_t>(rc);
        attempts = 0;
      } else if ((rc == -EAGAIN || rc == -EINTR || rc == 0) && ++attempts < kMaxSubmitRetries) {
        std::this_thread::sleep_for(std::chrono::microseconds(10 << std::min(attempts, 10)));
      } else {
        // io_submit reports the first iocb it could not queue; that op fails, the rest go on.
        refused_.push_back(IoCompletion{tag_of(staged_[done]), static_cast<std::int64_t>(rc < 0 ? rc : -EIO)});
        ++done;
        attempts = 0;
      }
    }
    staged_.clear();
  }

  Result<std::size_t> reap(IoCompletion* out, std::size_t max, std::size_t min_complete,
                           Clock::time_point until) override {
    std::size_t n = 0;
    while (!refused_.empty() && n < max) {
      out[n++] = refused_.back();
      refused_.pop_back();
    }
    if (n >= max) return n;
    const long want = min_complete > n ? static_cast<long>(min_complete - n) : 0;
    const long room = static_cast<long>(std::min(max - n, events_.size()));
    int rc = 0;
    do {
      timespec ts{};
      rc = io_getevents(ctx_, want, room, events_.data(), timeout_until(until, &ts));
    } while (rc == -EINTR);
    if (rc < 0) return Status::sys_error("io_getevents", -rc);
    for (int i = 0; i < rc; ++i) out[n++] = completion(events_[static_cast<std::size_t>(i)]);
    return n;
  }

  void cancel(std::uint32_t tag) override {
    if (!in_kernel_[tag]) return;
    io_event ev{};
    // Only some files can cancel (regular files cannot: EINVAL); then the op just completes.
    // Since Linux 4.19 a cancelled op's event comes through the ring (EINPROGRESS); before,
    // io_cancel returned it here.
    if (io_cancel(ctx_, &iocbs_[tag], &ev) == 0) refused_.push_back(completion(ev));
  }

  Result<DrainReport> cancel_and_drain(Clock::time_point deadline) override {
    DrainReport report;
    report.cancelled += refused_.size() + staged_.size();
    refused_.clear();
    staged_.clear();
    for (std::uint32_t tag = 0; tag < depth_; ++tag) cancel(tag);
    for (const IoCompletion& c : refused_) ++(c.result == -ECANCELED ? report.cancelled : report.finished);
    refused_.clear();
    while (in_flight_ > 0 && Clock::now() < deadline) {
      timespec ts{};
      const int rc = io_getevents(ctx_, 1, static_cast<long>(events_.size()), events_.data(),
                                  timeout_until(deadline, &ts));
      if (rc == -EINTR) continue;
      if (rc < 0) break;  // the context itself fails: io_destroy below still waits
      for (int i = 0; i < rc; ++i) {
        const IoCompletion c = completion(events_[static_cast<std::size_t>(i)]);
        ++(c.result == -ECANCELED ? report.cancelled : report.finished);
      }
    }
    // io_destroy blocks until every request of the context is done ("otherwise the kernel keeps
    // using user-space buffers", fs/aio.c, since 2015), so once it returns no op touches our
    // memory; with nothing in flight it is quick.
    report.late = in_flight_;
    const int rc = io_destroy(ctx_);
    if (rc < 0) {
      return Status::sys_error(
          fmt::format("io_destroy while draining the context ({} ops may still use their buffers)", in_flight_), -rc);
    }
    initialised_ = false;
    in_flight_ = 0;
    return report;
  }

 private:
  static std::uint32_t tag_of(const iocb* cb) {
    return static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(cb->data));
  }
  // An event of the ring as a completion; its op is no longer in the kernel.
  IoCompletion completion(const io_event& ev) {
    const auto tag = static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(ev.data));
    if (in_kernel_[tag]) {
      in_kernel_[tag] = false;
      --in_flight_;
    }
    // res is an unsigned long carrying either a byte count or -errno.
    return IoCompletion{tag, static_cast<std::int64_t>(static_cast<long>(ev.res))};
  }

  std::size_t depth_;
  io_context_t ctx_ = nullptr;
  bool initialised_ = false;
  std::vector<iocb> iocbs_;
  std::vector<iocb*> staged_;
  std::vector<io_event> events_;
  std::vector<IoCompletion> refused_;  // completions not from the ring (refused, or cancelled synchronously)
  std::vector<bool> in_kernel_;        // by tag: submitted and not yet completed
  std::size_t in_flight_ = 0;
};

}  // namespace

Result<std::unique_ptr<BackendQueue>> make_libaio_queue(std::size_t depth) {
  auto queue = std::make_unique<LibaioQueue>(depth);
  ZINF_RETURN_IF_ERROR(queue->init());
  return std::unique_ptr<BackendQueue>(std::move(queue));
}

bool probe_libaio(std::string* why) {
  io_context_t ctx = nullptr;
  const int rc = io_setup(1, &ctx);
  if (rc < 0) {
    if (why != nullptr) *why = fmt::format("io_setup: {}", std::strerror(-rc));
    return false;
  }
  io_destroy(ctx);
  return true;
}

}  // namespace zinf::aio::detail
