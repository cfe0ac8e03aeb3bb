// The caching allocator's bookkeeping on the host: a malloc backend with fences the test completes
// by hand stands in for cudaMalloc and cudaEvents. No device needed.
#include "device/caching_allocator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <vector>

namespace zinf::device {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr StreamKey kS1 = 0x1000, kS2 = 0x2000, kS3 = 0x3000;

// What the fake backend saw and holds; shared with the test after the allocator owns the backend.
struct FakeDevice {
  std::size_t capacity = 0;  // 0: unlimited; else allocate fails (out of memory) beyond it
  std::map<void*, std::size_t> live;
  std::size_t live_bytes = 0;
  std::uint64_t allocations = 0, frees = 0, waits = 0;
  std::vector<void*> freed;  // in order
  struct Fence {
    StreamKey stream;
    bool done = false;
    bool released = false;
  };
  std::vector<Fence> fences;  // FenceKey = index + 1
  bool fail_record = false;
  std::set<void*> ever_freed_while_fenced;

  // The work enqueued so far on `stream` completes.
  void complete(StreamKey stream) {
    for (Fence& f : fences) {
      if (f.stream == stream) f.done = true;
    }
  }
  std::size_t unreleased_fences() const {
    std::size_t n = 0;
    for (const Fence& f : fences) n += f.released ? 0 : 1;
    return n;
  }
};

class FakeBackend final : public AllocatorBackend {
 public:
  explicit FakeBackend(std::shared_ptr<FakeDevice> dev) : dev_(std::move(dev)) {}
  Result<void*> allocate(std::size_t bytes) override {
    if (dev_->capacity != 0 && dev_->live_bytes + bytes > dev_->capacity) {
      return Status::resource_exhausted("fake cudaMalloc: out of memory");
    }
    void* p = std::malloc(bytes);
    if (p == nullptr) return Status::resource_exhausted("malloc failed");
    dev_->live[p] = bytes;
    dev_->live_bytes += bytes;
    ++dev_->allocations;
    return p;
  }
  void deallocate(void* ptr, std::size_t bytes) noexcept override {
    auto it = dev_->live.find(ptr);
    if (it == dev_->live.end() || it->second != bytes) std::abort();  // a double free or a wrong size
    dev_->live.erase(it);
    dev_->live_bytes -= bytes;
    ++dev_->frees;
    dev_->freed.push_back(ptr);
    std::free(ptr);
  }
  Result<FenceKey> record_fence(StreamKey stream) override {
    if (dev_->fail_record) return Status::internal("fake cudaEventRecord failed");
    dev_->fences.push_back({stream});
    return static_cast<FenceKey>(dev_->fences.size());
  }
  Result<bool> fence_done(FenceKey fence) override { return dev_->fences.at(fence - 1).done; }
  Status wait_fence(FenceKey fence) override {
    ++dev_->waits;
    dev_->fences.at(fence - 1).done = true;  // waiting lets the stream's work finish
    return Status::ok();
  }
  void release_fence(FenceKey fence) noexcept override { dev_->fences.at(fence - 1).released = true; }

 private:
  std::shared_ptr<FakeDevice> dev_;
};

class CachingAllocatorTest : public ::testing::Test {
 protected:
  void make(std::size_t cap = 0, std::size_t device_capacity = 0) {
    dev_ = std::make_shared<FakeDevice>();
    dev_->capacity = device_capacity;
    CachingAllocatorOptions options;
    options.cap_bytes = cap;
    options.name = "GPU 0 memory";
    alloc_ = std::make_unique<CachingAllocator>(std::make_unique<FakeBackend>(dev_), options);
  }
  void SetUp() override { make(); }

  DeviceBlock get(std::size_t bytes, StreamKey stream, const char* what = "test tensor") {
    Result<DeviceBlock> b = alloc_->allocate(bytes, stream, what);
    EXPECT_TRUE(b.is_ok()) << b.status().to_string();
    return b.is_ok() ? std::move(b).value() : DeviceBlock();
  }

