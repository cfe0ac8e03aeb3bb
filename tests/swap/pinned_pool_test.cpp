// Tests of the pinned staging pool: budget, resident blocks, streaming chunks, waits, high-water.
#include "zinf/swap/pinned_pool.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "swap/host_buffer.h"
#include "swap_test_util.h"
#include "zinf/swap/types.h"

namespace zinf::swap {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<PinnedPool> make_pool(std::size_t count, std::size_t size, std::size_t elem,
                                      std::size_t reserve = 0) {
  PinnedPoolOptions o;
  o.budget = PoolBudget{"offload_param", count, size, elem};
  o.pin_memory = false;
  o.streaming_reserve_buffers = reserve;
  Result<std::unique_ptr<PinnedPool>> p = PinnedPool::create(o);
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  return p.is_ok() ? std::move(p).value() : nullptr;
}

// Whether the kernel may back the mapping that holds `p` with transparent huge pages
// (/proc/self/smaps "THPeligible"); -1 where that cannot be read.
int thp_eligible(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find('-')) {
      inside = lo <= at && at < hi;
    } else if (inside && line.rfind("THPeligible:", 0) == 0) {
      return std::stoi(line.substr(12));
    }
  }
  return -1;
}

bool thp_enabled() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s;
  std::getline(f, s);
  return !s.empty() && s.find("[never]") == std::string::npos;
}

// O_DIRECT buffers from 2 MiB up start on a huge page and ask for huge pages (pinned or not,
// allocated or reserved): on 4 KiB pages a 1 MiB request is split by a virtio disk (docs/aio.md).
TEST(HostBuffer, IoBuffersFromTwoMiBUpStartOnAHugePageAndAskForHugePages) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  for (bool pin : {false, true}) {
    Result<detail::HostBuffer> big = detail::HostBuffer::allocate(3 * kMiB + 4096, pin);
    ASSERT_TRUE(big.is_ok()) << big.status().to_string();
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(big->data()) % (2 * kMiB), 0u) << "pin " << pin;
    EXPECT_EQ(big->size(), 3 * kMiB + 4096) << "sizes are not rounded to huge pages";
    if (thp_enabled()) {
      EXPECT_EQ(thp_eligible(big->data()), 1) << "pin " << pin;
    }
    Result<detail::HostBuffer> small = detail::HostBuffer::allocate(8192, pin);
    ASSERT_TRUE(small.is_ok());
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(small->data()) % 4096, 0u);
  }
  Result<detail::HostBuffer> arena = detail::HostBuffer::reserve(5 * kMiB);
  ASSERT_TRUE(arena.is_ok()) << arena.status().to_string();
  std::byte* p = arena->data();
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % (2 * kMiB), 0u);
  if (thp_enabled()) {
    EXPECT_EQ(thp_eligible(p), 1);
  }
  // Both ends of the reserved range are usable once committed.
  arena->commit(0, 4096, false);
  arena->commit(5 * kMiB - 4096, 4096, false);
  p[0] = std::byte{1};
  p[5 * kMiB - 1] = std::byte{2};
  EXPECT_EQ(p[0], std::byte{1});
  EXPECT_EQ(p[5 * kMiB - 1], std::byte{2});
}

TEST(PinnedPool, CapacityIsCountTimesAlignedBuffer) {
  auto pool = make_pool(5, 10000, 2);  // 20000 bytes -> 20480 per buffer
  ASSERT_TRUE(pool);
  EXPECT_EQ(pool->budget().buffer_bytes(), 20480u);
  EXPECT_EQ(pool->capacity(), 5u * 20480u);
  EXPECT_EQ(pool->resident_capacity(), pool->capacity());
  EXPECT_EQ(pool->in_use(), 0u);
  // buffer_count blocks of buffer_size elements always fit at once.
  std::vector<PinnedBlock> blocks;
  for (int i = 0; i < 5; ++i) {
    Result<PinnedBlock> b = pool->try_acquire(20000);
    ASSERT_TRUE(b.is_ok() && *b);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b->data()) % kSwapAlignment, 0u);
    EXPECT_EQ(b->size(), 20000u);
    EXPECT_EQ(b->capacity(), 20480u);
    blocks.push_back(std::move(b).value());
  }
  EXPECT_EQ(pool->in_use(), pool->capacity());
  Result<PinnedBlock> none = pool->try_acquire(1);
  ASSERT_TRUE(none.is_ok());
  EXPECT_FALSE(*none);
  blocks.clear();
  EXPECT_EQ(pool->in_use(), 0u);
  EXPECT_EQ(pool->high_water(), pool->capacity());
}

