// Schedule values at chosen steps, worked out by hand from the reference formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "zinf/optim/lr_schedule.h"

namespace zinf::optim {
namespace {

std::unique_ptr<LrSchedule> make(std::string_view type, const ParamMap& params, double optimizer_lr = 0.1) {
  Result<std::unique_ptr<LrSchedule>> s = make_schedule(type, params, optimizer_lr);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? std::move(s).value() : nullptr;
}

std::string error_of(std::string_view type, const ParamMap& params) {
  Result<std::unique_ptr<LrSchedule>> s = make_schedule(type, params, 0.1);
  return s.is_ok() ? "" : s.status().message();
}

TEST(WarmupLR, LogWarmup) {
  auto s = make("WarmupLR", {{"warmup_min_lr", 0.0}, {"warmup_max_lr", 0.01}, {"warmup_num_steps", 10.0}});
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->lr(-1), 0.0);  // at construction
  EXPECT_EQ(s->lr(0), 0.0);   // ln(1) = 0
  EXPECT_NEAR(s->lr(4), 0.01 * 0.69897000433601880, 1e-17);  // 0.01 * ln 5 / ln 10
  EXPECT_NEAR(s->lr(9), 0.01, 1e-17);
  EXPECT_EQ(s->lr(10), 0.01);
  EXPECT_EQ(s->lr(100000), 0.01);
  EXPECT_FALSE(s->momentum(3).has_value());
}

TEST(WarmupLR, LinearWarmupAndDefaults) {
  auto s = make("WarmupLR", {{"warmup_min_lr", 0.001}, {"warmup_max_lr", 0.011}, {"warmup_num_steps", 10.0},
                             {"warmup_type", std::string("linear")}});
  ASSERT_NE(s, nullptr);
  EXPECT_DOUBLE_EQ(s->lr(4), 0.001 + 0.010 * 0.4);
  // warmup_max_lr defaults to the optimizer's lr, as in the current reference.
  auto d = make("WarmupLR", {}, 3e-4);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->lr(1000), 3e-4);
  EXPECT_NEAR(d->lr(99), 3e-4 * std::log(100.0) / std::log(1000.0), 1e-18);
  // One warmup step is taken as two: log gamma at k = 1 is ln 2 / ln 2.
  auto two = make("WarmupLR", {{"warmup_max_lr", 1.0}, {"warmup_num_steps", 1.0}});
  ASSERT_NE(two, nullptr);
  EXPECT_EQ(two->lr(0), 0.0);
  EXPECT_EQ(two->lr(1), 1.0);
  // Zero (the HF Trainer's default warmup_steps, through "auto") too, as the reference's max(2, W).
  auto zero = make("WarmupLR", {{"warmup_max_lr", 1.0}, {"warmup_num_steps", 0.0}});
  ASSERT_NE(zero, nullptr);
  EXPECT_EQ(zero->lr(0), 0.0);
  EXPECT_EQ(zero->lr(1), 1.0);
}

TEST(WarmupDecayLR, LinearDecayAfterWarmup) {
  auto s = make("WarmupDecayLR", {{"warmup_max_lr", 0.01}, {"warmup_num_steps", 10.0}, {"total_num_steps", 110.0},
                                  {"warmup_type", std::string("linear")}});
  ASSERT_NE(s, nullptr);
  EXPECT_DOUBLE_EQ(s->lr(5), 0.005);
  EXPECT_DOUBLE_EQ(s->lr(10), 0.01);   // (110 - 10) / 100
  EXPECT_DOUBLE_EQ(s->lr(60), 0.005);  // (110 - 60) / 100
  EXPECT_EQ(s->lr(110), 0.0);
  EXPECT_EQ(s->lr(200), 0.0);          // clamped at 0
  EXPECT_NE(error_of("WarmupDecayLR", {}).find("scheduler.params.total_num_steps"), std::string::npos);
}