  std::shared_ptr<FakeDevice> dev_;
  std::unique_ptr<CachingAllocator> alloc_;
};

TEST(CachingAllocatorSizes, SizeClasses) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size(kMiB - 1), kMiB);
  EXPECT_EQ(CachingAllocator::round_size(kMiB), kMiB);
  EXPECT_EQ(CachingAllocator::round_size(kMiB + 1), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::round_size(3 * kMiB), 4 * kMiB);
  EXPECT_EQ(CachingAllocator::round_size(100000000), 100663296u);  // 48 x 2 MiB
  EXPECT_EQ(CachingAllocator::round_size(SIZE_MAX), 0u);           // overflow is reported, not wrapped
  EXPECT_EQ(CachingAllocator::round_size(SIZE_MAX - kMiB), 0u);
}

TEST(CachingAllocatorSizes, ReuseAtMostAQuarterLarger) {
  EXPECT_TRUE(CachingAllocator::reusable_for(8 * kMiB, 8 * kMiB));
  EXPECT_TRUE(CachingAllocator::reusable_for(10 * kMiB, 8 * kMiB));
  EXPECT_FALSE(CachingAllocator::reusable_for(12 * kMiB, 8 * kMiB));
  EXPECT_FALSE(CachingAllocator::reusable_for(4 * kMiB, 8 * kMiB));
  EXPECT_TRUE(CachingAllocator::reusable_for(640, 512));
  EXPECT_FALSE(CachingAllocator::reusable_for(1024, 512));
}

TEST_F(CachingAllocatorTest, ZeroBytesIsAnEmptyBlockWithoutTheBackend) {
  DeviceBlock b = get(0, kS1);
  EXPECT_FALSE(b);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(dev_->allocations, 0u);
  b.reset();
  EXPECT_EQ(alloc_->stats().blocks_cached, 0u);
}

TEST_F(CachingAllocatorTest, SameStreamReusesWithoutTheBackend) {
  void* first = nullptr;
  {
    DeviceBlock b = get(1000, kS1);
    ASSERT_TRUE(b);
    EXPECT_EQ(b.size(), 1000u);
    EXPECT_EQ(b.capacity(), 1024u);
    EXPECT_EQ(b.stream(), kS1);
    std::memset(b.data(), 0xAB, b.capacity());  // the whole size class is usable
    first = b.data();
  }
  AllocatorStats s = alloc_->stats();
  EXPECT_EQ(s.in_use, 0u);
  EXPECT_EQ(s.cached, 1024u);
  DeviceBlock again = get(900, kS1);  // same size class
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(dev_->allocations, 1u);
  s = alloc_->stats();
  EXPECT_EQ(s.cache_hits, 1u);
  EXPECT_EQ(s.cache_misses, 1u);
  EXPECT_EQ(s.cached, 0u);
  EXPECT_EQ(s.in_use, 1024u);
  EXPECT_EQ(s.requested, 900u);
}

TEST_F(CachingAllocatorTest, ATrainingStepPatternAllocatesOnlyInTheFirstStep) {
  const std::vector<std::size_t> shapes = {4 * kMiB + 12, 4 * kMiB + 12, 768, 3 * kMiB, 50 * kMiB, 768 * 4};
  std::uint64_t after_first = 0;
  for (int step = 0; step < 10; ++step) {
    std::vector<DeviceBlock> live;
    for (std::size_t bytes : shapes) live.push_back(get(bytes, kS1));
    // Distinct blocks while they are all in use.
    std::set<void*> ptrs;
    for (const DeviceBlock& b : live) ptrs.insert(b.data());
    EXPECT_EQ(ptrs.size(), shapes.size());
    live.clear();
    if (step == 0) after_first = dev_->allocations;
  }
  EXPECT_EQ(after_first, shapes.size());
  EXPECT_EQ(dev_->allocations, after_first);
  EXPECT_EQ(dev_->frees, 0u);
  EXPECT_EQ(alloc_->stats().cache_hits, 9 * shapes.size());
}

