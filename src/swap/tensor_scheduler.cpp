// The tensor swapper's scheduler: per-key FIFO operations on worker threads, parked memory waits.
#include "swap/tensor_scheduler.h"

#include <chrono>

namespace zinf::swap::detail {

void TicketState::complete(Status st) {
  {
    std::lock_guard lock(mutex);
    status = std::move(st);
    done = true;
  }
  cv.notify_all();
}

std::shared_ptr<TicketState> make_ready_ticket(Status st) {
  auto t = std::make_shared<TicketState>();
  t->status = std::move(st);
  t->done = true;
  return t;
}

void unpin_staged(Scheduler& sch, TensorEntry& entry) {
  PinnedBlock freed;  // destroyed after the lock is released
  std::lock_guard lock(sch.mutex);
  if (--entry.views == 0 && entry.release_pending) {
    freed = std::move(entry.staged);
    entry.staged_valid = false;
    entry.release_pending = false;
  }
}

Scheduler::Scheduler(PinnedPool& pool, std::size_t threads) : pool_(pool) {
  for (std::size_t i = 0; i < std::max<std::size_t>(threads, 1); ++i) {
    workers_.emplace_back([this] { worker_main(); });
  }
  memory_thread_ = std::thread([this] { memory_main(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard lock(mutex);
    stop_ = true;
  }
  memory_cv_.notify_all();
  wait_idle();
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  memory_thread_.join();
}

void Scheduler::enqueue(std::unique_lock<std::mutex>& lock, TensorEntry& entry, std::unique_ptr<Op> op) {
  (void)lock;
  entry.ops.push_back(std::move(op));
  ++outstanding_;
  if (entry.ops.size() == 1) {
    ready_.push_back(&entry);
    work_cv_.notify_one();
  }
}

void Scheduler::wait_idle() {
  std::unique_lock lock(mutex);
  idle_cv_.wait(lock, [&] { return outstanding_ == 0; });
}

void Scheduler::finish(TensorEntry& entry, Status st) {
  std::unique_ptr<Op> op;
  {
    std::lock_guard lock(mutex);
    op = std::move(entry.ops.front());
    entry.ops.pop_front();
    if (!entry.ops.empty()) {
      ready_.push_back(&entry);
      work_cv_.notify_one();
    }
  }
  op->block.reset();
  op->ticket->complete(st.with_context(op->what));
  op.reset();  // drop captured buffers before the op counts as finished
  std::lock_guard lock(mutex);
  if (--outstanding_ == 0) idle_cv_.notify_all();
}

void Scheduler::worker_main() {
  for (;;) {
    TensorEntry* entry = nullptr;
    Op* op = nullptr;
    {
      std::unique_lock lock(mutex);
      work_cv_.wait(lock, [&] { return !ready_.empty() || (stop_ && outstanding_ == 0); });
      if (ready_.empty()) return;
      entry = ready_.front();
      ready_.pop_front();
      op = entry->ops.front().get();
    }
    if (!op->aborted.is_ok()) {
      finish(*entry, op->aborted);
      continue;
    }
    const std::size_t need = op->block ? 0 : (op->resident_bytes ? op->resident_bytes(*entry) : 0);
    if (need > 0) {
      Result<PinnedBlock> block = pool_.try_acquire(need);
      if (!block.is_ok()) {
        finish(*entry, block.status());
        continue;
      }
      if (!*block) {
        std::lock_guard lock(mutex);
        memory_wait_.push_back(entry);
        memory_cv_.notify_one();
        continue;
      }
      op->block = std::move(block).value();
    }
    finish(*entry, op->run(*entry, *op));
  }
}

void Scheduler::memory_main() {
  for (;;) {
    TensorEntry* entry = nullptr;
    Op* op = nullptr;
    bool stopping = false;
    {
      std::unique_lock lock(mutex);
      memory_cv_.wait(lock, [&] { return !memory_wait_.empty() || stop_; });
      if (memory_wait_.empty()) return;
      entry = memory_wait_.front();
      op = entry->ops.front().get();
      stopping = stop_;
    }
    const std::size_t need = op->resident_bytes(*entry);
    Result<PinnedBlock> block = stopping ? pool_.try_acquire(need)
                                         : pool_.acquire_for(need, std::chrono::milliseconds(100));
    std::lock_guard lock(mutex);
    if (!block.is_ok()) {
      op->aborted = block.status();
    } else if (*block) {
      op->block = std::move(block).value();
    } else if (stop_) {
      op->aborted = Status::aborted("the swapper was destroyed while this operation waited for pinned memory");
    } else {
      continue;  // still waiting; try again (and notice shutdown)
    }
    memory_wait_.pop_front();
    ready_.push_back(entry);
    work_cv_.notify_one();
  }
}

}  // namespace zinf::swap::detail
