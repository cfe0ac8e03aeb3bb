// The persistent thread pool: every task runs once per batch, batches reuse the workers, and
// concurrent callers are served one batch at a time.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "zinf/thread_pool.h"

namespace zinf {
namespace {

TEST(ThreadPool, RunsEveryTaskOnce) {
  for (std::size_t threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (std::size_t tasks : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(tasks);
      pool.run(tasks, [&](std::size_t i) { hits[i].fetch_add(1); });
      for (std::size_t i = 0; i < tasks; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " threads, task " << i;
    }
  }
}

TEST(ThreadPool, UsesSeveralThreadsAndReusesThem) {
  ThreadPool pool(3, /*pin=*/false);
  std::set<std::thread::id> seen_all;
  for (int batch = 0; batch < 50; ++batch) {
    std::mutex mu;
    std::atomic<int> arrived{0};
    pool.run(3, [&](std::size_t) {
      // Each task waits (briefly) for the others, so three threads must take part.
      arrived.fetch_add(1);
      for (int spin = 0; spin < 200000 && arrived.load() < 3; ++spin) std::this_thread::yield();
      std::lock_guard<std::mutex> lock(mu);
      seen_all.insert(std::this_thread::get_id());
    });
  }
  EXPECT_EQ(seen_all.size(), 3u) << "the same three threads serve every batch";
}

TEST(ThreadPool, ConcurrentCallersAreServedOneBatchAtATime) {
  ThreadPool pool(2);
  std::atomic<long> total{0};
  auto caller = [&] {
    for (int b = 0; b < 200; ++b) pool.run(10, [&](std::size_t i) { total.fetch_add(static_cast<long>(i)); });
  };
  std::thread t1(caller), t2(caller);
  t1.join();
  t2.join();
  EXPECT_EQ(total.load(), 2 * 200 * 45);
}

// A task that runs a batch on its own pool (e.g. a kernel that uses the default pool, called from
// a task of it) gets it run inline: every index once, and no deadlock on the one-batch lock.
TEST(ThreadPool, RunFromItsOwnTaskRunsInline) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(4 * 8);
  pool.run(4, [&](std::size_t outer) {
    const std::thread::id me = std::this_thread::get_id();
    pool.run(8, [&](std::size_t inner) {
      EXPECT_EQ(std::this_thread::get_id(), me);
      hits[outer * 8 + inner].fetch_add(1);
    });
  });
  for (const std::atomic<int>& h : hits) EXPECT_EQ(h.load(), 1);
  // Another pool's batch from inside a task still uses that pool's threads.
  ThreadPool other(2);
  std::atomic<int> n{0};
  pool.run(2, [&](std::size_t) { other.run(5, [&](std::size_t) { n.fetch_add(1); }); });
  EXPECT_EQ(n.load(), 10);
}

TEST(ThreadPool, DefaultPoolExists) { EXPECT_GE(default_thread_pool().threads(), 1u); }

}  // namespace
}  // namespace zinf