TEST_F(CachingAllocatorTest, AnotherStreamDoesNotReuseTheBlock) {
  void* first = nullptr;
  {
    DeviceBlock b = get(4096, kS1);
    first = b.data();
  }
  DeviceBlock other = get(4096, kS2);
  EXPECT_NE(other.data(), first);
  EXPECT_EQ(dev_->allocations, 2u);
}

TEST_F(CachingAllocatorTest, AMuchLargerCachedBlockIsNotUsed) {
  void* big = nullptr;
  {
    DeviceBlock b = get(8 * kMiB, kS1);
    big = b.data();
  }
  DeviceBlock six = get(6 * kMiB, kS1);  // 8 MiB is a third larger: not reused
  EXPECT_NE(six.data(), big);
  DeviceBlock seven = get(7 * kMiB, kS1);  // rounds to 8 MiB
  EXPECT_EQ(seven.data(), big);
  EXPECT_EQ(seven.capacity(), 8 * kMiB);
}

TEST_F(CachingAllocatorTest, BestFitTakesTheSmallestBlockThatFits) {
  void* a = nullptr;
  void* b = nullptr;
  {
    DeviceBlock x = get(10 * kMiB, kS1);
    DeviceBlock y = get(8 * kMiB, kS1);
    a = x.data();
    b = y.data();
  }
  DeviceBlock z = get(8 * kMiB, kS1);
  EXPECT_EQ(z.data(), b);
  DeviceBlock w = get(8 * kMiB, kS1);  // the 10 MiB block is a quarter larger: reused
  EXPECT_EQ(w.data(), a);
  EXPECT_EQ(w.capacity(), 10 * kMiB);
}

TEST_F(CachingAllocatorTest, UseOnAnotherStreamDelaysReuseUntilItsFence) {
  void* first = nullptr;
  {
    DeviceBlock b = get(kMiB, kS1);
    b.record_use(kS2);
    b.record_use(kS2);  // once is enough
    b.record_use(kS1);  // its own stream needs no fence
    first = b.data();
  }
  ASSERT_EQ(dev_->fences.size(), 1u);
  EXPECT_EQ(dev_->fences[0].stream, kS2);
  EXPECT_EQ(alloc_->stats().cached, kMiB);  // held, behind the fence
  DeviceBlock while_pending = get(kMiB, kS1);
  EXPECT_NE(while_pending.data(), first) << "reused while work on another stream may still use it";
  dev_->complete(kS2);
  DeviceBlock after = get(kMiB, kS1);
  EXPECT_EQ(after.data(), first);
  EXPECT_EQ(dev_->unreleased_fences(), 0u);
}

TEST_F(CachingAllocatorTest, EveryUsingStreamMustFinish) {
  void* first = nullptr;
  {
    DeviceBlock b = get(kMiB, kS1);
    b.record_use(kS2);
    b.record_use(kS3);
    first = b.data();
  }
  dev_->complete(kS2);
  DeviceBlock during = get(kMiB, kS1);
  EXPECT_NE(during.data(), first);
  dev_->complete(kS3);
  DeviceBlock b = get(kMiB, kS1);
  EXPECT_EQ(b.data(), first);
}

TEST_F(CachingAllocatorTest, AFenceThatCannotBeRecordedFreesTheBlock) {
  void* first = nullptr;
  {
    DeviceBlock b = get(kMiB, kS1);
    b.record_use(kS2);
    first = b.data();
    dev_->fail_record = true;
  }
  dev_->fail_record = false;
  EXPECT_EQ(dev_->frees, 1u);
  EXPECT_EQ(dev_->freed.back(), first);
  const AllocatorStats s = alloc_->stats();
  EXPECT_EQ(s.cached, 0u);
  EXPECT_EQ(s.reserved, 0u);
}

