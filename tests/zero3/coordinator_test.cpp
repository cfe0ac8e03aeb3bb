// The parameter coordinator on its own, with a model of many small modules and a parameter tier
// that records every read and prefetch: prefetching along the recorded trace, eviction by next
// use under stage3_max_live_parameters, and what stage3_max_reuse_distance keeps. These are the
// properties no bit-identity test can see (a coordinator that stopped prefetching, or evicted
// the wrong copy, would still compute the same numbers).
#include "zero3/coordinator.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "chain_model.h"
#include "zero3/engine_impl.h"

namespace zinf::zero3 {
namespace {

using testing::ChainModel;
using testing::kSize;
using testing::RecordingTier;

// Host memory that counts what it has handed out: the coordinator's gather memory, as a device
// target would hold it, must stay within the live budget and all come back.
class CountingTarget final : public GatherTarget {
 public:
  ~CountingTarget() override { EXPECT_EQ(outstanding, 0u) << "gather blocks outlived the coordinator"; }
  std::string_view name() const override { return "counting"; }
  GatherBlock allocate(std::size_t n) override {
    if (n == 0) return {};
    outstanding += n;
    high_water = std::max(high_water, outstanding);
    ++allocations;
    return adopt(static_cast<float*>(std::malloc(n * sizeof(float))), n);
  }
  Status gather(ParamTier& tier, std::size_t group, std::size_t per_rank, Communicator& comm,
                GatherBlock& block) override {
    const std::span<float> mine = block.span().subspan(per_rank * static_cast<std::size_t>(comm.rank()), per_rank);
    ZINF_RETURN_IF_ERROR(tier.read_f32(group, mine));
    return comm.all_gather(mine, block.span());
  }
  Status zero(GatherBlock& block) override {
    std::fill(block.span().begin(), block.span().end(), 0.0f);
    return Status::ok();
  }
  std::uint64_t outstanding = 0;  // elements handed out and not yet freed
  std::uint64_t high_water = 0;
  int allocations = 0;

 protected:
  void free(float* data, std::size_t n) override {
    outstanding -= n;
    std::free(data);
  }
};

struct Harness {
  ChainModel model;
  PartitionPlan plan;
  swap::PartitionLayout layout;
  std::unique_ptr<Communicator> comm = make_local_communicator();
  std::unique_ptr<GradStore> grads;
  std::unique_ptr<RecordingTier> tier;
  std::unique_ptr<CountingTarget> target = std::make_unique<CountingTarget>();
  std::unique_ptr<Coordinator> coordinator;

