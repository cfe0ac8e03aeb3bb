// GradStore: the swapped store accumulates the same floats as the in-memory one (signed zeros,
// several micro-batches, partitions in any order, one never reached) and gives the same norm bits.
#include "zero3/grad_store.h"

#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "temp_dir.h"
#include "zinf/aio/fault.h"
#include "zinf/aio/handle.h"
#include "zinf/aio/pinned.h"
#include "zinf/optim/optimizer.h"

namespace zinf::zero3 {
namespace {

using zinf::testing::TempDir;

float value(std::size_t p, std::size_t i, int micro) {
  // -0 in every micro-batch: the sum from a zeroed array is +0 (0 + -0), a copy of the first
  // gradient would keep -0.
  if (i % 11 == 0) return -0.0f;
  if ((i + static_cast<std::size_t>(micro)) % 7 == 0) return -0.0f;  // -0 + -0 stays -0 only from -0
  return std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(p) + 0.7f * static_cast<float>(micro)) *
         1e-3f;
}

// A fault injector whose first rule delays every transfer of kind `op` by 1 us: injected()
// counts them.
std::shared_ptr<aio::FaultInjector> counting_faults(aio::FaultOp op) {
  auto faults = std::make_shared<aio::FaultInjector>();
  aio::FaultRule counting;
  counting.action = aio::FaultAction::kDelay;
  counting.op = op;
  counting.count = UINT64_MAX;
  counting.delay = std::chrono::microseconds(1);
  faults->add(counting);
  return faults;
}

// The in-memory store and a swapped one over an AdamW swapper in a temporary folder.
struct BothStores {
  TempDir nvme;
  std::unique_ptr<aio::Handle> handle;
  Result<std::unique_ptr<swap::OptimizerSwapper>> swapper = Status::internal("not made");
  Result<std::unique_ptr<GradStore>> memory = Status::internal("not made");
  Result<std::unique_ptr<GradStore>> swapped = Status::internal("not made");

  void make(const std::vector<swap::ParamPartition>& parts, const swap::PartitionLayout& layout,
            std::shared_ptr<aio::FaultInjector> faults = nullptr) {
    aio::AioConfig ac;
    ac.faults = std::move(faults);
    auto h = aio::Handle::create(ac);
    ASSERT_TRUE(h.is_ok()) << h.status().to_string();
    handle = std::move(h).value();
    swap::OptimizerSwapConfig sc;
    sc.store.nvme_paths = {nvme.path()};
    sc.sub_group_size = layout.sub_group_size;
    sc.swap_gradients = true;
    auto opt = optim::OptimizerConfig::parse("AdamW", {});
    ASSERT_TRUE(opt.is_ok());
    swapper = swap::OptimizerSwapper::create(sc, parts, optim::Optimizer(opt.value()), *handle);
    ASSERT_TRUE(swapper.is_ok()) << swapper.status().to_string();
    memory = make_memory_grad_store(layout);
    swapped = make_swapped_grad_store(layout, *swapper.value());
    ASSERT_TRUE(memory.is_ok() && swapped.is_ok());
  }