TEST(PinnedPool, AnUnpinnedArenaIsNotRegisteredWithCuda) {
  // Only a pinned arena is registered (src/aio/pinned_cuda.cpp); GPU copies refuse pageable memory.
  auto pool = make_pool(2, 4096, 1);
  ASSERT_TRUE(pool);
  EXPECT_FALSE(pool->locked());
  EXPECT_FALSE(pool->cuda_registered());
}

TEST(PinnedPool, RejectsZeroBudget) {
  PinnedPoolOptions o;
  o.budget = PoolBudget{"offload_param", 0, 100, 2};
  Result<std::unique_ptr<PinnedPool>> p = PinnedPool::create(o);
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("offload_param.buffer_count"), std::string::npos);
}

TEST(PinnedPool, NeverFittingRequestFailsAtOnceNamingTheBudget) {
  auto pool = make_pool(2, 1 << 20, 2);  // 2 x 2 MiB
  ASSERT_TRUE(pool);
  Result<PinnedBlock> b = pool->acquire(5u << 20);  // would block forever if it waited
  ASSERT_FALSE(b.is_ok());
  EXPECT_EQ(b.status().code(), ErrorCode::kResourceExhausted);
  const std::string& m = b.status().message();
  EXPECT_NE(m.find("offload_param.buffer_count x offload_param.buffer_size = 2 x 1048576"), std::string::npos) << m;
  // 5 MiB over 2 buffers: 2.5 MiB each = 1310720 elements of 2 bytes, i.e. 262144 more.
  EXPECT_NE(m.find("raise offload_param.buffer_size by 262144 elements (to 1310720)"), std::string::npos) << m;
  EXPECT_NE(m.find("offload_param.buffer_count to 3"), std::string::npos) << m;
  Result<PinnedBlock> c = pool->acquire_chunk(8u << 20, 5u << 20);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kResourceExhausted);
}

TEST(PinnedPool, ReserveIsForStreamingOnly) {
  auto pool = make_pool(3, 4096, 4, /*reserve=*/1);  // 3 x 16 KiB, the last one for chunks
  ASSERT_TRUE(pool);
  EXPECT_EQ(pool->resident_capacity(), 2u * 16384u);
  Result<PinnedBlock> big = pool->acquire(3 * 16384);
  ASSERT_FALSE(big.is_ok());
  EXPECT_NE(big.status().message().find("1 buffer kept for streaming"), std::string::npos);
  Result<PinnedBlock> a = pool->acquire(2 * 16384);
  ASSERT_TRUE(a.is_ok() && *a);
  // Resident space is full, but a chunk is still served from the reserve.
  Result<PinnedBlock> c = pool->try_acquire_chunk(1 << 20, 4096);
  ASSERT_TRUE(c.is_ok() && *c);
  EXPECT_EQ(c->size(), 16384u);  // as much as there is
  EXPECT_LE(pool->high_water(), pool->capacity());
}

TEST(PinnedPool, ChunksTakeWhatIsFree) {
  auto pool = make_pool(4, 4096, 4);  // 64 KiB
  ASSERT_TRUE(pool);
  Result<PinnedBlock> a = pool->acquire(40960);
  ASSERT_TRUE(a.is_ok() && *a);
  Result<PinnedBlock> c = pool->acquire_chunk(65536, 4096);
  ASSERT_TRUE(c.is_ok() && *c);
  EXPECT_EQ(c->size(), 65536u - 40960u);
  Result<PinnedBlock> d = pool->try_acquire_chunk(65536, 4096);
  ASSERT_TRUE(d.is_ok());
  EXPECT_FALSE(*d);
}

TEST(PinnedPool, WaitingRequestIsServedByARelease) {
  auto pool = make_pool(2, 4096, 4);
  ASSERT_TRUE(pool);
  Result<PinnedBlock> a = pool->acquire(32768);
  ASSERT_TRUE(a.is_ok() && *a);
  auto waiter = std::async(std::launch::async, [&] { return pool->acquire(8192); });
  EXPECT_EQ(waiter.wait_for(50ms), std::future_status::timeout);
  a->reset();
  Result<PinnedBlock> b = waiter.get();
  ASSERT_TRUE(b.is_ok() && *b);
  EXPECT_EQ(b->size(), 8192u);
}

