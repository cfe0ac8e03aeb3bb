// The reference's learning-rate schedules as pure functions of the step index, in double,
// with the reference's operation order so that values match it exactly.
#include "zinf/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include <fmt/format.h>

#include "optim/param_reader.h"

namespace zinf::optim {
namespace {

using detail::ParamReader;

constexpr std::string_view kSection = "scheduler.params";

// The warmup shared by WarmupLR, WarmupDecayLR and WarmupCosineLR: gamma in [0, 1) for k < W.
struct Warmup {
  std::int64_t steps = 1000;  // W, at least 2 once read
  bool log = true;            // warmup_type "log" (else "linear")

  double gamma(std::int64_t k) const {
    if (log) return (1.0 / std::log(static_cast<double>(steps))) * std::log(static_cast<double>(k + 1));
    return static_cast<double>(k) / static_cast<double>(steps);
  }

  Status read(ParamReader& r) {
    ZINF_RETURN_IF_ERROR(r.integer("warmup_num_steps", &steps));
    if (steps < 0) return r.error("warmup_num_steps", fmt::format("must be a non-negative integer, got {}", steps));
    // As the reference: fewer than two warmup steps (0 and 1, what the HF Trainer's default
    // warmup_steps 0 gives) are taken as two.
    steps = std::max<std::int64_t>(2, steps);
    std::string type = "log";
    ZINF_RETURN_IF_ERROR(r.text("warmup_type", &type));
    if (type != "log" && type != "linear") {
      return r.error("warmup_type", fmt::format("'{}' is not one of log, linear", type));
    }
    log = type == "log";
    return Status::ok();
  }
};

Status read_last_batch_iteration(ParamReader& r, std::int64_t* k) {
  ZINF_RETURN_IF_ERROR(r.integer("last_batch_iteration", k));
  if (*k < -1) return r.error("last_batch_iteration", fmt::format("{} is below -1", *k));
  return Status::ok();
}

// WarmupLR, and WarmupDecayLR when total_steps is set.
class WarmupLr final : public LrSchedule {
 public:
  static Result<std::unique_ptr<LrSchedule>> make(bool decay, const ParamMap& params, double optimizer_lr) {
    auto s = std::make_unique<WarmupLr>();
    s->decay_ = decay;
    // The reference's WarmupLR warms up to the optimizer's lr unless told otherwise;
    // WarmupDecayLR defaults to 0.001.
    s->max_lr_ = decay ? 0.001 : optimizer_lr;
    ParamReader r(kSection, decay ? "WarmupDecayLR" : "WarmupLR", params);
    if (decay) {
      if (!r.has("total_num_steps")) return r.error("total_num_steps", "required by WarmupDecayLR");
      ZINF_RETURN_IF_ERROR(r.integer("total_num_steps", &s->total_steps_));
    }
    ZINF_RETURN_IF_ERROR(r.number("warmup_min_lr", &s->min_lr_));
    ZINF_RETURN_IF_ERROR(r.number("warmup_max_lr", &s->max_lr_));
    ZINF_RETURN_IF_ERROR(s->warmup_.read(r));
    ZINF_RETURN_IF_ERROR(read_last_batch_iteration(r, &s->initial_k_));
    ZINF_RETURN_IF_ERROR(r.finish());
    return std::unique_ptr<LrSchedule>(std::move(s));
  }

  std::string_view type() const override { return decay_ ? "WarmupDecayLR" : "WarmupLR"; }

  double lr(std::int64_t k) const override {
    if (k < 0) return min_lr_;
    double gamma = 1.0;
    if (k < warmup_.steps) {
      gamma = warmup_.gamma(k);
    } else if (decay_) {
      gamma = std::max(0.0, static_cast<double>(total_steps_ - k) /
                                std::max(1.0, static_cast<double>(total_steps_ - warmup_.steps)));
    }
    return min_lr_ + (max_lr_ - min_lr_) * gamma;
  }