  // After a step's accumulations in both: the same norm bits, and the swapper's gradients (what
  // the optimizer step reads) the in-memory sums element for element (bits: -0 and +0 differ).
  void expect_same_sums(const swap::PartitionLayout& layout) {
    auto a = memory.value()->stats();
    auto b = swapped.value()->stats();
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    EXPECT_EQ(std::memcmp(&a->sq_norm, &b->sq_norm, sizeof(double)), 0) << a->sq_norm << " vs " << b->sq_norm;
    EXPECT_EQ(a->elements, b->elements);
    const std::vector<optim::GradView> views = memory.value()->step_views();
    EXPECT_TRUE(swapped.value()->step_views().empty());
    for (std::size_t sg = 0; sg < layout.subgroups.size(); ++sg) {
      const std::size_t n = layout.subgroups[sg].numel;
      auto got = aio::PinnedBuffer::allocate(n * sizeof(float));  // O_DIRECT: 4 KiB aligned
      ASSERT_TRUE(got.is_ok());
      ASSERT_TRUE(swapper.value()->read_gradient_range(sg, 0, n, static_cast<float*>(got->data())).is_ok());
      EXPECT_EQ(std::memcmp(got->data(), views[sg].data, n * sizeof(float)), 0) << "sub-group " << sg;
    }
  }
};

TEST(GradStore, SwappedAccumulatesTheSameBitsAsMemory) {
  // Partitions of odd sizes over two sub-groups; the last one never gets a gradient.
  std::vector<swap::ParamPartition> parts = {{"a", 5000}, {"b", 1}, {"c", 9000}, {"d", 30000}, {"e", 700}};
  const swap::PartitionLayout layout = swap::PartitionLayout::build(parts, 16000);
  ASSERT_GE(layout.subgroups.size(), 2u);
  BothStores stores;
  ASSERT_NO_FATAL_FAILURE(stores.make(parts, layout));
  auto& memory = stores.memory;
  auto& swapped = stores.swapped;
  for (int step = 0; step < 2; ++step) {
    for (GradStore* s : {memory.value().get(), swapped.value().get()}) {
      ASSERT_TRUE(s->begin_step().is_ok());
      for (int micro = 0; micro < 3; ++micro) {
        s->set_last_micro_batch(micro == 2);  // as the engine says it
        for (std::size_t p : {3u, 1u, 2u, 0u}) {  // backward order, roughly; "e" never
          if (step == 1 && p == 2) continue;       // a partition unused in one step reads as zero
          std::vector<float> g(layout.params[p].numel);
          for (std::size_t i = 0; i < g.size(); ++i) g[i] = value(p, i, micro + step);
          ASSERT_TRUE(s->accumulate(p, g).is_ok());
        }
      }
    }
    ASSERT_NO_FATAL_FAILURE(stores.expect_same_sums(layout)) << "step " << step;
  }
  EXPECT_LT(swapped.value()->host_bytes(), memory.value()->host_bytes() + (std::uint64_t{4} << 20));
}

// Each partition's write runs after accumulate returns: a write that fails is reported by the
// next call that needs the store (the next accumulate, or stats() before the step), naming the
// gradient tensor, and never taken as stored. The store's other writes are unaffected.
TEST(GradStore, AFailedWriteFailsTheNextCallThatNeedsTheStore) {
  std::vector<swap::ParamPartition> parts = {{"a", 5000}, {"b", 9000}, {"c", 3000}};
  const swap::PartitionLayout layout = swap::PartitionLayout::build(parts, 1u << 20);
  for (const bool in_stats : {false, true}) {
    SCOPED_TRACE(in_stats ? "the last partition's write" : "the first partition's write");
    auto faults = std::make_shared<aio::FaultInjector>();
    BothStores stores;
    ASSERT_NO_FATAL_FAILURE(stores.make(parts, layout, faults));
    GradStore& store = *stores.swapped.value();
    ASSERT_TRUE(store.begin_step().is_ok());
    aio::FaultRule rule;
    rule.op = aio::FaultOp::kWrite;
    rule.count = 1;  // the first partition's write (one chunk: the only write so far) fails, no other
    faults->add(rule);
    std::vector<float> g(layout.params[0].numel, 1.0f);
    Status st = store.accumulate(0, g);
    ASSERT_TRUE(st.is_ok()) << "the write is started, not waited for: " << st.to_string();
    if (in_stats) {
      auto stats = store.stats();
      ASSERT_FALSE(stats.is_ok());
      st = stats.status();
    } else {
      std::vector<float> h(layout.params[1].numel, 2.0f);
      st = store.accumulate(1, h);
      ASSERT_FALSE(st.is_ok());
    }
    EXPECT_NE(st.message().find("grad"), std::string::npos) << st.to_string();
    EXPECT_GT(faults->injected(), 0u);
  }
}

// The sums so far are read ahead in the order of the last accumulations (backward's, the same
// every micro-batch): with that order kept, every read is one the accumulation needs (none read
// twice, none after the step's last accumulations); with the order changed in one micro-batch,
// the wrong guesses are dropped; the sums are the in-memory store's bits either way.
TEST(GradStore, TheSumsSoFarAreReadAheadInTheLastOrder) {
  std::vector<swap::ParamPartition> parts = {{"a", 5000}, {"b", 1}, {"c", 9000}, {"d", 30000}};
  const swap::PartitionLayout layout = swap::PartitionLayout::build(parts, 16000);
  for (const bool reorder : {false, true}) {
    SCOPED_TRACE(reorder ? "micro-batch 2 in another order" : "one order");
    auto faults = counting_faults(aio::FaultOp::kRead);
    BothStores stores;
    ASSERT_NO_FATAL_FAILURE(stores.make(parts, layout, faults));
    constexpr int kMicro = 4;
    for (GradStore* s : {stores.memory.value().get(), stores.swapped.value().get()}) {
      ASSERT_TRUE(s->begin_step().is_ok());
      for (int micro = 0; micro < kMicro; ++micro) {
        s->set_last_micro_batch(micro == kMicro - 1);
        const std::vector<std::size_t> order =
            reorder && micro == 2 ? std::vector<std::size_t>{3, 2, 1, 0} : std::vector<std::size_t>{3, 1, 2, 0};
        for (std::size_t p : order) {
          std::vector<float> g(layout.params[p].numel);
          for (std::size_t i = 0; i < g.size(); ++i) g[i] = value(p, i, micro);
          ASSERT_TRUE(s->accumulate(p, g).is_ok());
        }
      }
    }
    // Each partition is at most 30000 elements (one aio chunk): one read each micro-batch after
    // the first, 12 in all. The changed order costs 5 more: guesses dropped in micro-batch 2, and
    // in micro-batch 3, whose guesses follow micro-batch 2's order.
    EXPECT_EQ(faults->injected(), reorder ? 17u : 12u);
    ASSERT_NO_FATAL_FAILURE(stores.expect_same_sums(layout));
  }
}

// A read ahead that fails fails the accumulation that needed it, naming the gradients, and
// nothing before it.
TEST(GradStore, AFailedReadAheadFailsTheAccumulationThatNeedsIt) {
  std::vector<swap::ParamPartition> parts = {{"a", 5000}, {"b", 9000}, {"c", 3000}};
  const swap::PartitionLayout layout = swap::PartitionLayout::build(parts, 1u << 20);
  auto faults = std::make_shared<aio::FaultInjector>();
  BothStores stores;
  ASSERT_NO_FATAL_FAILURE(stores.make(parts, layout, faults));
  GradStore& store = *stores.swapped.value();
  ASSERT_TRUE(store.begin_step().is_ok());
  auto pass = [&](int micro) -> Status {
    store.set_last_micro_batch(micro == 1);
    for (std::size_t p : {2u, 1u, 0u}) {
      std::vector<float> g(layout.params[p].numel, 1.0f);
      Status st = store.accumulate(p, g);
      if (!st.is_ok()) return st.with_context(fmt::format("partition {}", p));
    }
    return Status::ok();
  };
  ASSERT_TRUE(pass(0).is_ok());
  // Micro-batch 1 reads c's sum now, then b's ahead (while c's write runs): b's read fails.
  aio::FaultRule rule;
  rule.op = aio::FaultOp::kRead;
  rule.skip = 1;
  faults->add(rule);
  const Status st = pass(1);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("partition 1"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("grad"), std::string::npos) << st.to_string();
  EXPECT_EQ(faults->injected(), 1u);
}

// The norm takes each block's sum when a partition is accumulated (the sums are then in memory)
// and reads back only the block that two partitions share: 8192 elements of the 47104 here,
// with the in-memory store's bits.
TEST(GradStore, TheNormReadsBackOnlyTheBlocksThatPartitionsShare) {
  // Offsets 0, 24576, 30720; 47104 in all (kAlign 2048): norm blocks of 8192 are 0-2 in "a",
  // 3 across "b" and "c", 4 and the short 5 in "c".
  std::vector<swap::ParamPartition> parts = {{"a", 3 * 8192}, {"b", 5000}, {"c", 2 * 8192}};
  const swap::PartitionLayout layout = swap::PartitionLayout::build(parts, 1 << 20);
  ASSERT_EQ(layout.subgroups.size(), 1u);
  ASSERT_EQ(layout.subgroups[0].numel, 47104u);
  BothStores stores;
  ASSERT_NO_FATAL_FAILURE(stores.make(parts, layout));
  auto& memory = stores.memory;
  auto& swapped = stores.swapped;
  for (GradStore* s : {memory.value().get(), swapped.value().get()}) {
    ASSERT_TRUE(s->begin_step().is_ok());
    for (int micro = 0; micro < 2; ++micro) {
      s->set_last_micro_batch(micro == 1);
      for (std::size_t p : {2u, 1u, 0u}) {
        std::vector<float> g(layout.params[p].numel);
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = 1e3f * value(p, i, micro);
        ASSERT_TRUE(s->accumulate(p, g).is_ok());
      }
    }
  }
  const std::uint64_t before = swapped.value()->bytes_moved();
  auto a = memory.value()->stats();
  auto b = swapped.value()->stats();
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(std::memcmp(&a->sq_norm, &b->sq_norm, sizeof(double)), 0) << a->sq_norm << " vs " << b->sq_norm;
  EXPECT_EQ(a->elements, b->elements);
  EXPECT_EQ(swapped.value()->bytes_moved() - before, 8192u * sizeof(float));
  EXPECT_EQ(swapped_norm_read_elements(layout), 8192u);  // what zinf plan counts
}

// The in-memory store does not clear itself at begin_step (a partition's first accumulation writes
// 0 + g): after end_accumulation(), without stats(), the views the optimizer steps (the early
// stepper reads them so) hold this step's sums, zero for a partition no micro-batch reached
// though the last step filled it, +0 where a first gradient was -0, and zero padding.
TEST(GradStore, MemoryViewsAfterEndAccumulationAreThisStepsSums) {
  std::vector<swap::ParamPartition> parts = {{"a", 3000}, {"b", 17}, {"c", 5000}};
  const swap::PartitionLayout layout = swap::PartitionLayout::build(parts, 1 << 20);
  ASSERT_EQ(layout.subgroups.size(), 1u);
  auto store = make_memory_grad_store(layout);
  ASSERT_TRUE(store.is_ok());
  GradStore& s = *store.value();
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(s.begin_step().is_ok());
    const int micro_batches = step == 2 ? 1 : 2;
    for (int micro = 0; micro < micro_batches; ++micro) {
      for (std::size_t p : {2u, 1u, 0u}) {
        if (step == 1 && p == 1) continue;  // "b" is not reached in step 1
        std::vector<float> g(layout.params[p].numel);
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = value(p, i, micro + 3 * step);
        ASSERT_TRUE(s.accumulate(p, g).is_ok());
      }
    }
    ASSERT_TRUE(s.end_accumulation().is_ok());
    const std::vector<optim::GradView> views = s.step_views();
    ASSERT_EQ(views.size(), 1u);
    const auto* got = static_cast<const float*>(views[0].data);
    std::vector<float> want(layout.subgroups[0].numel, 0.0f);
    for (std::size_t p = 0; p < parts.size(); ++p) {
      if (step == 1 && p == 1) continue;
      for (std::size_t i = 0; i < layout.params[p].numel; ++i) {
        float sum = 0.0f;
        for (int micro = 0; micro < micro_batches; ++micro) sum += value(p, i, micro + 3 * step);
        want[layout.offset_in_subgroup[p] + i] = sum;
      }
    }
    EXPECT_EQ(std::memcmp(got, want.data(), want.size() * sizeof(float)), 0) << "step " << step;
  }
}