TEST(PinnedPool, TimedOutWaiterGivesUpItsPlace) {
  auto pool = make_pool(2, 4096, 4);
  ASSERT_TRUE(pool);
  Result<PinnedBlock> a = pool->acquire(32768);
  ASSERT_TRUE(a.is_ok() && *a);
  Result<PinnedBlock> t = pool->acquire_for(4096, 10ms);
  ASSERT_TRUE(t.is_ok());
  EXPECT_FALSE(*t);
  // A request queued behind the cancelled one must still be served.
  auto first = std::async(std::launch::async, [&] { return pool->acquire_for(4096, 20ms); });
  auto second = std::async(std::launch::async, [&] { return pool->acquire(4096); });
  Result<PinnedBlock> f = first.get();
  ASSERT_TRUE(f.is_ok());
  EXPECT_FALSE(*f);
  a->reset();
  Result<PinnedBlock> s = second.get();
  ASSERT_TRUE(s.is_ok() && *s);
}

TEST(PinnedPool, ConcurrentUseStaysWithinBudgetWithoutOverlap) {
  auto pool = make_pool(4, 16384, 4, /*reserve=*/1);  // 4 x 64 KiB
  ASSERT_TRUE(pool);
  std::atomic<int> errors{0};
  auto body = [&](unsigned seed) {
    std::mt19937 rng(seed);
    for (int i = 0; i < 300; ++i) {
      const bool chunk = rng() % 2 == 0;
      const std::size_t bytes = 1 + rng() % (chunk ? 3 * 65536 : 2 * 65536);
      Result<PinnedBlock> b = chunk ? pool->acquire_chunk(bytes, std::min<std::size_t>(bytes, 4096))
                                    : pool->acquire(bytes);
      if (!b.is_ok() || !*b) {
        ++errors;
        continue;
      }
      // Our own bytes must survive while we hold the block: blocks never overlap.
      testing::fill_pattern(b->data(), b->capacity(), 0, seed * 1000 + i);
      std::this_thread::yield();
      if (testing::first_mismatch(b->data(), b->capacity(), 0, seed * 1000 + i) >= 0) ++errors;
      if (pool->in_use() > pool->capacity()) ++errors;
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 4; ++t) threads.emplace_back(body, t + 1);
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_LE(pool->high_water(), pool->capacity());
  EXPECT_GT(pool->high_water(), 0u);
  EXPECT_EQ(pool->in_use(), 0u);
}

// Resident bytes of this process (/proc/self/statm).
std::size_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "re");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  const int got = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return got == 2 ? resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

// A growing arena is memory only where leases have reached, in growth steps, up to its budget;
// a whole one is memory from the start.
TEST(PinnedPool, AGrowingArenaBecomesMemoryAsLeasesReachIt) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  PinnedPoolOptions o;
  o.budget = PoolBudget{"offload_param", 8, 8 * kMiB, 1};  // 64 MiB
  o.pin_memory = false;
  o.grow_on_demand = true;
  const std::size_t rss0 = resident_bytes();
  auto made = PinnedPool::create(o);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  PinnedPool& pool = *made.value();
  EXPECT_EQ(pool.capacity(), 64 * kMiB);
  EXPECT_EQ(pool.allocated(), 0u);
  EXPECT_LT(resident_bytes(), rss0 + 16 * kMiB) << "the reserved arena became memory at create";
  auto a = pool.acquire(kMiB);
  ASSERT_TRUE(a.is_ok() && a.value());
  EXPECT_EQ(pool.allocated(), PinnedPool::kGrowthStep);
  std::memset(a->data(), 0x5a, kMiB);  // usable
  auto b = pool.acquire(3 * kMiB);      // reaches into the next two steps
  ASSERT_TRUE(b.is_ok() && b.value());
  EXPECT_EQ(pool.allocated(), 2 * PinnedPool::kGrowthStep);
  std::memset(b->data(), 0xa5, 3 * kMiB);
  EXPECT_EQ(static_cast<unsigned char>(a->data()[kMiB - 1]), 0x5au);
  a->reset();
  b->reset();
  EXPECT_EQ(pool.allocated(), 2 * PinnedPool::kGrowthStep);  // it does not shrink
  EXPECT_EQ(pool.high_water(), 4 * kMiB);
  {
    auto all = pool.acquire(pool.capacity());
    ASSERT_TRUE(all.is_ok() && all.value());
    EXPECT_EQ(pool.allocated(), pool.capacity());  // never past the budget
  }
  o.grow_on_demand = false;
  auto whole = PinnedPool::create(o);
  ASSERT_TRUE(whole.is_ok());
  EXPECT_EQ(whole.value()->allocated(), whole.value()->capacity());
}

}  // namespace
}  // namespace zinf::swap
