// Persistent worker pool: workers sleep on a condition variable between batches.
#include "zinf/thread_pool.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

#include "zinf/topology.h"

namespace zinf {

namespace {
// The pool whose task this thread is running, if any: a task that calls run() on its own pool
// gets its tasks run inline instead of a deadlock on run_mutex_.
thread_local const ThreadPool* tl_task_pool = nullptr;

struct TaskScope {
  const ThreadPool* saved;
  explicit TaskScope(const ThreadPool* pool) : saved(tl_task_pool) { tl_task_pool = pool; }
  ~TaskScope() { tl_task_pool = saved; }
};
}  // namespace

ThreadPool::ThreadPool(std::size_t threads, bool pin) {
  const std::size_t workers = threads > 1 ? threads - 1 : 0;
  workers_.reserve(workers);
  for (std::size_t w = 0; w < workers; ++w) {
    workers_.emplace_back([this, w, pin] { worker_main(w, pin); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::take_tasks() {
  const TaskScope scope(this);
  for (;;) {
    const std::size_t i = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (i >= tasks_) return;
    fn_(ctx_, i);
  }
}

void ThreadPool::run_batch(std::size_t tasks, TaskFn fn, void* ctx) {
  if (tasks == 0) return;
  if (workers_.empty() || tasks == 1 || tl_task_pool == this) {
    for (std::size_t i = 0; i < tasks; ++i) fn(ctx, i);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = fn;
    ctx_ = ctx;
    tasks_ = tasks;
    next_task_.store(0, std::memory_order_relaxed);
    busy_workers_ = workers_.size();
    ++generation_;
  }
  start_cv_.notify_all();
  take_tasks();
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [this] { return busy_workers_ == 0; });
}

void ThreadPool::worker_main(std::size_t worker_index, bool pin) {
  // Core 0 is left to the thread that calls run(), which works too.
  if (pin) (void)pin_current_thread(worker_index + 1);
  std::uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    take_tasks();
    std::lock_guard<std::mutex> lock(mutex_);
    if (--busy_workers_ == 0) done_cv_.notify_one();
  }
}

namespace {

std::size_t default_thread_count() {
  if (const char* env = std::getenv("ZINF_NUM_THREADS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const unsigned long n = std::strtoul(env, &end, 10);
    if (end != nullptr && *end == '\0' && n > 0 && n <= 4096) return n;
  }
  const int cores = topology().cores;
  return cores > 0 ? static_cast<std::size_t>(cores) : 1;
}

}  // namespace

ThreadPool& default_thread_pool() {
  static ThreadPool pool(default_thread_count());
  return pool;
}

void zero_fill(void* p, std::size_t bytes) {
  constexpr std::size_t kPiece = std::size_t{8} << 20;
  auto* base = static_cast<std::byte*>(p);
  // One piece (below 8 MiB) runs on this thread, as run() does with a single task.
  const std::size_t pieces = (bytes + kPiece - 1) / kPiece;
  default_thread_pool().run(pieces, [&](std::size_t i) {
    const std::size_t first = i * kPiece;
    std::memset(base + first, 0, std::min(kPiece, bytes - first));
  });
}

}  // namespace zinf
