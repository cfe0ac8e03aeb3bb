// Tests for the ZeRO-3 partition math, for world sizes above 1 as well.
#include "zinf/zero3/partition.h"

#include <numeric>
#include <vector>

#include <gtest/gtest.h>

namespace zinf::zero3 {
namespace {

TEST(PartitionTest, CeilSlicesBackToBack) {
  const std::vector<std::size_t> numels = {10, 3, 0, 7};
  auto plan = PartitionPlan::create(numels, 3);
  ASSERT_TRUE(plan.is_ok());
  // ceil(10/3)=4, ceil(3/3)=1, 0, ceil(7/3)=3
  EXPECT_EQ(plan->slot(0).per_rank, 4u);
  EXPECT_EQ(plan->slot(1).per_rank, 1u);
  EXPECT_EQ(plan->slot(2).per_rank, 0u);
  EXPECT_EQ(plan->slot(3).per_rank, 3u);
  EXPECT_EQ(plan->slot(3).shard_offset, 5u);
  EXPECT_EQ(plan->shard_numel(), 8u);
  // Rank 2 of the 10-element parameter holds [8, 10) and two padding elements.
  EXPECT_EQ(plan->owned(0, 2).begin, 8u);
  EXPECT_EQ(plan->owned(0, 2).end, 10u);
  // Rank 2 of the 7-element parameter holds [6, 7).
  EXPECT_EQ(plan->owned(3, 2).size(), 1u);
}

TEST(PartitionTest, TinyParameterLeavesLaterRanksEmpty) {
  const std::vector<std::size_t> numels = {2};
  auto plan = PartitionPlan::create(numels, 4);
  ASSERT_TRUE(plan.is_ok());
  EXPECT_EQ(plan->owned(0, 0).size(), 1u);
  EXPECT_EQ(plan->owned(0, 1).size(), 1u);
  EXPECT_EQ(plan->owned(0, 2).size(), 0u);
  EXPECT_EQ(plan->owned(0, 3).size(), 0u);
}

TEST(PartitionTest, ScatterGatherRoundTripsForManyWorldSizes) {
  const std::vector<std::size_t> numels = {1, 17, 64, 5, 1000, 3};
  for (int w = 1; w <= 9; ++w) {
    auto plan = PartitionPlan::create(numels, w);
    ASSERT_TRUE(plan.is_ok());
    std::vector<std::vector<float>> shards(w, std::vector<float>(plan->shard_numel(), -1.0f));
    std::vector<std::vector<float>> full(numels.size());
    for (std::size_t p = 0; p < numels.size(); ++p) {
      full[p].resize(numels[p]);
      std::iota(full[p].begin(), full[p].end(), static_cast<float>(p * 10000));
      for (int r = 0; r < w; ++r) plan->scatter(p, full[p], r, shards[r]);
    }
    std::size_t owned_total = 0;
    for (std::size_t p = 0; p < numels.size(); ++p) {
      for (int r = 0; r < w; ++r) owned_total += plan->owned(p, r).size();
      std::vector<std::span<const float>> views(shards.begin(), shards.end());
      std::vector<float> back(numels[p], 0.0f);
      plan->gather(p, views, back);
      EXPECT_EQ(back, full[p]) << "world size " << w << " param " << p;
    }
    EXPECT_EQ(owned_total, std::accumulate(numels.begin(), numels.end(), std::size_t{0}));
    // Padding is zero, never stale data.
    for (int r = 0; r < w; ++r) {
      for (std::size_t p = 0; p < numels.size(); ++p) {
        const ParamSlot& s = plan->slot(p);
        for (std::size_t i = plan->owned(p, r).size(); i < s.per_rank; ++i) {
          EXPECT_EQ(shards[r][s.shard_offset + i], 0.0f);
        }
      }
    }
  }
}

TEST(PartitionTest, RejectsBadWorldSize) {
  const std::vector<std::size_t> numels = {4};
  EXPECT_FALSE(PartitionPlan::create(numels, 0).is_ok());
}

}  // namespace
}  // namespace zinf::zero3