 private:
  bool decay_ = false;
  double min_lr_ = 0.0;
  double max_lr_ = 0.001;
  std::int64_t total_steps_ = 0;
  Warmup warmup_;
};

class WarmupCosineLr final : public LrSchedule {
 public:
  static Result<std::unique_ptr<LrSchedule>> make(const ParamMap& params, double optimizer_lr) {
    auto s = std::make_unique<WarmupCosineLr>();
    s->base_lr_ = optimizer_lr;
    ParamReader r(kSection, "WarmupCosineLR", params);
    if (!r.has("total_num_steps")) return r.error("total_num_steps", "required by WarmupCosineLR");
    ZINF_RETURN_IF_ERROR(r.integer("total_num_steps", &s->total_steps_));
    ZINF_RETURN_IF_ERROR(r.number("warmup_min_ratio", &s->warmup_min_ratio_));
    ZINF_RETURN_IF_ERROR(r.number("cos_min_ratio", &s->cos_min_ratio_));
    ZINF_RETURN_IF_ERROR(s->warmup_.read(r));
    ZINF_RETURN_IF_ERROR(read_last_batch_iteration(r, &s->initial_k_));
    ZINF_RETURN_IF_ERROR(r.finish());
    return std::unique_ptr<LrSchedule>(std::move(s));
  }

  std::string_view type() const override { return "WarmupCosineLR"; }

  double lr(std::int64_t k) const override { return k < 0 ? 0.0 : base_lr_ * ratio(k); }

 private:
  double ratio(std::int64_t k) const {
    if (k < warmup_.steps) return warmup_min_ratio_ + warmup_.gamma(k) * (1.0 - warmup_min_ratio_);
    const double real_last = static_cast<double>(k - warmup_.steps + 1);
    const double real_total = std::max(1.0, static_cast<double>(total_steps_ - warmup_.steps));
    // As the current reference: progress stops at 1, so the ratio stays at cos_min_ratio after T.
    const double progress = std::min(1.0, real_last / real_total);
    const double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
    return std::max(0.0, cos_min_ratio_ + (1.0 - cos_min_ratio_) * cosine);
  }

  double base_lr_ = 0.0;
  std::int64_t total_steps_ = 0;
  double warmup_min_ratio_ = 0.0;
  double cos_min_ratio_ = 0.0001;
  Warmup warmup_;
};

class LrRangeTest final : public LrSchedule {
 public:
  static Result<std::unique_ptr<LrSchedule>> make(const ParamMap& params) {
    auto s = std::make_unique<LrRangeTest>();
    ParamReader r(kSection, "LRRangeTest", params);
    ZINF_RETURN_IF_ERROR(r.number("lr_range_test_min_lr", &s->min_lr_));
    ZINF_RETURN_IF_ERROR(r.number("lr_range_test_step_size", &s->step_size_));
    ZINF_RETURN_IF_ERROR(r.number("lr_range_test_step_rate", &s->step_rate_));
    ZINF_RETURN_IF_ERROR(r.boolean("lr_range_test_staircase", &s->staircase_));
    ZINF_RETURN_IF_ERROR(read_last_batch_iteration(r, &s->initial_k_));
    ZINF_RETURN_IF_ERROR(r.finish());
    if (!(s->step_size_ > 0.0)) {
      return r.error("lr_range_test_step_size", fmt::format("must be positive, got {}", s->step_size_));
    }
    return std::unique_ptr<LrSchedule>(std::move(s));
  }

  std::string_view type() const override { return "LRRangeTest"; }

  double lr(std::int64_t k) const override {
    const double interval = static_cast<double>(std::max<std::int64_t>(k, -1) + 1) / step_size_;
    return min_lr_ * (1.0 + step_rate_ * (staircase_ ? std::floor(interval) : interval));
  }

 private:
  double min_lr_ = 1e-3;
  double step_size_ = 2000;
  double step_rate_ = 1.0;
  bool staircase_ = false;
};

}  // namespace

// OneCycle lives in lr_schedule_one_cycle.cpp.
Result<std::unique_ptr<LrSchedule>> make_one_cycle(const ParamMap& params);

Result<std::unique_ptr<LrSchedule>> make_schedule(std::string_view type, const ParamMap& params,
                                                  double optimizer_lr) {
  if (type == "WarmupLR") return WarmupLr::make(false, params, optimizer_lr);
  if (type == "WarmupDecayLR") return WarmupLr::make(true, params, optimizer_lr);
  if (type == "WarmupCosineLR") return WarmupCosineLr::make(params, optimizer_lr);
  if (type == "OneCycle") return make_one_cycle(params);
  if (type == "LRRangeTest") return LrRangeTest::make(params);
  return Status::invalid_argument(fmt::format(
      "scheduler.type: unknown schedule '{}' (known: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest)",
      type));
}

}  // namespace zinf::optim
