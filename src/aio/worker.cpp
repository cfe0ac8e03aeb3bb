// aio worker thread: cuts tasks into chunks, keeps up to queue_depth in flight, checks and
// retries every completion, bounces unaligned memory, finishes requests.
#include "aio/worker.h"

#include <pthread.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "zinf/log.h"
#include "zinf/topology.h"

namespace zinf::aio::detail {
namespace {

constexpr std::size_t kAlign = 4096;
constexpr std::uint32_t kMaxStalls = 64;
constexpr std::size_t kMaxBounceSlots = 8;
constexpr std::size_t kMaxBounceBytes = std::size_t{1} << 20;

constexpr std::uint64_t align_down(std::uint64_t v) { return v & ~std::uint64_t{kAlign - 1}; }
constexpr std::uint64_t align_up(std::uint64_t v) { return align_down(v + kAlign - 1); }
bool aligned_ptr(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kAlign == 0; }

}  // namespace

Worker::Worker(std::size_t index, const AioConfig& config, Backend backend, RequestTracker& tracker,
               std::unique_ptr<BackendQueue> queue)
    : index_(index),
      config_(config),
      backend_(backend),
      tracker_(tracker),
      queue_(std::move(queue)),
      supports_fixed_(queue_->supports_fixed_buffers()),
      grace_(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(std::min(config.request_timeout_s, 1e9)))),
      slots_(config.queue_depth),
      completions_(config.queue_depth) {
  free_slots_.reserve(slots_.size());
  for (std::size_t i = slots_.size(); i-- > 0;) free_slots_.push_back(static_cast<std::uint32_t>(i));
  retries_.reserve(slots_.size());
}

Worker::~Worker() {
  request_stop();
  if (thread_.joinable()) thread_.join();
}

void Worker::request_stop() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_cv_.notify_all();
}

void Worker::start() { thread_ = std::thread([this] { run(); }); }

void Worker::post(Task* task) {
  {
    std::lock_guard lock(mutex_);
    posted_.push_back(task);
    posted_count_.fetch_add(1, std::memory_order_release);
  }
  wake_cv_.notify_one();
}

bool Worker::set_fixed_buffers(std::vector<iovec> ranges, std::string* why) {
  std::unique_lock lock(mutex_);
  fixed_pending_ = std::move(ranges);
  const std::uint64_t generation = fixed_wanted_.load() + 1;
  fixed_wanted_.store(generation, std::memory_order_release);
  wake_cv_.notify_one();
  fixed_cv_.wait(lock, [&] { return fixed_applied_ >= generation; });
  if (why != nullptr) *why = fixed_why_;
  return fixed_ok_;
}

void Worker::run() {
  // Workers of all handles in the process take cores in turn, so two handles do not stack
  // their first workers on core 0.
  static std::atomic<std::size_t> next_core{0};
  if (config_.pin_threads) pin_current_thread(next_core.fetch_add(1, std::memory_order_relaxed));
  const std::string name = fmt::format("zinf-aio-{}", index_);
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  for (;;) {
    bool fixed_change = fixed_wanted_.load(std::memory_order_acquire) != fixed_seen_;
    // Fixed buffers change only while no op of this worker is staged or in flight.
    if (fixed_change && free_slots_.size() == slots_.size()) {
      apply_fixed_buffers();
      fixed_change = false;
    }
    if (config_.overlap_events || submitted_ == 0) fill(!fixed_change);
    if (submitted_ > 0) {
      reap();
      continue;
    }
    if (fixed_change || !active_.empty() || !retries_.empty()) continue;
    if (!wait_for_work()) break;
  }
  // Tear the queue down here so the workers of a handle do it in parallel (io_destroy waits
  // for an RCU grace period). Nothing is in flight: the handle drained every request first.
  queue_.reset();
  retired_.clear();
}

bool Worker::wait_for_work() {
  std::unique_lock lock(mutex_);
  wake_cv_.wait(lock, [&] {
    return !posted_.empty() || stop_ || fixed_wanted_.load() != fixed_seen_;
  });
  return !(stop_ && posted_.empty() && fixed_wanted_.load() == fixed_seen_);
}