// The smallest partitions (a layer norm's) keep their sums in memory: their accumulations start
// no transfer, so none waits for the large partition's write before it, and end_accumulation()
// writes them once, after which the store holds the in-memory store's bits (a held partition no
// micro-batch reached reads as zero); a failed write of one fails end_accumulation, naming the
// gradients.
TEST(GradStore, SmallPartitionsStayInMemoryUntilTheEndOfTheStep) {
  // "big" pads to 40960 elements: partitions of at most 2560 padded are held, up to 20480 in all.
  // "ln1" and "ln2" (2048 padded each) are held; "mid" (6144 padded) is not.
  std::vector<swap::ParamPartition> parts = {
      {"big", 40000}, {"ln1", 700}, {"mid", 5000}, {"ln2", 2048}, {"never", 10}};
  const swap::PartitionLayout layout = swap::PartitionLayout::build(parts, 1u << 20);
  EXPECT_EQ(swapped_gradient_held_bytes(layout), 3u * 2048u * sizeof(float));  // ln1, ln2, never
  for (const bool fail : {false, true}) {
    SCOPED_TRACE(fail ? "a held partition's write fails" : "every write lands");
    auto faults = counting_faults(aio::FaultOp::kWrite);
    BothStores stores;
    ASSERT_NO_FATAL_FAILURE(stores.make(parts, layout, faults));
    GradStore& swapped = *stores.swapped.value();
    EXPECT_GE(swapped.host_bytes(), swapped_gradient_buffer_bytes(layout) + swapped_gradient_held_bytes(layout));
    constexpr int kMicro = 3;
    constexpr std::uint64_t kLarge = 40960 + 6144;  // big's and mid's padded elements
    for (int step = 0; step < 2; ++step) {
      const std::uint64_t writes_before = faults->injected();
      const std::uint64_t bytes_before = swapped.bytes_moved();
      for (GradStore* s : {stores.memory.value().get(), &swapped}) {
        ASSERT_TRUE(s->begin_step().is_ok());
        for (int micro = 0; micro < kMicro; ++micro) {
          s->set_last_micro_batch(micro == kMicro - 1);
          for (std::size_t p : {3u, 2u, 1u, 0u}) {
            if (step == 1 && p == 1) continue;  // ln1 unused in the second step: zero there
            std::vector<float> g(layout.params[p].numel);
            for (std::size_t i = 0; i < g.size(); ++i) g[i] = value(p, i, micro + step);
            ASSERT_TRUE(s->accumulate(p, g).is_ok());
          }
        }
      }
      // Only the large partitions moved: written every micro-batch, read back after the first.
      EXPECT_EQ(swapped.bytes_moved() - bytes_before, (2 * kMicro - 1) * kLarge * sizeof(float));
      if (fail && step == 1) {
        aio::FaultRule rule;
        rule.op = aio::FaultOp::kWrite;
        rule.skip = 1;  // the second held partition's
        rule.count = 1;
        faults->add(rule);
        const Status st = swapped.end_accumulation();
        ASSERT_FALSE(st.is_ok());
        EXPECT_NE(st.message().find("grad"), std::string::npos) << st.to_string();
        break;
      }
      ASSERT_TRUE(swapped.end_accumulation().is_ok());
      // The large partitions' writes, then ln1, ln2 and "never" (zeroed) once each; a second
      // call writes nothing.
      EXPECT_EQ(faults->injected() - writes_before, 2u * kMicro + 3u);
      EXPECT_EQ(swapped.bytes_moved() - bytes_before, ((2 * kMicro - 1) * kLarge + 3 * 2048) * sizeof(float));
      ASSERT_TRUE(swapped.end_accumulation().is_ok());
      EXPECT_EQ(faults->injected() - writes_before, 2u * kMicro + 3u);
      ASSERT_NO_FATAL_FAILURE(stores.expect_same_sums(layout)) << "step " << step;
    }
  }
}