  Harness(int n, const CoordinatorOptions& options, std::vector<std::size_t> sizes = {kSize})
      : model(n, nullptr, false, std::move(sizes)), plan(model_partition_plan(model.params(), model.modules().size(), 1).value()) {
    layout = swap::PartitionLayout::build(layout_partitions(model.params(), model.modules(), plan), 1 << 20);
    grads = std::move(make_memory_grad_store(layout)).value();
    tier = std::make_unique<RecordingTier>(plan.num_groups());
    coordinator = std::make_unique<Coordinator>(model, plan, layout, *tier, *target, *comm, options, *grads);
  }
  // One training pass; the tier's log then holds this pass's reads and prefetches.
  void pass() {
    tier->new_pass();
    const std::vector<int32_t> tokens = {0};
    coordinator->begin_pass(true);
    auto loss = model.forward_backward(tokens, tokens, 1, 1, *coordinator, 1.0f);
    ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
    ASSERT_TRUE(coordinator->end_pass().is_ok());
  }
};

CoordinatorOptions options() {
  CoordinatorOptions o;
  o.param_persistence_threshold = 0;  // nothing stays gathered for free
  o.prefetch_bucket_size = 2 * kSize + 50;
  o.max_live_parameters = 1000000000;
  o.max_reuse_distance = 0;
  o.reduce_bucket_size = 1;
  return o;
}

TEST(CoordinatorTest, PrefetchesAlongTheRecordedTraceFromTheSecondPass) {
  Harness h(10, options());
  h.pass();  // records the trace: nothing to prefetch from yet, nothing known to keep
  EXPECT_EQ(h.tier->prefetches, 0);
  EXPECT_EQ(h.tier->unprefetched_reads, static_cast<int>(h.tier->reads.size()));
  // From the trace on: embed, m1..m10, head (p0 kept for head's backward), m10..m1, embed.
  for (int pass = 2; pass <= 3; ++pass) {
    h.pass();
    EXPECT_EQ(h.tier->reads.size(), 23u) << "pass " << pass;
    // Every read but the pass's first was announced by a prefetch.
    EXPECT_EQ(h.tier->unprefetched_reads, 1) << "pass " << pass;
    EXPECT_EQ(h.tier->prefetches, 22) << "pass " << pass;
  }
  EXPECT_EQ(h.coordinator->stats().trace_invalidations, 0u);
}

TEST(CoordinatorTest, PrefetchIsBoundedByTheBucketAndTheLiveBudget) {
  CoordinatorOptions o = options();
  o.prefetch_bucket_size = kSize - 1;  // not one partition fits: no prefetch at all
  Harness h(10, o);
  h.pass();
  h.pass();
  EXPECT_EQ(h.tier->prefetches, 0);
  EXPECT_EQ(h.tier->unprefetched_reads, static_cast<int>(h.tier->reads.size()));
}

TEST(CoordinatorTest, TheLiveBudgetHoldsAndEvictsTheCopyUsedLast) {
  CoordinatorOptions o = options();
  o.max_live_parameters = 3 * kSize + 50;  // three gathered parameters at a time
  o.max_reuse_distance = 1000000000;       // keep every released copy the budget allows
  Harness h(10, o);
  for (int pass = 1; pass <= 3; ++pass) {
    h.pass();
    EXPECT_LE(h.coordinator->stats().live_high_water, o.max_live_parameters) << "pass " << pass;
    // The recording pass keeps nothing (no trace to say what comes back); later passes keep
    // what the budget allows and evict to make room.
    if (pass > 1) {
      EXPECT_GT(h.coordinator->stats().evictions, 0u);
    }
  }
  // p0 is used by embed and again by head at the end of forward. A least-recently-used policy
  // would evict it first; eviction by next use keeps it (the middle parameters are next used
  // only in backward, farther away), so forward reads p0 once and head reuses it.
  const std::vector<std::size_t>& reads = h.tier->reads;
  ASSERT_GE(reads.size(), 12u);
  for (std::size_t p = 0; p <= 10; ++p) EXPECT_EQ(reads[p], p) << "forward reads p0..p10 once each";
  // Backward: head (p0, kept), m10 and m9 (the newest, kept) need no read; p8 is the first.
  EXPECT_EQ(reads[11], 8u) << "reads[11] == 0 means the tied copy was evicted (least recently used)";
  // The copies backward is done with are evicted before p0, which embed's backward still needs.
  EXPECT_EQ(std::count(reads.begin(), reads.end(), std::size_t{0}), 1);
}

// 0 is what some real configs write (axolotl's zero3_bf16_cpuoffload_all.json); the reference
// reads it as "no prefetch". zinf then holds only the modules in use: every acquire reads (no
// prefetch; a released copy stays only while nothing else needs room, so only head's p0,
// used again by the very next acquire, is reused), and the pass completes.
TEST(CoordinatorTest, MaxLiveZeroHoldsOnlyTheModulesInUse) {
  CoordinatorOptions o = options();
  o.max_live_parameters = 0;
  o.max_reuse_distance = 1000000000;
  Harness h(10, o);
  h.pass();
  h.pass();
  EXPECT_EQ(h.tier->prefetches, 0);
  EXPECT_EQ(h.tier->reads.size(), 23u);  // 24 acquires; head's backward reuses forward's p0
  EXPECT_EQ(h.coordinator->stats().live_high_water, kSize);
}

// Gathered blocks in use, kept for reuse and spare together never exceed the live budget (a
// device target's memory is that budget, and the gradients'), and every block goes back to the
// target.
TEST(CoordinatorTest, GatherMemoryStaysWithinTheLiveBudgetAndComesBack) {
  CoordinatorOptions o = options();
  o.max_live_parameters = 3 * kSize + 50;
  o.max_reuse_distance = 1000000000;
  Harness h(10, o);
  for (int pass = 1; pass <= 3; ++pass) h.pass();
  // The target also holds the gradients (at most grad_high_water elements at once).
  EXPECT_LE(h.target->high_water, o.max_live_parameters + h.coordinator->stats().grad_high_water);
  EXPECT_GE(h.target->high_water, 3 * kSize) << "the budget was never used: the test would prove nothing";
  EXPECT_GT(h.target->outstanding, 0u) << "nothing kept between passes";
  h.coordinator.reset();
  EXPECT_EQ(h.target->outstanding, 0u);
}

// Under a budget that holds everything, a pass on the recorded trace gathers into the blocks
// the pass before freed: no new memory from the target.
TEST(CoordinatorTest, FreedGatherBlocksAreReused) {
  CoordinatorOptions o = options();
  o.reduce_bucket_size = 1000000;  // gradient buffers (also the target's) are kept too
  Harness h(10, o);
  h.pass();
  h.pass();
  const int allocations = h.target->allocations;
  h.pass();
  EXPECT_EQ(h.target->allocations, allocations);
  EXPECT_GT(h.coordinator->stats().gathers, 0u);
}

// zinf plan's lean configuration: modules of two sizes alternate (a transformer's attention and
// MLP), stage3_max_live_parameters holds two of the largest and reduce_bucket_size one. Once the
// trace is recorded, passes gather into, and take gradients in, the blocks earlier passes freed.
// Before, the spares were trimmed to make room before the gather looked for one of its size, and
// the gradients' spares were bounded by the bucket alone: each pass then took every gathered and
// gradient block from the target afresh (new pages: 2.3 M page faults a step on a 1.2B model).
TEST(CoordinatorTest, AlternatingSizesUnderALeanBudgetReuseTheirBlocks) {
  CoordinatorOptions o = options();
  o.max_live_parameters = 2 * 2 * kSize;
  o.reduce_bucket_size = 2 * kSize;
  Harness h(10, o, {2 * kSize, kSize});
  h.pass();
  h.pass();
  const int allocations = h.target->allocations;
  h.pass();
  h.pass();
  EXPECT_EQ(h.target->allocations, allocations);
  EXPECT_GT(h.coordinator->stats().gathers, 40u) << "every acquire gathered: nothing was kept across passes";
  EXPECT_LE(h.coordinator->stats().live_high_water, o.max_live_parameters);
  // host_budget's gradient bound: the bucket plus the largest group.
  EXPECT_LE(h.coordinator->stats().grad_high_water, o.reduce_bucket_size + 2 * kSize);
}

// Copies kept under a budget far smaller than the model: the forward's evictions take the copy
// used farthest ahead, which here is of another size than the gather needs every other time
// (sizes cycle 2, 1, 1), so its block was freed and the gather's allocated (16 new blocks in two
// passes). A copy whose next use lies beyond a whole budget of traffic cannot be reused before it
// goes anyway: among those, one of the needed size goes first, and its block is the gather's.
// What is left is the budget's mix of sizes changing within a pass (one block of each size
// freed where the budget is full and allocated again where it is not): two a pass.
TEST(CoordinatorTest, EvictionsUnderALeanBudgetHandTheGatherABlockOfItsSize) {
  CoordinatorOptions o = options();
  o.max_live_parameters = 4 * kSize;
  o.reduce_bucket_size = 2 * kSize;
  o.max_reuse_distance = 1000000000;  // keep every released copy the budget allows
  Harness h(12, o, {2 * kSize, kSize, kSize});
  h.pass();
  h.pass();
  const int allocations = h.target->allocations;
  const std::uint64_t evictions = h.coordinator->stats().evictions;
  h.pass();
  h.pass();
  EXPECT_GT(h.coordinator->stats().evictions, evictions) << "nothing was evicted: the test would prove nothing";
  EXPECT_LE(h.target->allocations - allocations, 4);
  EXPECT_LE(h.coordinator->stats().live_high_water, o.max_live_parameters);
}

TEST(CoordinatorTest, MaxReuseDistanceDecidesWhatAReleasedCopyKeeps) {
  // After embed releases p0, head uses it again after m1..m10: 10 x 100 elements of traffic.
  for (std::uint64_t distance : {0ull, 999ull, 1000ull, 1000000000ull}) {
    CoordinatorOptions o = options();
    o.max_reuse_distance = distance;
    o.prefetch_bucket_size = 0;
    Harness h(10, o);
    h.pass();
    h.pass();
    int p0_reads_in_forward = 0;
    for (std::size_t i = 0; i < h.tier->reads.size() && i < 12; ++i) p0_reads_in_forward += h.tier->reads[i] == 0;
    const int expected = distance >= 1000 ? 1 : 2;
    EXPECT_EQ(p0_reads_in_forward, expected) << "max_reuse_distance " << distance;
    // Kept copies are counted as reuse; with no reuse at all every acquire reads.
    if (distance == 0) {
      EXPECT_EQ(h.tier->reads.size(), 2u * 12u - 1u) << "only head -> backward head reuses at distance 0";
    }
  }
}

// Between the micro-batches of a step the values do not change. Told that the next pass reuses
// them, the coordinator measures a copy with no further use in this pass to its first use in the
// next one; with room in the live budget the step's later passes then read nothing, and the
// step's last pass frees what it holds at its end, as every pass does without the hint.
TEST(CoordinatorTest, TheNextPassOfAStepReusesCopiesWithinTheReuseDistance) {
  CoordinatorOptions o = options();
  o.max_reuse_distance = 1000000000;
  o.prefetch_bucket_size = 0;
  Harness h(10, o);
  h.pass();  // records the trace
  h.pass();
  EXPECT_EQ(h.tier->reads.size(), 11u) << "without the hint every pass reads p0..p10";
  h.coordinator->set_next_pass_reuses_values(true);
  h.pass();
  EXPECT_EQ(h.tier->reads.size(), 11u);
  h.pass();
  EXPECT_EQ(h.tier->reads.size(), 0u) << "the step's second micro-batch gathered again";
  h.coordinator->set_next_pass_reuses_values(false);  // the step's last micro-batch
  h.pass();
  EXPECT_EQ(h.tier->reads.size(), 0u);
  h.pass();
  EXPECT_EQ(h.tier->reads.size(), 11u) << "the last pass kept its copies past its end";

  // The distance counts the rest of this pass and the next pass's traffic up to the first use.
  // m_k's backward is followed by m_{k-1} .. m1 and embed (k acquires of 100 elements), and its
  // p_k is first used after embed .. m_{k-1} (k more): 200 k. At 1000, p1..p5 (and p0, used last
  // and first by embed) are kept past the pass, p6..p10 freed, so the next forward reads
  // p6..p10. Within the pass nothing changes: from m_k's forward to its backward come
  // m_{k+1} .. m10, head, head's backward and m10 .. m_{k+1}, 2 (10 - k) + 2 acquires, within
  // 1000 for k >= 6 only, so backward reads p5 .. p1 again.
  o.max_reuse_distance = 1000;
  Harness d(10, o);
  d.pass();
  d.coordinator->set_next_pass_reuses_values(true);
  d.pass();
  d.pass();
  EXPECT_EQ(d.tier->reads, (std::vector<std::size_t>{6, 7, 8, 9, 10, 5, 4, 3, 2, 1}));
}

TEST(CoordinatorTest, LeavingTheTraceStopsPrefetchingAndRecordsAgain) {
  Harness h(6, options());
  h.pass();
  h.pass();
  EXPECT_GT(h.tier->prefetches, 0);
  // A pass that acquires in another order (an eval pass of the train trace would not: it has
  // its own trace) invalidates the train trace; the next pass records, the one after prefetches.
  h.tier->new_pass();
  h.coordinator->begin_pass(true);
  std::vector<const float*> v(1);
  ASSERT_TRUE(h.coordinator->acquire(3, model::Phase::kForward, v).is_ok());
  ASSERT_TRUE(h.coordinator->release(3, model::Phase::kForward).is_ok());
  EXPECT_EQ(h.coordinator->stats().trace_invalidations, 1u);
  ASSERT_TRUE(h.coordinator->end_pass().is_ok());
  h.pass();
  EXPECT_EQ(h.tier->prefetches, 0);
  h.pass();
  EXPECT_GT(h.tier->prefetches, 0);
}

}  // namespace
}  // namespace zinf::zero3

