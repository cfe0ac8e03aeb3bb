// The tier factory and the parameter tiers' sinks, tier by tier: for every offload device pair and
// compute dtype, the copies the optimizer writes through the parameter tier's sink are the master
// weights rounded to that dtype, after the initial publish and after a step. The engine tests
// compare whole runs across devices; these name the tier pair that breaks.
#include "zero3/tier_factory.h"

#include <fmt/format.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "temp_dir.h"
#include "tier_test_config.h"
#include "zero3/early_step.h"
#include "zinf/log.h"
#include "zinf/model/float_buffer.h"
#include "zinf/optim/half.h"

namespace zinf::zero3 {
namespace {

using config::OffloadDevice;
using swap::DType;

const std::vector<swap::ParamPartition> kPartitions = {{"a", 3000}, {"b", 1}, {"c", 4500}, {"d", 2048}, {"e", 7}};

float initial(std::size_t p, std::uint64_t i) { return std::sin(0.37f * static_cast<float>(p * 10007 + i)) * 0.5f; }

config::DsConfig ds_for(OffloadDevice param, OffloadDevice optimizer, const zinf::testing::TempDir& dir) {
  return testing::tier_ds_config(param, optimizer, dir, 8192);
}

// Every partition read back from the parameter tier equals the optimizer's master weights
// rounded to the tier's dtype, bit for bit.
void expect_params_are_rounded_master(Tiers& t, const swap::PartitionLayout& layout) {
  const DType dtype = t.params->dtype();
  for (std::size_t sg = 0; sg < layout.subgroups.size(); ++sg) {
    std::vector<float> master(layout.subgroups[sg].numel);
    ASSERT_TRUE(t.optimizer->read_state(sg, StateArray::master(), master).is_ok());
    std::vector<float> want = master;
    if (dtype != DType::kF32) {
      std::vector<std::uint16_t> half(master.size());
      ASSERT_TRUE(optim::convert_from_f32(master, half.data(), dtype).is_ok());
      ASSERT_TRUE(optim::convert_to_f32(half.data(), dtype, want).is_ok());
    }
    const swap::SubGroup& g = layout.subgroups[sg];
    for (std::size_t p = g.first_param; p < g.first_param + g.param_count; ++p) {
      std::vector<float> got(layout.params[p].numel);
      ASSERT_TRUE(t.params->read_f32(p, got).is_ok());
      EXPECT_EQ(std::memcmp(got.data(), want.data() + layout.offset_in_subgroup[p], got.size() * 4), 0)
          << "partition " << layout.params[p].key;
    }
  }
}

using Case = std::tuple<OffloadDevice, OffloadDevice, DType>;

class TierFactoryTest : public ::testing::TestWithParam<Case> {};

TEST_P(TierFactoryTest, CopiesReachTheParameterTierThroughItsSink) {
  const auto [param_device, optimizer_device, dtype] = GetParam();
  zinf::testing::TempDir dir;
  const config::DsConfig ds = ds_for(param_device, optimizer_device, dir);
  const swap::PartitionLayout layout = swap::PartitionLayout::build(kPartitions, 5000);
  ASSERT_EQ(layout.subgroups.size(), 2u);
  optim::AdamParams adam;
  adam.lr = 1e-2;
  adam.weight_decay = 0.01;
  Result<Tiers> made = make_tiers(TierContext{ds, layout, 0, dtype, nullptr}, optim::Optimizer(optim::OptimizerConfig{adam}));
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  Tiers& t = *made;
  const bool nvme = param_device == OffloadDevice::kNvme || optimizer_device == OffloadDevice::kNvme;
  EXPECT_EQ(t.handle != nullptr, nvme);
  ASSERT_NE(t.gather, nullptr);
  EXPECT_EQ(t.params->dtype(), dtype);
  EXPECT_EQ(t.params->sink().dtype(), dtype);
  // fp32 parameters over memory master weights are those weights: nothing to copy, ever.
  const bool aliased = dtype == DType::kF32 && param_device != OffloadDevice::kNvme &&
                       optimizer_device != OffloadDevice::kNvme;
  for (std::size_t sg = 0; sg < layout.subgroups.size(); ++sg) {
    void* host = t.params->sink().host_subgroup(sg);
    EXPECT_EQ(host != nullptr, param_device != OffloadDevice::kNvme) << "sub-group " << sg;
    EXPECT_EQ(host != nullptr && host == t.optimizer->master_in_memory(sg), aliased) << "sub-group " << sg;
  }

  ASSERT_TRUE(t.optimizer->init_master([](std::size_t p, std::uint64_t offset, std::span<float> out) {
                               for (std::size_t i = 0; i < out.size(); ++i) out[i] = initial(p, offset + i);
                               return Status::ok();
                             }).is_ok());
  ASSERT_TRUE(t.optimizer->write_param_copies(t.params->sink()).is_ok());
  ASSERT_TRUE(t.params->flush().is_ok());
  expect_params_are_rounded_master(t, layout);

  for (std::int64_t step = 1; step <= 2; ++step) {
    // Through the tiers' gradient store (in memory, or the NVMe optimizer's swap store).
    swap::StepArgs in;
    in.ctx.step = step;
    ASSERT_TRUE(t.grads->begin_step().is_ok());
    for (std::size_t p = 0; p < layout.params.size(); ++p) {
      std::vector<float> g(layout.params[p].numel);
      for (std::size_t i = 0; i < g.size(); ++i) {
        g[i] = std::cos(0.1f * static_cast<float>(layout.offset_in_subgroup[p] + i + static_cast<std::size_t>(step)));
      }
      ASSERT_TRUE(t.grads->accumulate(p, g).is_ok());
    }
    ASSERT_TRUE(t.grads->stats().is_ok());
    in.grads = t.grads->step_views();
    EXPECT_EQ(in.grads.empty(), optimizer_device == OffloadDevice::kNvme);
    in.sink = &t.params->sink();
    ASSERT_TRUE(t.optimizer->read_ahead().is_ok());
    ASSERT_TRUE(t.optimizer->step(in).is_ok());
    ASSERT_TRUE(t.params->flush().is_ok());
    expect_params_are_rounded_master(t, layout);
  }
  std::vector<float> master(layout.subgroups[0].numel);
  ASSERT_TRUE(t.optimizer->read_state(0, StateArray::master(), master).is_ok());
  EXPECT_NE(master[0], initial(0, 0)) << "the step changed nothing: the test would prove nothing";
}

std::string device(OffloadDevice d) { return std::string(config::offload_device_name(d)); }

INSTANTIATE_TEST_SUITE_P(
    AllDevices, TierFactoryTest,
    ::testing::Combine(::testing::Values(OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme),
                       ::testing::Values(OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme),
                       ::testing::Values(DType::kBF16, DType::kF16, DType::kF32)),
    [](const ::testing::TestParamInfo<Case>& info) {
      return "param_" + device(std::get<0>(info.param)) + "_optimizer_" + device(std::get<1>(info.param)) + "_" +
             std::string(swap::dtype_name(std::get<2>(info.param)));
    });

// An NVMe run whose ds.json has no "aio" block says, when its tiers are made, that it runs on the
// reference's defaults (naming them) and how to measure the drive; one with the block, or one
// without NVMe, says nothing.
TEST(TierFactory, NvmeWithoutAnAioBlockNamesTheDefaultsAndAioBench) {
  auto notices_for = [](OffloadDevice param, OffloadDevice optimizer, bool present) {
    zinf::testing::TempDir dir;
    config::DsConfig ds = ds_for(param, optimizer, dir);
    ds.aio.present = present;
    const swap::PartitionLayout layout = swap::PartitionLayout::build(kPartitions, 5000);
    std::vector<std::string> notices;
    const LogLevel level = log_level();
    if (level > LogLevel::kNotice) set_log_level(LogLevel::kNotice);
    set_log_sink([&](LogLevel l, std::string_view m) {
      if (l == LogLevel::kNotice && m.find("\"aio\" block") != std::string_view::npos) notices.emplace_back(m);
    });
    Result<Tiers> made =
        make_tiers(TierContext{ds, layout, 0, DType::kBF16, nullptr}, optim::Optimizer(optim::OptimizerConfig{optim::AdamParams{}}));
    set_log_sink(nullptr);
    set_log_level(level);
    EXPECT_TRUE(made.is_ok()) << made.status().to_string();
    return notices;
  };
  const std::vector<std::string> without = notices_for(OffloadDevice::kNvme, OffloadDevice::kNvme, false);
  ASSERT_EQ(without.size(), 1u);
  EXPECT_NE(without[0].find("block_size 65536, queue_depth 4, intra_op_parallelism 1"), std::string::npos) << without[0];
  EXPECT_NE(without[0].find("aio_bench"), std::string::npos) << without[0];
  EXPECT_EQ(notices_for(OffloadDevice::kCpu, OffloadDevice::kNvme, false).size(), 1u);
  EXPECT_TRUE(notices_for(OffloadDevice::kNvme, OffloadDevice::kNvme, true).empty());
  EXPECT_TRUE(notices_for(OffloadDevice::kCpu, OffloadDevice::kCpu, false).empty());
}

TEST(TierFactory, OneStoreConfigForEverySwapStore) {
  const swap::StoreConfig c = swap_store_config("/some/folder", 3);
  EXPECT_EQ(c.nvme_paths, std::vector<std::string>{"/some/folder"});
  EXPECT_EQ(c.rank, 3);
  EXPECT_FALSE(c.durable) << "swap files are scratch space: a crash resumes from a checkpoint";
  EXPECT_TRUE(c.checksums);
}

}  // namespace
}  // namespace zinf::zero3

