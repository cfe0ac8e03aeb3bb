// Tests for the memory estimator against the reference's formulas and its published table.
#include "zinf/zero3/estimate.h"

#include <gtest/gtest.h>

namespace zinf::zero3 {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

TEST(EstimateTest, MatchesReferenceRowsForOneGpu) {
  // The reference's documented example: 2851M params, 32M largest layer, 1 node x 1 GPU.
  EstimateInput in{2851000000, 32000000, 1, 1, 1.5};
  auto rows = estimate_model_states(in);
  ASSERT_GE(rows.size(), 6u);
  // offload_param=cpu, offload_optimizer=cpu, zero_init=1: 18*N*1.5 on CPU, 4L on GPU.
  EXPECT_EQ(rows[0].offload_param, "cpu");
  EXPECT_NEAR(rows[0].cpu_bytes / kGiB, 71.69, 0.05);
  EXPECT_NEAR(rows[0].gpu_bytes / kGiB, 0.12, 0.005);
  // zero_init=0: max(4G, 18/M) = 18 for one GPU, the same here.
  EXPECT_NEAR(rows[1].cpu_bytes / kGiB, 71.69, 0.05);
  // offload_optimizer only: GPU 4L + 2N/T = 0.12 + 5.31; CPU 16*N*1.5.
  EXPECT_NEAR(rows[2].gpu_bytes / kGiB, 5.43, 0.01);
  EXPECT_NEAR(rows[2].cpu_bytes / kGiB, 63.72, 0.05);
  // No offload: GPU 4L + 18N/T; CPU L*4*G*1.5 with zero_init, N*4*G*1.5 without.
  EXPECT_NEAR(rows[4].gpu_bytes / kGiB, 47.91, 0.01);
  EXPECT_NEAR(rows[4].cpu_bytes / kGiB, 0.18, 0.01);
  EXPECT_NEAR(rows[5].cpu_bytes / kGiB, 15.93, 0.01);
}

TEST(EstimateTest, ZeroInitOffMattersWithManyGpusPerNode) {
  EstimateInput in{1000000000, 10000000, 8, 2, 1.5};
  auto rows = estimate_model_states(in);
  // zero_init=1: 18*N/M*1.5; zero_init=0: N*max(4*8, 18/2)*1.5.
  EXPECT_DOUBLE_EQ(rows[0].cpu_bytes, 1e9 * 9 * 1.5);
  EXPECT_DOUBLE_EQ(rows[1].cpu_bytes, 1e9 * 32 * 1.5);
  // No offload, 16 GPUs in all: 4L + 18N/16 per GPU.
  EXPECT_DOUBLE_EQ(rows[4].gpu_bytes, 4e7 + 18e9 / 16);
}

TEST(EstimateTest, NvmeRowsMoveStatesOffTheCpu) {
  EstimateInput in{2000000000, 50000000, 1, 1, 1.5};
  auto rows = estimate_model_states(in);
  const EstimateRow* nvme = nullptr;
  for (const auto& r : rows) {
    if (r.offload_param == "nvme" && r.offload_optimizer == "nvme") nvme = &r;
  }
  ASSERT_NE(nvme, nullptr);
  EXPECT_DOUBLE_EQ(nvme->nvme_bytes, 2e9 * 18 * 1.5);
  EXPECT_LT(nvme->cpu_bytes, rows[0].cpu_bytes / 50);
  const std::string table = format_estimate(in, rows);
  EXPECT_NE(table.find("SW: Model with 2000M total params, 50M largest layer params."), std::string::npos);
  EXPECT_NE(table.find("offload_param=nvme, offload_optimizer=nvme, zero_init=1"), std::string::npos);
}

}  // namespace
}  // namespace zinf::zero3