TEST(WarmupCosineLR, WarmupThenCosineToTheFloor) {
  auto s = make("WarmupCosineLR", {{"total_num_steps", 110.0}, {"warmup_num_steps", 10.0},
                                   {"warmup_min_ratio", 0.1}, {"cos_min_ratio", 0.01},
                                   {"warmup_type", std::string("linear")}},
                /*optimizer_lr=*/0.1);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->lr(-1), 0.0);                       // the reference starts at 0
  EXPECT_DOUBLE_EQ(s->lr(5), 0.1 * (0.1 + 0.5 * 0.9));
  // k = 10: progress (10 - 10 + 1) / 100 = 0.01; cos(0.01 pi) = 0.9995065603657316, so
  // ratio = 0.01 + 0.99 * (1 + 0.9995065603657316) / 2 = 0.9997557473810371.
  EXPECT_NEAR(s->lr(10), 0.1 * 0.9997557473810371, 1e-16);
  EXPECT_DOUBLE_EQ(s->lr(59), 0.1 * (0.01 + 0.99 * 0.5));  // progress 0.5: cos = 0
  EXPECT_DOUBLE_EQ(s->lr(109), 0.1 * 0.01);                // progress 1: the floor
  EXPECT_DOUBLE_EQ(s->lr(500), 0.1 * 0.01);                // stays there
  EXPECT_NE(error_of("WarmupCosineLR", {}).find("total_num_steps"), std::string::npos);
}

TEST(OneCycle, TriangleWithInverseMomentum) {
  auto s = make("OneCycle", {{"cycle_min_lr", 0.001}, {"cycle_max_lr", 0.01}, {"cycle_first_step_size", 10.0}});
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->lr(-1), 0.001);
  EXPECT_EQ(s->momentum(-1), 0.8);  // the reference starts beta1 at cycle_min_mom
  // k = 4: b = 5, x = 1 + 5/20 - 1 = 0.25, s = 0.25 / 0.5 = 0.5.
  EXPECT_DOUBLE_EQ(s->lr(4), 0.0055);
  EXPECT_DOUBLE_EQ(*s->momentum(4), 0.85);
  // k = 9: x = 0.5, the peak.
  EXPECT_DOUBLE_EQ(s->lr(9), 0.01);
  EXPECT_DOUBLE_EQ(*s->momentum(9), 0.8);
  // k = 14: x = 0.75, s = (0.75 - 1) / (0.5 - 1) = 0.5.
  EXPECT_DOUBLE_EQ(s->lr(14), 0.0055);
  EXPECT_DOUBLE_EQ(*s->momentum(14), 0.85);
  // k = 19: b = 20 closes the cycle, x = 0.
  EXPECT_DOUBLE_EQ(s->lr(19), 0.001);
  EXPECT_DOUBLE_EQ(*s->momentum(19), 0.9);
  // After the cycle, with no decay: min lr and max momentum.
  EXPECT_EQ(s->lr(20), 0.001);
  EXPECT_EQ(s->momentum(25), 0.9);
}

TEST(OneCycle, DecayAfterTheCycle) {
  auto s = make("OneCycle", {{"cycle_min_lr", 0.001}, {"cycle_max_lr", 0.01}, {"cycle_first_step_size", 10.0},
                             {"decay_step_size", 5.0}, {"decay_lr_rate", 0.5}, {"decay_mom_rate", 0.1}});
  ASSERT_NE(s, nullptr);
  // k = 29: interval (29 - 20 + 1) / 5 = 2.
  EXPECT_DOUBLE_EQ(s->lr(29), 0.001 / (1 + 0.5 * 2));
  EXPECT_DOUBLE_EQ(*s->momentum(29), 0.9 * (1 + 0.1 * 2));
}