TEST_F(CachingAllocatorTest, TheCapIsNamedWhenARequestCannotFit) {
  make(4 * kMiB);
  DeviceBlock a = get(2 * kMiB, kS1);
  DeviceBlock b = get(2 * kMiB, kS1);
  Result<DeviceBlock> c = alloc_->allocate(1000, kS1, "layer 7 attention output");
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kResourceExhausted);
  const std::string& m = c.status().message();
  EXPECT_NE(m.find("GPU 0 memory"), std::string::npos) << m;
  EXPECT_NE(m.find("layer 7 attention output"), std::string::npos) << m;
  EXPECT_NE(m.find("1000 asked"), std::string::npos) << m;
  EXPECT_NE(m.find("cap is 4194304 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("4194304 are in use"), std::string::npos) << m;
  Result<DeviceBlock> huge = alloc_->allocate(5 * kMiB, kS2, "embedding");
  ASSERT_FALSE(huge.is_ok());
  EXPECT_EQ(huge.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("larger than the cap of 4194304"), std::string::npos)
      << huge.status().message();
  EXPECT_EQ(dev_->allocations, 2u);
}

TEST_F(CachingAllocatorTest, UnderTheCapCachedBlocksAreFreedLargestFirst) {
  make(8 * kMiB);
  void* four = nullptr;
  void* two = nullptr;
  {
    DeviceBlock a = get(4 * kMiB, kS1);
    DeviceBlock b = get(2 * kMiB, kS2);
    four = a.data();
    two = b.data();
  }
  DeviceBlock c = get(6 * kMiB, kS3);  // 6 cached + 6 > 8: free the 4 MiB block, which is enough
  ASSERT_TRUE(c);
  ASSERT_EQ(dev_->freed.size(), 1u);
  EXPECT_EQ(dev_->freed[0], four);
  const AllocatorStats s = alloc_->stats();
  EXPECT_EQ(s.cached, 2 * kMiB);
  EXPECT_EQ(s.reserved, 8 * kMiB);
  EXPECT_LE(s.peak_reserved, 8 * kMiB);
  DeviceBlock d = get(2 * kMiB, kS2);  // still cached
  EXPECT_EQ(d.data(), two);
}

TEST_F(CachingAllocatorTest, UnderTheCapBlocksBehindFencesAreWaitedForThenFreed) {
  make(4 * kMiB);
  {
    DeviceBlock a = get(4 * kMiB, kS1);
    a.record_use(kS2);
  }
  DeviceBlock b = get(4 * kMiB, kS2);  // needs the pending block's memory
  ASSERT_TRUE(b);
  EXPECT_EQ(dev_->waits, 1u);
  EXPECT_EQ(dev_->frees, 1u);
  EXPECT_EQ(dev_->unreleased_fences(), 0u);
  EXPECT_EQ(alloc_->stats().reserved, 4 * kMiB);
}

TEST_F(CachingAllocatorTest, DeviceOutOfMemoryFreesTheCacheAndRetries) {
  make(0, 6 * kMiB);
  { DeviceBlock a = get(4 * kMiB, kS1); }
  DeviceBlock b = get(4 * kMiB, kS2);  // the fake device holds 6 MiB: only after freeing the cached block
  ASSERT_TRUE(b);
  EXPECT_EQ(dev_->frees, 1u);
  EXPECT_EQ(alloc_->stats().cached, 0u);
  Result<DeviceBlock> c = alloc_->allocate(4 * kMiB, kS1, "optimizer state");
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("optimizer state"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("fake cudaMalloc: out of memory"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("cap none"), std::string::npos) << c.status().message();
}

TEST_F(CachingAllocatorTest, ReleaseCachedWaitsForFencesAndFreesEverythingCached) {
  DeviceBlock kept = get(3 * kMiB, kS1);
  {
    DeviceBlock a = get(kMiB, kS1);
    DeviceBlock b = get(2 * kMiB, kS2);
    b.record_use(kS3);
  }
  Result<std::size_t> freed = alloc_->release_cached();
  ASSERT_TRUE(freed.is_ok()) << freed.status().to_string();
  EXPECT_EQ(freed.value(), 3 * kMiB);
  EXPECT_EQ(dev_->waits, 1u);
  const AllocatorStats s = alloc_->stats();
  EXPECT_EQ(s.cached, 0u);
  EXPECT_EQ(s.blocks_cached, 0u);
  EXPECT_EQ(s.reserved, 4 * kMiB);  // the kept block's size class
  EXPECT_EQ(s.in_use, 4 * kMiB);
  EXPECT_EQ(dev_->live.size(), 1u);
  EXPECT_EQ(dev_->live.count(kept.data()), 1u);
}

TEST_F(CachingAllocatorTest, StatsTrackUseCacheAndPeaks) {
  {
    DeviceBlock a = get(3 * kMiB, kS1);  // 4 MiB
    DeviceBlock b = get(100, kS1);       // 512
    AllocatorStats s = alloc_->stats();
    EXPECT_EQ(s.in_use, 4 * kMiB + 512);
    EXPECT_EQ(s.requested, 3 * kMiB + 100);
    EXPECT_EQ(s.blocks_in_use, 2u);
    EXPECT_EQ(s.reserved, s.in_use);
  }
  AllocatorStats s = alloc_->stats();
  EXPECT_EQ(s.in_use, 0u);
  EXPECT_EQ(s.requested, 0u);
  EXPECT_EQ(s.cached, 4 * kMiB + 512);
  EXPECT_EQ(s.blocks_cached, 2u);
  EXPECT_EQ(s.peak_in_use, 4 * kMiB + 512);
  EXPECT_EQ(s.peak_reserved, 4 * kMiB + 512);
  EXPECT_EQ(s.backend_allocations, 2u);
  EXPECT_EQ(s.backend_frees, 0u);
}

TEST_F(CachingAllocatorTest, MovedBlocksAreReturnedOnce) {
  DeviceBlock a = get(kMiB, kS1);
  a.record_use(kS2);
  DeviceBlock b = std::move(a);
  EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): the moved-from block is empty by contract
  DeviceBlock c = get(2 * kMiB, kS1);
  c = std::move(b);  // returns c's block, takes b's
  EXPECT_EQ(alloc_->stats().blocks_in_use, 1u);
  EXPECT_EQ(alloc_->stats().blocks_cached, 1u);
  c.reset();
  EXPECT_EQ(dev_->fences.size(), 1u);  // the moved block kept its recorded use
  c.reset();
  EXPECT_EQ(alloc_->stats().blocks_cached, 2u);
}

TEST_F(CachingAllocatorTest, DestructionFreesEveryCachedBlock) {
  {
    DeviceBlock a = get(kMiB, kS1);
    DeviceBlock b = get(5 * kMiB, kS2);
    b.record_use(kS1);
  }
  alloc_.reset();
  EXPECT_TRUE(dev_->live.empty());
  EXPECT_EQ(dev_->unreleased_fences(), 0u);
}

TEST_F(CachingAllocatorTest, ConcurrentThreadsNeverShareABlock) {
  make(64 * kMiB);
  constexpr int kThreads = 4, kRounds = 300;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const StreamKey stream = t % 2 == 0 ? kS1 : kS2;  // two threads per stream
      for (int i = 0; i < kRounds; ++i) {
        const std::size_t bytes = 512u * static_cast<std::size_t>(1 + (i * 7 + t) % 64);
        Result<DeviceBlock> r = alloc_->allocate(bytes, stream, "thread block");
        if (!r.is_ok()) {
          ++failures[t];
          continue;
        }
        DeviceBlock b = std::move(r).value();
        auto* p = static_cast<unsigned char*>(b.data());
        std::memset(p, t + 1, bytes);
        std::this_thread::yield();
        for (std::size_t k = 0; k < bytes; ++k) {
          if (p[k] != t + 1) {
            ++failures[t];
            break;
          }
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  const AllocatorStats s = alloc_->stats();
  EXPECT_EQ(s.in_use, 0u);
  EXPECT_EQ(s.blocks_in_use, 0u);
  EXPECT_EQ(s.reserved, s.cached);
  EXPECT_EQ(s.reserved, dev_->live_bytes);
  EXPECT_EQ(s.cache_hits + s.cache_misses, static_cast<std::uint64_t>(kThreads * kRounds));
}

}  // namespace
}  // namespace zinf::device