namespace zinf::zero3 {
namespace {

// Early steps (early_step.h) against the step at the end, on two identical tier sets: kept when
// the step's scale is the speculative one, rolled back and redone when it clips, thrown away when
// the step is skipped. Master weights, states and the parameter copies match bit for bit.
TEST(EarlyStepper, KeptRolledBackOrDroppedGivesTheStepAtTheEndsBits) {
  enum class End { kKeep, kClip, kSkip };
  for (End end : {End::kKeep, End::kClip, End::kSkip}) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      zinf::testing::TempDir dir;
      const config::DsConfig ds = ds_for(OffloadDevice::kCpu, OffloadDevice::kCpu, dir);
      const swap::PartitionLayout layout = swap::PartitionLayout::build(kPartitions, 5000);
      optim::AdamParams adam;
      adam.lr = 1e-2;
      adam.weight_decay = 0.01;
      std::vector<Tiers> sets;
      for (int i = 0; i < 2; ++i) {
        Result<Tiers> made =
            make_tiers(TierContext{ds, layout, 0, dtype, nullptr}, optim::Optimizer(optim::OptimizerConfig{adam}));
        ASSERT_TRUE(made.is_ok()) << made.status().to_string();
        sets.push_back(std::move(made).value());
        Tiers& t = sets.back();
        ASSERT_TRUE(t.optimizer->init_master([](std::size_t p, std::uint64_t offset, std::span<float> out) {
                                   for (std::size_t k = 0; k < out.size(); ++k) out[k] = initial(p, offset + k);
                                   return Status::ok();
                                 }).is_ok());
        ASSERT_TRUE(t.optimizer->write_param_copies(t.params->sink()).is_ok());
      }
      Tiers& at_end = sets[0];
      Tiers& early_tiers = sets[1];
      ASSERT_TRUE(early_steps_possible(*early_tiers.optimizer, *early_tiers.params, *early_tiers.grads, layout));
      std::vector<model::FloatBuffer> grads;
      for (const swap::SubGroup& sg : layout.subgroups) {
        grads.push_back(model::FloatBuffer::allocate(sg.numel));
        for (std::size_t k = 0; k < sg.numel; ++k) grads.back().data()[k] = std::cos(0.1f * static_cast<float>(k));
      }
      auto inputs = [&](Tiers& t, double scale) {
        swap::StepArgs in;
        in.ctx.step = 1;
        in.grad_scale = scale;
        for (const model::FloatBuffer& g : grads) in.grads.push_back(optim::GradView{g.data(), DType::kF32, g.size(), 1.0});
        in.sink = &t.params->sink();
        return in;
      };
      const double speculative = 1.0 / 4096, clipped = 0.5 / 4096;
      if (end != End::kSkip) {
        ASSERT_TRUE(at_end.optimizer->step(inputs(at_end, end == End::kKeep ? speculative : clipped)).is_ok());
      }

      std::vector<optim::GradView> views;
      for (const model::FloatBuffer& g : grads) views.push_back(optim::GradView{g.data(), DType::kF32, g.size(), 1.0});
      EarlyStepper early(layout, *early_tiers.optimizer, views);
      early.begin(inputs(early_tiers, speculative));
      for (std::size_t p = 0; p < layout.params.size(); ++p) early.partition_final(p);
      auto stats = early.stats();
      ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
      ASSERT_EQ(stats->size(), layout.subgroups.size());
      const swap::StepArgs real = inputs(early_tiers, end == End::kKeep ? speculative : clipped);
      auto report = early.finish(end == End::kSkip ? nullptr : &real);
      ASSERT_TRUE(report.is_ok()) << report.status().to_string();
      EXPECT_EQ(report->stepped_early, end == End::kKeep ? layout.subgroups.size() : 0u);
      EXPECT_EQ(report->rolled_back, end == End::kKeep ? 0u : layout.subgroups.size());

      const std::string what = fmt::format("{} {}", end == End::kKeep ? "keep" : end == End::kClip ? "clip" : "skip",
                                           swap::dtype_name(dtype));
      for (std::size_t sg = 0; sg < layout.subgroups.size(); ++sg) {
        for (std::size_t which = 0; which < 3; ++which) {
          std::vector<float> a(layout.subgroups[sg].numel), b(a.size());
          ASSERT_TRUE(at_end.optimizer->read_state(sg, StateArray::at_position(which), a).is_ok());
          ASSERT_TRUE(early_tiers.optimizer->read_state(sg, StateArray::at_position(which), b).is_ok());
          EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
              << what << ": sub-group " << sg << " state " << which;
        }
      }
      for (std::size_t p = 0; p < layout.params.size(); ++p) {
        std::vector<float> a(layout.params[p].numel), b(a.size());
        ASSERT_TRUE(at_end.params->read_f32(p, a).is_ok());
        ASSERT_TRUE(early_tiers.params->read_f32(p, b).is_ok());
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what << ": copy of partition " << p;
      }
    }
  }
}

}  // namespace
}  // namespace zinf::zero3
