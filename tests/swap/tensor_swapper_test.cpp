// Tests of the tensor swapper: random operation sequences stay byte-exact within the pool budget.
#include "zinf/swap/tensor_swapper.h"

#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "swap_test_util.h"

namespace zinf::swap {
namespace {

using testing::TempDir;

struct Rig {
  TempDir dir;
  std::shared_ptr<aio::FaultInjector> faults = std::make_shared<aio::FaultInjector>();
  std::unique_ptr<aio::Handle> handle;
  std::unique_ptr<SwapStore> store;
  std::unique_ptr<PinnedPool> pool;
  std::unique_ptr<TensorSwapper> swapper;

  // 4 buffers of 32768 bf16 (64 KiB each), one kept for streaming.
  explicit Rig(std::uint64_t max_in_cpu = 0, std::size_t paths = 2) {
    handle = testing::make_handle(faults);
    StoreConfig sc;
    for (std::size_t i = 0; i < paths; ++i) sc.nvme_paths.push_back(dir.sub("nvme" + std::to_string(i)));
    sc.stripe_unit = 16 << 10;
    Result<std::unique_ptr<SwapStore>> s = SwapStore::open(sc, OpenMode::kCreate, *handle);
    EXPECT_TRUE(s.is_ok()) << s.status().to_string();
    store = std::move(s).value();
    PinnedPoolOptions po;
    po.budget = PoolBudget{"offload_param", 4, 32768, 2};
    po.pin_memory = false;
    po.streaming_reserve_buffers = 1;
    pool = std::move(PinnedPool::create(po, handle.get())).value();
    TensorSwapperConfig tc;
    tc.max_in_cpu = max_in_cpu;
    Result<std::unique_ptr<TensorSwapper>> t = TensorSwapper::create(tc, *pool, *store);
    EXPECT_TRUE(t.is_ok());
    swapper = std::move(t).value();
  }
  ~Rig() {
    swapper.reset();
    pool.reset();
  }
};

// A pending operation and what it must have produced.
struct Pending {
  SwapTicket ticket;
  std::string key;
  std::shared_ptr<std::vector<std::byte>> buffer;    // a source or a destination
  std::shared_ptr<std::vector<std::byte>> expected;  // for swap_in: the contents at issue time
  bool must_fail = false;
};

void check_done(Pending& p) {
  const Status st = p.ticket.wait();
  if (p.must_fail) {
    EXPECT_EQ(st.code(), ErrorCode::kResourceExhausted) << p.key;
    return;
  }
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  if (p.expected) {
    ASSERT_EQ(p.buffer->size(), p.expected->size());
    EXPECT_TRUE(std::memcmp(p.buffer->data(), p.expected->data(), p.buffer->size()) == 0) << "swap_in " << p.key;
  }
}

TEST(TensorSwapper, RandomSequencesStayByteExactWithinBudget) {
  Rig rig(/*max_in_cpu=*/60000);
  TensorSwapper& sw = *rig.swapper;
  std::mt19937_64 rng(2024);
  std::map<std::string, std::vector<std::byte>> model;  // what each tensor holds
  std::vector<std::string> keys;
  for (int i = 0; i < 20; ++i) {
    const DType dt = std::array{DType::kF32, DType::kBF16, DType::kF16}[rng() % 3];
    // Up to 400 KB: some fit a buffer, some only the resident space, some only streaming.
    const std::uint64_t numel = 1 + rng() % (i % 4 == 0 ? 100000 : 20000);
    const std::string key = "param/layer" + std::to_string(i) + ".weight";
    ASSERT_TRUE(sw.declare(key, dt, numel).is_ok());
    keys.push_back(key);
    model[key] = testing::pattern(numel * dtype_size(dt), i);
    Pending p{sw.swap_out(key, model[key].data()), key, nullptr, nullptr};
    check_done(p);
  }
  EXPECT_GT(sw.cpu_elements(), 0u);
  EXPECT_LE(sw.cpu_elements(), 60000u);

  std::deque<Pending> pending;
  std::vector<std::string> staged;
  for (int step = 0; step < 400; ++step) {
    const std::string& key = keys[rng() % keys.size()];
    std::vector<std::byte>& m = model[key];
    const bool stageable = m.size() <= rig.pool->resident_capacity();
    switch (rng() % 6) {
      case 0: {  // rewrite the whole tensor
        auto src = std::make_shared<std::vector<std::byte>>(testing::pattern(m.size(), 1000 + step));
        m = *src;
        pending.push_back(Pending{sw.swap_out(key, src->data()), key, src, nullptr});
        break;
      }
      case 1: {  // rewrite an aligned range
        const std::uint64_t pages = (m.size() + 4095) / 4096;
        const std::uint64_t first = rng() % pages;
        const std::uint64_t last = first + rng() % (pages - first);  // inclusive
        const std::uint64_t off = first * 4096;
        const std::uint64_t len = std::min<std::uint64_t>(m.size(), (last + 1) * 4096) - off;
        auto src = std::make_shared<std::vector<std::byte>>(testing::pattern(len, 5000 + step));
        std::memcpy(m.data() + off, src->data(), len);
        pending.push_back(Pending{sw.write_range(key, off, *src), key, src, nullptr});
        break;
      }
      case 2:
      case 3: {  // read it back
        auto dst = std::make_shared<std::vector<std::byte>>(m.size());
        pending.push_back(Pending{sw.swap_in(key, dst->data()), key, dst, std::make_shared<std::vector<std::byte>>(m)});
        break;
      }
      case 4: {  // stage it, or release a staged one
        if (!staged.empty() && rng() % 2 == 0) {
          pending.push_back(Pending{sw.release(staged.back()), staged.back(), nullptr, nullptr});
          staged.pop_back();
        } else {
          Pending p{sw.prefetch(key), key, nullptr, nullptr, !stageable};
          if (!stageable) {
            EXPECT_TRUE(p.ticket.ready()) << "a prefetch that can never fit must fail at once";
          }
          if (stageable) staged.push_back(key);
          pending.push_back(std::move(p));
        }
        break;
      }
      case 5: {  // view it (only what can be staged), after giving back the staged copies
        if (!stageable) break;
        for (const std::string& k : staged) pending.push_back(Pending{sw.release(k), k, nullptr, nullptr});
        staged.clear();
        for (Pending& p : pending) check_done(p);
        pending.clear();
        Result<TensorView> v = sw.acquire(key);
        ASSERT_TRUE(v.is_ok()) << v.status().to_string();
        ASSERT_EQ(v->size(), m.size());
        EXPECT_TRUE(std::memcmp(v->data(), m.data(), m.size()) == 0) << "view of " << key;
        pending.push_back(Pending{sw.release(key), key, nullptr, nullptr});
        break;
      }
    }
    if (pending.size() > 12) {
      for (Pending& p : pending) check_done(p);
      pending.clear();
    }
    ASSERT_LE(rig.pool->in_use(), rig.pool->capacity());
  }
  for (Pending& p : pending) check_done(p);
  for (const std::string& k : keys) {
    std::vector<std::byte> out(model[k].size());
    ASSERT_TRUE(sw.swap_in(k, out.data()).wait().is_ok());
    EXPECT_TRUE(out == model[k]) << k;
  }
  EXPECT_LE(rig.pool->high_water(), rig.pool->capacity());
  EXPECT_GT(rig.pool->high_water(), 0u);
}

TEST(TensorSwapper, LargerThanTheBudgetIsStreamedNotRefused) {
  Rig rig;
  TensorSwapper& sw = *rig.swapper;
  const std::uint64_t numel = 1'000'000;  // 2 MB of bf16 through a 256 KiB pool
  ASSERT_TRUE(sw.declare("big", DType::kBF16, numel).is_ok());
  const std::vector<std::byte> data = testing::pattern(numel * 2, 42);
  ASSERT_TRUE(sw.swap_out("big", data.data()).wait().is_ok());
  std::vector<std::byte> out(data.size());
  ASSERT_TRUE(sw.swap_in("big", out.data()).wait().is_ok());
  EXPECT_TRUE(out == data);
  // Chunks reach the sink in order and cover the tensor.
  std::uint64_t next = 0;
  ASSERT_TRUE(sw.swap_in("big", [&](std::uint64_t offset, std::span<const std::byte> bytes) {
                  EXPECT_EQ(offset, next);
                  EXPECT_LE(bytes.size(), sw.chunk_bytes());
                  next += bytes.size();
                  return Status::ok();
                }).wait().is_ok());
  EXPECT_EQ(next, data.size());
  // Holding it whole cannot work: that fails at once and says which budget to raise.
  const SwapTicket t = sw.prefetch("big");
  EXPECT_TRUE(t.ready());
  const Status st = t.wait();
  EXPECT_EQ(st.code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(st.message().find("raise offload_param.buffer_size"), std::string::npos) << st.to_string();
  EXPECT_LE(rig.pool->high_water(), rig.pool->capacity());
}

TEST(TensorSwapper, CpuTierServesReadsWithoutIoAndWritesThrough) {
  Rig rig(/*max_in_cpu=*/10000);
  TensorSwapper& sw = *rig.swapper;
  ASSERT_TRUE(sw.declare("small", DType::kF32, 6000).is_ok());
  ASSERT_TRUE(sw.declare("second", DType::kF32, 6000).is_ok());  // would exceed max_in_cpu
  EXPECT_EQ(sw.info("small")->home, Tier::kCpu);
  EXPECT_EQ(sw.info("second")->home, Tier::kNvme);
  EXPECT_EQ(sw.cpu_elements(), 6000u);
  const std::vector<std::byte> data = testing::pattern(24000, 3);
  ASSERT_TRUE(sw.swap_out("small", data.data()).wait().is_ok());
  const std::uint64_t reads = rig.store->stats().bytes_read;
  std::vector<std::byte> out(24000);
  ASSERT_TRUE(sw.swap_in("small", out.data()).wait().is_ok());
  EXPECT_TRUE(out == data);
  EXPECT_EQ(rig.store->stats().bytes_read, reads);
  // Written through: the store has it too.
  std::vector<std::byte> raw(24576);
  ASSERT_TRUE(rig.store->read("small", 0, raw.data(), 24000).is_ok());
  EXPECT_TRUE(std::memcmp(raw.data(), data.data(), data.size()) == 0);
}

TEST(TensorSwapper, ViewKeepsTheStagedCopyUntilDestroyed) {
  Rig rig;
  TensorSwapper& sw = *rig.swapper;
  ASSERT_TRUE(sw.declare("w", DType::kBF16, 30000).is_ok());
  const std::vector<std::byte> data = testing::pattern(60000, 8);
  ASSERT_TRUE(sw.swap_out("w", data.data()).wait().is_ok());
  Result<TensorView> v = sw.acquire("w");
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  ASSERT_TRUE(sw.release("w").wait().is_ok());
  EXPECT_TRUE(std::memcmp(v->data(), data.data(), data.size()) == 0);
  EXPECT_GT(rig.pool->in_use(), 0u);
  EXPECT_EQ(sw.info("w")->views, 1);
  v->reset();
  EXPECT_EQ(rig.pool->in_use(), 0u);
  EXPECT_FALSE(sw.info("w")->staged);
}

TEST(TensorSwapper, IoErrorFailsTheOperationNotTheSwapper) {
  Rig rig;
  TensorSwapper& sw = *rig.swapper;
  ASSERT_TRUE(sw.declare("x", DType::kF32, 50000).is_ok());
  const std::vector<std::byte> data = testing::pattern(200000, 9);
  ASSERT_TRUE(sw.swap_out("x", data.data()).wait().is_ok());
  rig.faults->add(testing::fail_reads());
  std::vector<std::byte> out(data.size());
  const Status st = sw.swap_in("x", out.data()).wait();
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("swap_in 'x'"), std::string::npos) << st.to_string();
  EXPECT_EQ(st.sys_errno(), 5) << st.to_string();
  ASSERT_TRUE(sw.swap_in("x", out.data()).wait().is_ok());
  EXPECT_TRUE(out == data);
  EXPECT_EQ(rig.pool->in_use(), 0u);
  EXPECT_EQ(sw.swap_in("unknown", out.data()).wait().code(), ErrorCode::kNotFound);
}

// A prefetch whose ticket nobody waits for (a read ahead) fails with EIO: the acquire that
// follows reports it, even though its own read succeeds, and the one after that is clean.
TEST(TensorSwapper, AFailedReadAheadIsReportedByTheNextAcquire) {
  Rig rig;
  TensorSwapper& sw = *rig.swapper;
  ASSERT_TRUE(sw.declare("w", DType::kBF16, 30000).is_ok());
  const std::vector<std::byte> data = testing::pattern(60000, 10);
  ASSERT_TRUE(sw.swap_out("w", data.data()).wait().is_ok());
  rig.faults->add(testing::fail_reads(0, 1));  // the next read fails, the ones after it succeed
  (void)sw.prefetch("w");  // dropped, as the parameter tier's read ahead drops its tickets
  Result<TensorView> v = sw.acquire("w");
  ASSERT_FALSE(v.is_ok());
  EXPECT_EQ(v.status().sys_errno(), 5) << v.status().to_string();
  EXPECT_NE(v.status().message().find("an earlier read ahead"), std::string::npos) << v.status().to_string();
  v = sw.acquire("w");
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_TRUE(std::memcmp(v->data(), data.data(), data.size()) == 0);
}

TEST(TensorSwapper, ReopenedStoreKeepsContentsAcrossSwappers) {
  TempDir dir;
  auto handle = testing::make_handle();
  StoreConfig sc;
  sc.nvme_paths = {dir.path()};
  PinnedPoolOptions po;
  po.budget = PoolBudget{"offload_param", 2, 65536, 2};
  po.pin_memory = false;
  const std::vector<std::byte> a = testing::pattern(100000, 1), b = testing::pattern(3000, 2);
  {
    auto store = std::move(SwapStore::open(sc, OpenMode::kCreate, *handle)).value();
    auto pool = std::move(PinnedPool::create(po)).value();
    TensorSwapperConfig tc;
    tc.max_in_cpu = 2000;  // "b" lives in the CPU tier
    auto sw = std::move(TensorSwapper::create(tc, *pool, *store)).value();
    ASSERT_TRUE(sw->declare("b", DType::kF16, 1500).is_ok());
    ASSERT_TRUE(sw->declare("a", DType::kBF16, 50000).is_ok());
    ASSERT_TRUE(sw->swap_out("a", a.data()).wait().is_ok());
    ASSERT_TRUE(sw->swap_out("b", b.data()).wait().is_ok());
    ASSERT_TRUE(sw->flush().is_ok());
  }
  auto store = std::move(SwapStore::open(sc, OpenMode::kOpen, *handle)).value();
  auto pool = std::move(PinnedPool::create(po)).value();
  TensorSwapperConfig tc;
  tc.max_in_cpu = 2000;
  auto sw = std::move(TensorSwapper::create(tc, *pool, *store)).value();
  ASSERT_TRUE(sw->declare("b", DType::kF16, 1500).is_ok());  // adopted, loaded into the CPU tier
  ASSERT_TRUE(sw->declare("a", DType::kBF16, 50000).is_ok());
  EXPECT_EQ(sw->info("b")->home, Tier::kCpu);
  std::vector<std::byte> out_a(a.size()), out_b(b.size());
  ASSERT_TRUE(sw->swap_in("a", out_a.data()).wait().is_ok());
  ASSERT_TRUE(sw->swap_in("b", out_b.data()).wait().is_ok());
  EXPECT_TRUE(out_a == a);
  EXPECT_TRUE(out_b == b);
}

}  // namespace
}  // namespace zinf::swap
