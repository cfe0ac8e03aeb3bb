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
  EXPECT_EQ(plan->group(0).per_rank, 4u);
  EXPECT_EQ(plan->group(1).per_rank, 1u);
  EXPECT_EQ(plan->group(2).per_rank, 0u);
  EXPECT_EQ(plan->group(3).per_rank, 3u);
  EXPECT_EQ(plan->group(3).shard_offset, 5u);
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
        const GroupSlot& s = plan->group(p);
        for (std::size_t i = plan->owned(p, r).size(); i < s.per_rank; ++i) {
          EXPECT_EQ(shards[r][s.shard_offset + i], 0.0f);
        }
      }
    }
  }
}

// Grouped parameters: each group is split as one flat array, so the W slices gathered in rank
// order are the group's parameters back to back, and each rank holds one contiguous piece of
// each parameter.
TEST(PartitionTest, GroupsSplitAsOneFlatArray) {
  const std::vector<std::size_t> numels = {5, 3, 4, 0, 9};
  const std::vector<std::size_t> group_of = {0, 0, 1, 1, 2};
  for (int w = 1; w <= 7; ++w) {
    auto plan = PartitionPlan::create(numels, group_of, w);
    ASSERT_TRUE(plan.is_ok());
    ASSERT_EQ(plan->num_groups(), 3u);
    EXPECT_EQ(plan->group(0).numel, 8u);
    EXPECT_EQ(plan->group(0).per_rank, (8u + w - 1) / w);
    EXPECT_EQ(plan->place(1).offset, 5u);
    EXPECT_EQ(plan->place(4).group, 2u);
    std::vector<std::vector<float>> shards(w, std::vector<float>(plan->shard_numel(), -1.0f));
    std::vector<std::vector<float>> full(plan->num_groups());
    for (std::size_t g = 0; g < plan->num_groups(); ++g) {
      full[g].resize(plan->group(g).numel);
      std::iota(full[g].begin(), full[g].end(), static_cast<float>(g * 1000));
      for (int r = 0; r < w; ++r) plan->scatter(g, full[g], r, shards[r]);
    }
    for (std::size_t p = 0; p < numels.size(); ++p) {
      const ParamPlace& pl = plan->place(p);
      const GroupSlot& g = plan->group(pl.group);
      // The all-gathered buffer: every rank's slice back to back.
      std::vector<float> gathered;
      for (int r = 0; r < w; ++r) {
        gathered.insert(gathered.end(), shards[r].begin() + g.shard_offset,
                        shards[r].begin() + g.shard_offset + g.per_rank);
      }
      std::size_t covered = 0;
      for (std::size_t e = 0; e < numels[p]; ++e) EXPECT_EQ(gathered[pl.offset + e], full[pl.group][pl.offset + e]);
      for (int r = 0; r < w; ++r) {
        const ElementRange own = plan->owned(p, r);
        covered += own.size();
        for (std::size_t e = own.begin; e < own.end; ++e) {
          // Element e of p lies in rank r's slice at slice_offset + (e - own.begin).
          EXPECT_EQ(shards[r][g.shard_offset + plan->slice_offset(p, r) + (e - own.begin)],
                    full[pl.group][pl.offset + e]);
        }
      }
      EXPECT_EQ(covered, numels[p]) << "w " << w << " p " << p;
    }
  }
}

TEST(PartitionTest, RejectsBadWorldSizeAndGroups) {
  const std::vector<std::size_t> numels = {4, 2};
  EXPECT_FALSE(PartitionPlan::create(numels, 0).is_ok());
  const std::vector<std::size_t> gap = {0, 2};  // group 1 is empty
  EXPECT_FALSE(PartitionPlan::create(numels, gap, 2).is_ok());
  const std::vector<std::size_t> short_list = {0};
  EXPECT_FALSE(PartitionPlan::create(numels, short_list, 2).is_ok());
}

}  // namespace
}  // namespace zinf::zero3