namespace zinf::zero3 {
namespace {

// Gradient buffers freed by a reduce are kept for the next ones (no fresh pages each pass), but
// kept and in-use ones together stay within reduce_bucket_size plus the largest group (what
// host_budget counts). One rank reduces each module's gradients as soon as they are complete, so
// p0 (waiting for embed) and one module's are in use.
TEST(CoordinatorTest, GradientBuffersAreReusedWithinTheBucket) {
  CoordinatorOptions big = options();
  big.reduce_bucket_size = 1000000;
  Harness h(10, big);
  h.pass();
  EXPECT_EQ(h.coordinator->stats().grad_allocations, 2u);  // p0, and one that m10..m1 pass along
  h.pass();
  h.pass();
  EXPECT_EQ(h.coordinator->stats().grad_allocations, 2u) << "later passes reuse the first pass's buffers";
  EXPECT_EQ(h.coordinator->stats().grad_high_water, 2 * kSize) << "keeping must not hold more than was in use";

  // reduce_bucket_size 1: the bound is one group and a bit. While p0's gradient waits for embed
  // nothing more is kept (11 allocations a pass); after it the one freed last is, and the next
  // pass's first gradient takes it.
  Harness one(10, options());
  one.pass();
  one.pass();
  EXPECT_EQ(one.coordinator->stats().grad_allocations, 21u);
  EXPECT_EQ(one.coordinator->stats().grad_high_water, 2 * kSize);
}

}  // namespace
}  // namespace zinf::zero3
