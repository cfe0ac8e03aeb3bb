// A persistent pool of worker threads that runs a batch of indexed tasks and waits for it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace zinf {

// Runs batches of tasks on `threads()` threads: threads() - 1 workers started once, plus the
// thread that calls run(), which takes tasks too. Workers are pinned to cores 1, 2, ... (mod the
// core count; see pin_current_thread) when `pin` is true and hwloc is available.
//
// Threading: run() may be called from any thread; concurrent calls are served one batch at a
// time. A task that calls run() on its own pool gets those tasks run inline, one after another,
// on its thread. A task must not throw.
class ThreadPool {
 public:
  // threads >= 1 (0 is taken as 1). A pool of 1 runs every task on the calling thread.
  explicit ThreadPool(std::size_t threads, bool pin = true);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  std::size_t threads() const { return workers_.size() + 1; }

  // Calls fn(i) once for every i in [0, tasks) and returns when all calls have returned.
  // Which thread runs which index is unspecified.
  template <typename Fn>
  void run(std::size_t tasks, Fn&& fn) {
    run_batch(tasks, [](void* ctx, std::size_t i) { (*static_cast<std::remove_reference_t<Fn>*>(ctx))(i); },
              static_cast<void*>(&fn));
  }

 private:
  using TaskFn = void (*)(void* ctx, std::size_t index);
  void run_batch(std::size_t tasks, TaskFn fn, void* ctx);
  void worker_main(std::size_t worker_index, bool pin);
  void take_tasks();  // runs tasks of the current batch until none is left

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one batch at a time

  std::mutex mutex_;  // guards the fields below that are not atomic
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  std::uint64_t generation_ = 0;  // bumped for every batch handed to the workers
  std::size_t busy_workers_ = 0;  // workers that have not finished the current batch
  bool stop_ = false;
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  std::size_t tasks_ = 0;
  std::atomic<std::size_t> next_task_{0};
};

// The process-wide pool used when a caller passes none: one thread per physical core
// (topology().cores), or ZINF_NUM_THREADS when set to a positive number. Created on first use.
ThreadPool& default_thread_pool();

// Writes zeros over [p, p + bytes) on default_thread_pool()'s threads (one memset below 8 MiB).
// Meant for fresh allocations: their first touch is page faults in which the kernel clears each
// page, and faults on every core go several times faster than on one (setting up a 7B model's
// ~100 GB of host state is then seconds, not minutes). May be called from a task of that pool.
void zero_fill(void* p, std::size_t bytes);

}  // namespace zinf
