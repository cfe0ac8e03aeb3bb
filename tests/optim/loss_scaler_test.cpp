// The loss scaler against sequences worked out by hand from the reference state machine.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "zinf/optim/loss_scaler.h"

namespace zinf::optim {
namespace {

LossScaler make(const LossScalerConfig& c) {
  Result<LossScaler> s = LossScaler::create(c);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return std::move(s).value();
}

// Feeds "O" (overflow) / "G" (good) iterations and returns the scale after each.
std::vector<double> scales_after(LossScaler& s, const std::string& pattern) {
  std::vector<double> out;
  for (char c : pattern) {
    EXPECT_TRUE(s.update(c == 'O').is_ok());
    out.push_back(s.scale());
  }
  return out;
}

TEST(LossScaler, ReferenceDefaults) {
  LossScaler s = make({});
  EXPECT_TRUE(s.dynamic());
  EXPECT_EQ(s.scale(), 65536.0);  // 2^16
  EXPECT_EQ(s.state().hysteresis_left, 2);
  EXPECT_EQ(s.state().last_overflow_iteration, -1);
}

TEST(LossScaler, HysteresisThenGrowthEveryWindow) {
  LossScaler s = make({.initial_scale_power = 4, .loss_scale_window = 3, .hysteresis = 2});
  // i0 O: hysteresis 2 -> 1, scale kept.  i1 O: halve to 8.  i2, i3 G: (i - 1) % 3 != 0.
  // i4 G: (4 - 1) % 3 == 0: double to 16, hysteresis refilled.  i5 O: hysteresis 2 -> 1.
  // i6, i7 G.  i8 G: (8 - 5) % 3 == 0: double to 32.
  EXPECT_EQ(scales_after(s, "OOGGGOGGG"), (std::vector<double>{16, 8, 8, 8, 16, 16, 16, 16, 32}));
  EXPECT_EQ(s.state().iteration, 9);
  EXPECT_EQ(s.state().last_overflow_iteration, 5);
}

TEST(LossScaler, FirstGrowthCountsFromIterationMinusOne) {
  LossScaler s = make({.initial_scale_power = 3, .loss_scale_window = 3});
  // (0 + 1) % 3, (1 + 1) % 3 != 0; (2 + 1) % 3 == 0: the third good iteration doubles.
  EXPECT_EQ(scales_after(s, "GGGGGG"), (std::vector<double>{8, 8, 16, 16, 16, 32}));
}

TEST(LossScaler, ConsecutiveHysteresisRefillsAfterEveryGoodIteration) {
  LossScalerConfig c{.initial_scale_power = 10, .loss_scale_window = 100, .hysteresis = 2};
  LossScaler plain = make(c);
  // i0 O: hysteresis 1.  i1 G: stays 1.  i2 O: halve.  i3 O: halve again.
  EXPECT_EQ(scales_after(plain, "OGOO"), (std::vector<double>{1024, 1024, 512, 256}));
  c.consecutive_hysteresis = true;
  LossScaler refilled = make(c);
  // i1 G refills hysteresis to 2, so i2 O only uses it up; i3 O halves.
  EXPECT_EQ(scales_after(refilled, "OGOO"), (std::vector<double>{1024, 1024, 1024, 512}));
}

TEST(LossScaler, HysteresisOneHalvesAtOnceAndStopsAtMinimum) {
  LossScaler s = make({.initial_scale_power = 2, .hysteresis = 1, .min_loss_scale = 1});
  EXPECT_EQ(scales_after(s, "OO"), (std::vector<double>{2, 1}));
  const Status st = s.update(true);  // already at the minimum
  EXPECT_EQ(st.code(), ErrorCode::kAborted);
  EXPECT_NE(st.message().find("minimum"), std::string::npos) << st.message();
  EXPECT_EQ(s.scale(), 1.0);               // unchanged by the failed update
  EXPECT_EQ(s.state().iteration, 2);
  EXPECT_TRUE(s.update(false).is_ok());    // a good iteration is still fine
}

TEST(LossScaler, HalvingIsClampedToTheMinimum) {
  LossScaler s = make({.initial_scale_power = 1, .hysteresis = 1, .min_loss_scale = 1.5});
  EXPECT_EQ(scales_after(s, "O"), (std::vector<double>{1.5}));  // max(2 / 2, 1.5)
  EXPECT_FALSE(s.update(true).is_ok());
}

TEST(LossScaler, HysteresisIsUsedUpBeforeTheMinimumError) {
  LossScaler s = make({.initial_scale_power = 0, .hysteresis = 3, .min_loss_scale = 1});
  EXPECT_EQ(scales_after(s, "OO"), (std::vector<double>{1, 1}));  // hysteresis 3 -> 2 -> 1
  EXPECT_FALSE(s.update(true).is_ok());
}

TEST(LossScaler, StaticScaleNeverChanges) {
  LossScaler s = make({.loss_scale = 128});
  EXPECT_FALSE(s.dynamic());
  EXPECT_EQ(scales_after(s, "OOOGGG"), (std::vector<double>(6, 128)));
}

TEST(LossScaler, StateRoundTrips) {
  LossScaler a = make({.initial_scale_power = 4, .loss_scale_window = 3});
  (void)scales_after(a, "OGG");
  LossScaler b = make({.initial_scale_power = 4, .loss_scale_window = 3});
  ASSERT_TRUE(b.restore(a.state()).is_ok());
  EXPECT_EQ(scales_after(a, "GOOG"), scales_after(b, "GOOG"));
  EXPECT_FALSE(b.restore({.scale = -1}).is_ok());
}

TEST(LossScalerConfig, ParsesTheFp16Block) {
  Result<LossScalerConfig> c = LossScalerConfig::parse({{"loss_scale", 0.0},
                                                        {"initial_scale_power", 12.0},
                                                        {"loss_scale_window", 500.0},
                                                        {"hysteresis", 3.0},
                                                        {"consecutive_hysteresis", true},
                                                        {"min_loss_scale", 0.5}});
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->initial_scale_power, 12);
  EXPECT_EQ(c->loss_scale_window, 500);
  EXPECT_EQ(c->hysteresis, 3);
  EXPECT_TRUE(c->consecutive_hysteresis);
  EXPECT_EQ(c->min_loss_scale, 0.5);
}

TEST(LossScalerConfig, RejectsUnknownKeysAndFractions) {
  Result<LossScalerConfig> c = LossScalerConfig::parse({{"loss_scale_windows", 500.0}});
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("fp16.loss_scale_windows"), std::string::npos) << c.status().message();
  c = LossScalerConfig::parse({{"hysteresis", 2.5}});
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("fp16.hysteresis"), std::string::npos);
  EXPECT_FALSE(LossScaler::create({.loss_scale_window = 0}).is_ok());
}

}  // namespace
}  // namespace zinf::optim