TEST(OneCycle, StairsAndAsymmetricHalves) {
  auto s = make("OneCycle", {{"cycle_min_lr", 0.0}, {"cycle_max_lr", 1.0}, {"cycle_first_step_size", 10.0},
                             {"cycle_second_step_size", 30.0}, {"cycle_first_stair_count", 2.0},
                             {"cycle_momentum", false}});
  ASSERT_NE(s, nullptr);
  EXPECT_FALSE(s->momentum(3).has_value());
  EXPECT_EQ(s->lr(3), 0.0);   // b = 4: position 4 * 2 / 10 = 0.8 -> stair 0
  EXPECT_EQ(s->lr(4), 0.5);   // b = 5: position 1
  EXPECT_EQ(s->lr(9), 1.0);   // b = 10: the peak
  EXPECT_EQ(s->lr(24), 0.5);  // b = 25: (40 - 25) * 2 / 30 = 1
  EXPECT_EQ(s->lr(25), 0.0);  // b = 26: 14 * 2 / 30 = 0.93 -> 0
  // Without stairs the second half is linear over 30 steps: b = 25 gives (0.625 - 1) / (0.25 - 1) = 0.5.
  auto smooth = make("OneCycle", {{"cycle_min_lr", 0.0}, {"cycle_max_lr", 1.0}, {"cycle_first_step_size", 10.0},
                                  {"cycle_second_step_size", 30.0}});
  ASSERT_NE(smooth, nullptr);
  EXPECT_DOUBLE_EQ(smooth->lr(24), 0.5);
  EXPECT_NE(error_of("OneCycle", {{"cycle_max_lr", 1.0}}).find("scheduler.params.cycle_min_lr"), std::string::npos);
}

TEST(LRRangeTest, ContinuousAndStaircase) {
  auto s = make("LRRangeTest", {{"lr_range_test_min_lr", 0.001}, {"lr_range_test_step_size", 10.0},
                                {"lr_range_test_step_rate", 2.0}});
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->lr(-1), 0.001);
  EXPECT_DOUBLE_EQ(s->lr(4), 0.001 * (1 + 2 * 0.5));
  auto stairs = make("LRRangeTest", {{"lr_range_test_min_lr", 0.001}, {"lr_range_test_step_size", 10.0},
                                     {"lr_range_test_step_rate", 2.0}, {"lr_range_test_staircase", true}});
  ASSERT_NE(stairs, nullptr);
  EXPECT_EQ(stairs->lr(4), 0.001);
  EXPECT_DOUBLE_EQ(stairs->lr(9), 0.003);
  auto defaults = make("LRRangeTest", {});
  ASSERT_NE(defaults, nullptr);
  EXPECT_DOUBLE_EQ(defaults->lr(1999), 0.002);  // 1e-3 * (1 + 1.0 * 2000 / 2000)
}

TEST(Schedules, ErrorsNameTheParameter) {
  const std::string unknown = error_of("WarmupLR", {{"warmup_steps", 10.0}});
  EXPECT_NE(unknown.find("scheduler.params.warmup_steps: unknown parameter for WarmupLR"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("warmup_num_steps"), std::string::npos) << "lists the known names: " << unknown;
  EXPECT_NE(error_of("WarmupLR", {{"warmup_num_steps", 2.5}}).find("warmup_num_steps"), std::string::npos);
  EXPECT_NE(error_of("WarmupLR", {{"warmup_num_steps", -1.0}}).find("warmup_num_steps"), std::string::npos);
  EXPECT_NE(error_of("WarmupLR", {{"warmup_type", std::string("cosine")}}).find("warmup_type"), std::string::npos);
  EXPECT_NE(error_of("WarmupLR", {{"warmup_max_lr", std::string("auto")}}).find("expected a number"), std::string::npos);
  EXPECT_NE(error_of("CosineAnnealing", {}).find("scheduler.type"), std::string::npos);
  // null means "not given"; last_batch_iteration is kept for a resumed run.
  auto s = make("OneCycle", {{"cycle_min_lr", 0.1}, {"cycle_max_lr", 1.0}, {"cycle_second_step_size", std::monostate{}},
                             {"last_batch_iteration", 41.0}});
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->initial_k(), 41);
}

}  // namespace
}  // namespace zinf::optim