bool Worker::take_posted() {
  if (posted_count_.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard lock(mutex_);
  for (Task* task : posted_) active_.push_back(task);
  posted_.clear();
  posted_count_.store(0, std::memory_order_release);
  return !active_.empty();
}

void Worker::fill(bool new_chunks) {
  // Retries first: their slots are already taken. Chunks of a failed request stop here.
  for (std::uint32_t tag : retries_) {
    if (slots_[tag].task->request->failed.load(std::memory_order_acquire)) {
      finish_slot(tag);
    } else {
      issue(tag);
    }
  }
  retries_.clear();
  while (new_chunks && !free_slots_.empty()) {
    if (active_.empty() && !take_posted()) break;
    Task& task = *active_.front();
    if (task.request->failed.load(std::memory_order_acquire)) {
      task.cursor = task.end;
      active_.pop_front();
      maybe_finish_task(task);
      continue;
    }
    const std::uint32_t tag = free_slots_.back();
    const PlanResult planned = plan_chunk(task, slots_[tag]);
    if (planned == PlanResult::kBlocked) break;
    if (planned == PlanResult::kFailed) continue;
    free_slots_.pop_back();
    ++task.in_flight;
    if (task.cursor == task.end) active_.pop_front();
    issue(tag);
  }
  if (staged_ > 0) {
    queue_->submit();
    submitted_ += staged_;
    staged_ = 0;
  }
}

Worker::PlanResult Worker::plan_chunk(Task& task, Slot& slot) {
  Request& r = *task.request;
  const std::uint64_t pos = task.cursor;
  const std::uint64_t end = task.end;
  std::byte* user = r.buffer + (pos - r.offset);
  ChunkKind kind = ChunkKind::kDirect;
  std::size_t len = 0;
  if (!r.direct) {
    len = static_cast<std::size_t>(std::min<std::uint64_t>(config_.block_size, end - pos));
  } else if (pos % kAlign != 0 || align_down(end) <= pos) {
    // Unaligned head or tail of an O_DIRECT request: exact bytes through the buffered twin.
    kind = ChunkKind::kEdge;
    len = static_cast<std::size_t>(std::min(align_up(pos + 1), end) - pos);
  } else {
    len = static_cast<std::size_t>(std::min<std::uint64_t>(config_.block_size, align_down(end) - pos));
    if (!aligned_ptr(user)) {
      kind = ChunkKind::kBounced;
      Status status = ensure_bounce();
      if (!status.is_ok()) {
        r.fail(std::move(status));
        return PlanResult::kFailed;
      }
      if (free_bounces_.empty()) return PlanResult::kBlocked;
      len = std::min(len, bounce_size_);
    }
  }
  slot = Slot{};
  slot.task = &task;
  slot.kind = kind;
  slot.file_offset = pos;
  slot.user = user;
  slot.len = len;
  slot.fd = kind == ChunkKind::kEdge ? r.edge_fd.get() : r.fd;
  if (kind == ChunkKind::kBounced) {
    slot.bounce = free_bounces_.back();
    free_bounces_.pop_back();
    slot.io = bounce_memory_.data() + static_cast<std::size_t>(slot.bounce) * bounce_size_;
    if (r.is_write) std::memcpy(slot.io, user, len);
  } else {
    slot.io = user;
    slot.fixed_index = fixed_in_use_ ? find_fixed(user, len) : -1;
  }
  task.cursor = pos + len;
  return PlanResult::kPlanned;
}

void Worker::add_stats(HandleStats& stats) const {
  stats.ops += counters_.ops.load(std::memory_order_relaxed);
  stats.retries += counters_.retries.load(std::memory_order_relaxed);
  stats.fixed_ops += counters_.fixed_ops.load(std::memory_order_relaxed);
  stats.bounced_bytes += counters_.bounced_bytes.load(std::memory_order_relaxed);
  stats.edge_ops += counters_.edge_ops.load(std::memory_order_relaxed);
  stats.cancels += counters_.cancels.load(std::memory_order_relaxed);
  stats.queue_resets += counters_.queue_resets.load(std::memory_order_relaxed);
}

void Worker::issue(std::uint32_t tag) {
  Slot& s = slots_[tag];
  const Request& r = *s.task->request;
  s.queued = true;
  next_check_ = std::min(next_check_, r.deadline);
  bump(counters_.ops);
  if (s.fixed_index >= 0) bump(counters_.fixed_ops);
  if (s.kind == ChunkKind::kEdge) bump(counters_.edge_ops);
  queue_->prepare(IoOp{r.is_write, s.fd, s.io + s.issued, s.len - s.issued, s.file_offset + s.issued, tag,
                       s.fixed_index, &r.path});
  ++staged_;
  if (config_.single_submit) {
    queue_->submit();
    submitted_ += staged_;
    staged_ = 0;
  }
}

void Worker::reap() {
  // The wait ends at the next deadline of an op in flight, so a stuck op is noticed.
  const std::size_t min_complete = config_.overlap_events ? 1 : submitted_;
  Result<std::size_t> got = queue_->reap(completions_.data(), completions_.size(), min_complete, next_check_);
  if (!got.is_ok()) {
    fail_all_in_flight(got.status().with_context(fmt::format("aio worker {}", index_)), Clock::now() + grace_);
    return;
  }
  submitted_ -= got.value();
  for (std::size_t i = 0; i < got.value(); ++i) on_complete(completions_[i].tag, completions_[i].result);
  if (submitted_ == 0) {
    next_check_ = Clock::time_point::max();
  } else if (Clock::now() >= next_check_) {
    check_in_flight();
  }
}

void Worker::check_in_flight() {
  const Clock::time_point now = Clock::now();
  Clock::time_point next = Clock::time_point::max();
  const Slot* stuck = nullptr;
  for (std::uint32_t tag = 0; tag < slots_.size(); ++tag) {
    Slot& s = slots_[tag];
    if (!s.queued) continue;
    Request& r = *s.task->request;
    if (!r.failed.load(std::memory_order_acquire) && now >= r.deadline) tracker_.expire_late(r);
    if (!r.failed.load(std::memory_order_acquire)) {
      next = std::min(next, r.deadline);
      continue;
    }
    // Its request has failed: nobody needs the op's data, only its buffer back.
    if (!s.cancel_sent) {
      queue_->cancel(tag);
      bump(counters_.cancels);
      s.cancel_sent = true;
      s.drain_by = now + grace_;
    } else if (now >= s.drain_by && stuck == nullptr) {
      stuck = &s;
    }
    next = std::min(next, s.drain_by);
  }
  next_check_ = next;
  if (stuck != nullptr) {
    const Request& r = *stuck->task->request;
    const double limit = std::chrono::duration<double>(grace_).count();
    fail_all_in_flight(Status(ErrorCode::kIoError,
                              fmt::format("{} {} offset {} length {}: not back {} s after it was cancelled "
                                          "(aio.request_timeout_s); aio worker {} tore its queue down",
                                          r.op_name(), r.path, stuck->file_offset + stuck->issued,
                                          stuck->len - stuck->issued, limit, index_),
                              ETIMEDOUT),
                       now);
  }
}

void Worker::on_complete(std::uint32_t tag, std::int64_t result) {
  Slot& s = slots_[tag];
  s.queued = false;
  const Request& r = *s.task->request;
  if (result < 0) {
    const int err = static_cast<int>(-result);
    if ((err == EINTR || err == EAGAIN) && s.stalls < kMaxStalls) {
      ++s.stalls;
      if (err == EAGAIN) std::this_thread::sleep_for(std::chrono::microseconds(10 << std::min<std::uint32_t>(s.stalls, 7)));
      retry(tag);
      return;
    }
    fail_slot(tag, Status::io_error(r.op_name(), r.path, s.file_offset + s.issued, s.len - s.issued, err));
    return;
  }
  const std::size_t new_done = std::min(s.issued + static_cast<std::size_t>(result), s.len);
  if (result == 0 || new_done <= s.done) {
    on_no_progress(tag);
    return;
  }
  s.done = new_done;
  s.stalls = 0;
  if (s.done < s.len) {
    retry(tag);
    return;
  }
  if (s.kind == ChunkKind::kBounced) {
    if (!r.is_write) std::memcpy(s.user, s.io, s.len);
    bump(counters_.bounced_bytes, s.len);
  }
  finish_slot(tag);
}

void Worker::on_no_progress(std::uint32_t tag) {
  Slot& s = slots_[tag];
  const Request& r = *s.task->request;
  if (!r.is_write) {
    struct stat st {};
    if (::fstat(r.fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) < s.file_offset + s.len) {
      fail_slot(tag, Status::out_of_range(fmt::format(
                         "read past end of file {}: file has {} bytes, requested {} bytes at offset {}", r.path,
                         st.st_size, r.nbytes, r.offset)));
      return;
    }
  }
  if (++s.stalls > kMaxStalls) {
    fail_slot(tag, Status(ErrorCode::kIoError,
                          fmt::format("{} {} offset {} length {}: no progress after {} attempts", r.op_name(),
                                      r.path, s.file_offset + s.issued, s.len - s.issued, kMaxStalls),
                          EIO));
    return;
  }
  retry(tag);
}

void Worker::retry(std::uint32_t tag) {
  Slot& s = slots_[tag];
  // O_DIRECT ops must stay aligned: resume from the last aligned byte (re-reading or
  // re-writing the same bytes is harmless). The chunk's start and memory are aligned.
  const bool aligned_op = s.task->request->direct && s.kind != ChunkKind::kEdge;
  s.issued = aligned_op ? static_cast<std::size_t>(align_down(s.done)) : s.done;
  retries_.push_back(tag);
  bump(counters_.retries);
}

void Worker::fail_slot(std::uint32_t tag, Status status) {
  slots_[tag].task->request->fail(std::move(status));
  finish_slot(tag);
}

void Worker::finish_slot(std::uint32_t tag) {
  Slot& s = slots_[tag];
  Task& task = *s.task;
  if (s.bounce >= 0) free_bounces_.push_back(s.bounce);
  s = Slot{};
  free_slots_.push_back(tag);
  --task.in_flight;
  maybe_finish_task(task);
}

void Worker::maybe_finish_task(Task& task) {
  if (task.cursor < task.end || task.in_flight > 0) return;
  Request& request = *task.request;
  if (request.tasks_left.fetch_sub(1, std::memory_order_acq_rel) == 1) finish_request(request, tracker_);
}

void Worker::apply_fixed_buffers() {
  std::vector<iovec> ranges;
  std::uint64_t generation = 0;
  {
    std::lock_guard lock(mutex_);
    ranges = fixed_pending_;
    generation = fixed_wanted_.load();
  }
  std::string why;
  const bool ok = queue_->set_fixed_buffers(ranges, &why);
  fixed_ = ok ? std::move(ranges) : std::vector<iovec>{};
  fixed_in_use_ = ok;
  fixed_seen_ = generation;
  {
    std::lock_guard lock(mutex_);
    fixed_applied_ = generation;
    fixed_ok_ = ok;
    fixed_why_ = why;
  }
  fixed_cv_.notify_all();
}

void Worker::fail_all_in_flight(const Status& status, Clock::time_point deadline) {
  // The queue is broken, or an op in it does not come back. Its ops are cancelled and drained
  // before any of their chunks is finished: a failed request's buffer goes back to the caller,
  // who may reuse or free it, so the kernel must be done with it first. Their requests fail
  // now (so this is the error they report, and no more of their chunks are issued).
  std::size_t held = 0;
  for (const Slot& s : slots_) {
    if (!s.queued) continue;
    s.task->request->fail(status);
    ++held;
  }
  Result<DrainReport> drained = queue_->cancel_and_drain(deadline);
  if (drained.is_ok()) {
    const DrainReport& d = drained.value();
    const std::size_t seen = d.cancelled + d.finished + d.late;
    log(LogLevel::kWarning,
        fmt::format("aio: {}; cancelled and drained worker {}'s queue, {} ops in flight, before failing them ({} "
                    "came back cancelled, {} finished anyway, {} were waited for past the deadline{}); continuing "
                    "on a new queue",
                    status.to_string(), index_, held, d.cancelled, d.finished, d.late,
                    held > seen ? fmt::format(", {} had completed unreported", held - seen) : ""));
    queue_.reset();
  } else {
    // Never expected (the completion ring itself fails): the memory of those ops may still be
    // written, and there is nothing safe to do but keep the queue and say so.
    log(LogLevel::kError, fmt::format("aio: {}; draining worker {}'s queue failed: {}; the buffers of its {} ops "
                                      "in flight may still be used by the kernel",
                                      status.to_string(), index_, drained.status().to_string(), held));
    retired_.push_back(std::move(queue_));
  }
  bump(counters_.queue_resets);
  for (std::uint32_t tag = 0; tag < slots_.size(); ++tag) {
    if (slots_[tag].queued) {
      slots_[tag].queued = false;
      fail_slot(tag, status);
    }
  }
  submitted_ = 0;
  staged_ = 0;
  next_check_ = Clock::time_point::max();
  Result<std::unique_ptr<BackendQueue>> fresh = make_backend_queue(backend_, slots_.size(), config_.faults);
  if (!fresh.is_ok()) {
    log(LogLevel::kWarning, fmt::format("aio worker {}: {}; continuing with the threads backend", index_,
                                        fresh.status().to_string()));
    fresh = make_backend_queue(Backend::kThreads, slots_.size(), config_.faults);
  }
  queue_ = std::move(fresh).value();
  fixed_in_use_ = false;
  fixed_.clear();
}

int Worker::find_fixed(const std::byte* p, std::size_t len) const {
  for (std::size_t i = 0; i < fixed_.size(); ++i) {
    const auto* base = static_cast<const std::byte*>(fixed_[i].iov_base);
    if (p >= base && p + len <= base + fixed_[i].iov_len) return static_cast<int>(i);
  }
  return -1;
}

Status Worker::ensure_bounce() {
  if (bounce_memory_.data() != nullptr) return Status::ok();
  bounce_size_ = std::min(config_.block_size, kMaxBounceBytes);
  const std::size_t count = std::min(config_.queue_depth, kMaxBounceSlots);
  ZINF_ASSIGN_OR_RETURN(bounce_memory_, AlignedBuffer::allocate(bounce_size_ * count, kAlign));
  for (std::size_t i = count; i-- > 0;) free_bounces_.push_back(static_cast<int>(i));
  return Status::ok();
}

}  // namespace zinf::aio::detail
