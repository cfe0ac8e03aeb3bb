// The tier classes directly (param_tiers.cpp, optimizer_tiers.cpp): an optimizer tier's arrays
// read back what load_state put there, in memory and on NVMe alike, and refuse an array or size
// it does not have; the two give the same bits for a step; a parameter tier reads the same
// values whether a partition was prefetched, dropped or streamed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "tier_test_config.h"
#include "zero3/tier_factory.h"

namespace zinf::zero3 {
namespace {

using config::OffloadDevice;
using swap::DType;

// "b" is larger than one parameter staging buffer (buffer_size 4096): it streams, never staged.
const std::vector<swap::ParamPartition> kPartitions = {{"a", 3000}, {"b", 4500}, {"c", 7}};

config::DsConfig ds_for(OffloadDevice param, OffloadDevice optimizer, const zinf::testing::TempDir& dir) {
  return testing::tier_ds_config(param, optimizer, dir, 4096);
}

optim::Optimizer adamw() {
  optim::AdamParams adam;
  adam.lr = 1e-2;
  adam.weight_decay = 0.01;
  return optim::Optimizer(optim::OptimizerConfig{adam});
}

struct Made {
  zinf::testing::TempDir dir;
  swap::PartitionLayout layout = swap::PartitionLayout::build(kPartitions, 5000);
  Tiers tiers;
};

void make(Made& m, OffloadDevice param, OffloadDevice optimizer, DType dtype) {
  const config::DsConfig ds = ds_for(param, optimizer, m.dir);
  Result<Tiers> made = make_tiers(TierContext{ds, m.layout, 0, dtype, nullptr}, adamw());
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  m.tiers = std::move(made).value();
  ASSERT_TRUE(m.tiers.optimizer
                  ->init_master([](std::size_t p, std::uint64_t offset, std::span<float> out) {
                    for (std::size_t i = 0; i < out.size(); ++i) out[i] = std::sin(0.3f * static_cast<float>(p * 7919 + offset + i));
                    return Status::ok();
                  })
                  .is_ok());
}

// Distinct values for every (sub-group, array, element).
std::vector<float> pattern(std::size_t sg, std::size_t position, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(sg * 1000003 + position * 10007 + i) * 1e-3f;
  return v;
}

class OptimizerTierTest : public ::testing::TestWithParam<OffloadDevice> {};

TEST_P(OptimizerTierTest, ArraysReadBackWhatWasLoadedAndRefuseWhatTheyDoNotHave) {
  Made m;
  make(m, OffloadDevice::kNone, GetParam(), DType::kF32);
  OptimizerTier& opt = *m.tiers.optimizer;
  const std::size_t arrays = 1 + opt.optimizer().state_count();
  ASSERT_EQ(arrays, 3u);  // master, exp_avg, exp_avg_sq
  ASSERT_EQ(m.layout.subgroups.size(), 2u);
  for (std::size_t sg = 0; sg < m.layout.subgroups.size(); ++sg) {
    for (std::size_t a = 0; a < arrays; ++a) {
      const std::vector<float> v = pattern(sg, a, m.layout.subgroups[sg].numel);
      ASSERT_TRUE(opt.load_state(sg, StateArray::at_position(a), v).is_ok()) << sg << " " << a;
    }
  }
  for (std::size_t sg = 0; sg < m.layout.subgroups.size(); ++sg) {
    for (std::size_t a = 0; a < arrays; ++a) {
      std::vector<float> got(m.layout.subgroups[sg].numel);
      ASSERT_TRUE(opt.read_state(sg, StateArray::at_position(a), got).is_ok());
      EXPECT_EQ(got, pattern(sg, a, got.size())) << "sub-group " << sg << ", array " << a;
    }
  }
  EXPECT_EQ(StateArray::master().position(), 0u);
  EXPECT_EQ(StateArray::optimizer_state(1), StateArray::at_position(2));
  std::vector<float> out(m.layout.subgroups[0].numel);
  EXPECT_FALSE(opt.read_state(0, StateArray::optimizer_state(2), out).is_ok()) << "AdamW has two states";
  std::vector<float> short_out(out.size() - 1);
  EXPECT_FALSE(opt.read_state(0, StateArray::master(), short_out).is_ok());
  EXPECT_FALSE(opt.load_state(0, StateArray::master(), short_out).is_ok());
}

INSTANTIATE_TEST_SUITE_P(MemoryAndNvme, OptimizerTierTest,
                         ::testing::Values(OffloadDevice::kCpu, OffloadDevice::kNvme),
                         [](const ::testing::TestParamInfo<OffloadDevice>& info) {
                           return std::string(config::offload_device_name(info.param));
                         });

TEST(OptimizerTiers, MemoryAndNvmeGiveTheSameBitsForAStep) {
  Made memory, nvme;
  make(memory, OffloadDevice::kNone, OffloadDevice::kCpu, DType::kBF16);
  make(nvme, OffloadDevice::kNone, OffloadDevice::kNvme, DType::kBF16);
  for (Made* m : {&memory, &nvme}) {
    // Through the tiers' gradient store (memory, or the NVMe optimizer's gradient swap store),
    // the same values at the same padded positions.
    swap::StepArgs args;
    args.ctx.step = 1;
    ASSERT_TRUE(m->tiers.grads->begin_step().is_ok());
    for (std::size_t p = 0; p < m->layout.params.size(); ++p) {
      std::vector<float> g(m->layout.params[p].numel);
      for (std::size_t i = 0; i < g.size(); ++i) {
        g[i] = std::cos(0.01f * static_cast<float>(m->layout.offset_in_subgroup[p] + i));
      }
      ASSERT_TRUE(m->tiers.grads->accumulate(p, g).is_ok());
    }
    ASSERT_TRUE(m->tiers.grads->stats().is_ok());
    args.grads = m->tiers.grads->step_views();
    args.sink = &m->tiers.params->sink();
    ASSERT_TRUE(m->tiers.optimizer->step(args).is_ok());
  }
  for (std::size_t sg = 0; sg < memory.layout.subgroups.size(); ++sg) {
    for (std::size_t a = 0; a < 3; ++a) {
      std::vector<float> x(memory.layout.subgroups[sg].numel), y(x.size());
      ASSERT_TRUE(memory.tiers.optimizer->read_state(sg, StateArray::at_position(a), x).is_ok());
      ASSERT_TRUE(nvme.tiers.optimizer->read_state(sg, StateArray::at_position(a), y).is_ok());
      EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0) << "sub-group " << sg << ", array " << a;
    }
  }
}

// What read_f32 returns after the copies are written: the same whether the partition was
// prefetched, prefetched and dropped, or not prefetched at all (and "b" is too large to stage).
TEST(ParamTiers, ReadsAreTheSameWhateverWasPrefetched) {
  for (OffloadDevice device : {OffloadDevice::kCpu, OffloadDevice::kNvme}) {
    Made m;
    make(m, device, OffloadDevice::kCpu, DType::kBF16);
    ParamTier& params = *m.tiers.params;
    ASSERT_TRUE(m.tiers.optimizer->write_param_copies(params.sink()).is_ok());
    ASSERT_TRUE(params.flush().is_ok());
    EXPECT_NE(params.describe().find(device == OffloadDevice::kNvme ? "nvme" : "memory"), std::string::npos)
        << params.describe();
    for (std::size_t p = 0; p < m.layout.params.size(); ++p) {
      std::vector<float> plain(m.layout.params[p].numel), staged(plain.size()), dropped(plain.size());
      ASSERT_TRUE(params.read_f32(p, plain).is_ok());
      params.prefetch(p);
      ASSERT_TRUE(params.read_f32(p, staged).is_ok());
      params.prefetch(p);
      params.drop_prefetch(p);
      ASSERT_TRUE(params.read_f32(p, dropped).is_ok());
      EXPECT_EQ(staged, plain) << m.layout.params[p].key;
      EXPECT_EQ(dropped, plain) << m.layout.params[p].key;
      // bf16 copies of the master weights: within bf16's rounding of them.
      const std::size_t sg = m.layout.subgroup_of[p];
      std::vector<float> master(m.layout.subgroups[sg].numel);
      ASSERT_TRUE(m.tiers.optimizer->read_state(sg, StateArray::master(), master).is_ok());
      for (std::size_t i = 0; i < plain.size(); ++i) {
        const float want = master[m.layout.offset_in_subgroup[p] + i];
        ASSERT_NEAR(plain[i], want, std::fabs(want) * 0x1p-8f) << m.layout.params[p].key << "[" << i << "]";
      }
    }
  }
}

}  // namespace
}  // namespace zinf::zero3