// A partition large enough to be added by the thread pool in chunks (add_into): every element the
// sum of its micro-batches in order, bit for bit, including the last partial chunk.
TEST(GradStore, ALargePartitionAddsTheSameBitsAsOneLoop) {
  const std::size_t n = (std::size_t{1} << 20) + 12345;  // above the split threshold, ragged end
  const swap::PartitionLayout layout = swap::PartitionLayout::build({{"big", n}, {"small", 3}}, 1 << 22);
  auto memory = make_memory_grad_store(layout);
  ASSERT_TRUE(memory.is_ok());
  ASSERT_TRUE(memory.value()->begin_step().is_ok());
  std::vector<float> want(n, 0.0f);
  for (int micro = 0; micro < 3; ++micro) {
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = value(0, i, micro);
    for (std::size_t i = 0; i < n; ++i) want[i] += g[i];
    ASSERT_TRUE(memory.value()->accumulate(0, g).is_ok());
  }
  const std::vector<optim::GradView> views = memory.value()->step_views();
  const float* got = static_cast<const float*>(views[layout.subgroup_of[0]].data) + layout.offset_in_subgroup[0];
  EXPECT_EQ(std::memcmp(got, want.data(), n * sizeof(float)), 0);
}

}  // namespace
}  // namespace zinf::zero3
