// The reference's OneCycle schedule: one triangular cycle of lr (and inverse momentum), then decay.
#include <cmath>
#include <memory>

#include <fmt/format.h>

#include "optim/param_reader.h"
#include "zinf/optim/lr_schedule.h"

namespace zinf::optim {
namespace {

class OneCycle final : public LrSchedule {
 public:
  static Result<std::unique_ptr<LrSchedule>> make(const ParamMap& params) {
    auto s = std::make_unique<OneCycle>();
    detail::ParamReader r("scheduler.params", "OneCycle", params);
    ZINF_RETURN_IF_ERROR(s->read(r));
    ZINF_RETURN_IF_ERROR(r.finish());
    return std::unique_ptr<LrSchedule>(std::move(s));
  }

  std::string_view type() const override { return "OneCycle"; }

  double lr(std::int64_t k) const override {
    if (static_cast<double>(k) < total_) return min_lr_ + (max_lr_ - min_lr_) * scale_factor(k);
    if (decay_step_size_ == 0.0 || decay_lr_rate_ == 0.0) return min_lr_;
    const double interval = (static_cast<double>(k) - total_ + 1.0) / decay_step_size_;
    return min_lr_ / (1.0 + decay_lr_rate_ * interval);
  }

  std::optional<double> momentum(std::int64_t k) const override {
    if (!cycle_momentum_) return std::nullopt;
    // Before the first scheduler step the reference sets beta1 to cycle_min_mom, not to the
    // formula's value (cycle_max_mom) at k = -1.
    if (k < 0) return min_mom_;
    if (static_cast<double>(k) < total_) return max_mom_ - (max_mom_ - min_mom_) * scale_factor(k);
    if (decay_step_size_ == 0.0 || decay_mom_rate_ == 0.0) return max_mom_;
    const double interval = (static_cast<double>(k) - total_ + 1.0) / decay_step_size_;
    return max_mom_ * (1.0 + decay_mom_rate_ * interval);
  }

 private:
  Status read(detail::ParamReader& r) {
    if (!r.has("cycle_min_lr")) return r.error("cycle_min_lr", "required by OneCycle");
    if (!r.has("cycle_max_lr")) return r.error("cycle_max_lr", "required by OneCycle");
    ZINF_RETURN_IF_ERROR(r.number("cycle_min_lr", &min_lr_));
    ZINF_RETURN_IF_ERROR(r.number("cycle_max_lr", &max_lr_));
    ZINF_RETURN_IF_ERROR(r.number("decay_lr_rate", &decay_lr_rate_));
    ZINF_RETURN_IF_ERROR(r.number("cycle_first_step_size", &first_));
    second_ = first_;
    ZINF_RETURN_IF_ERROR(r.number("cycle_second_step_size", &second_));
    ZINF_RETURN_IF_ERROR(r.integer("cycle_first_stair_count", &first_stairs_));
    second_stairs_ = first_stairs_;
    ZINF_RETURN_IF_ERROR(r.integer("cycle_second_stair_count", &second_stairs_));
    ZINF_RETURN_IF_ERROR(r.number("decay_step_size", &decay_step_size_));
    ZINF_RETURN_IF_ERROR(r.boolean("cycle_momentum", &cycle_momentum_));
    ZINF_RETURN_IF_ERROR(r.number("cycle_min_mom", &min_mom_));
    ZINF_RETURN_IF_ERROR(r.number("cycle_max_mom", &max_mom_));
    ZINF_RETURN_IF_ERROR(r.number("decay_mom_rate", &decay_mom_rate_));
    ZINF_RETURN_IF_ERROR(r.integer("last_batch_iteration", &initial_k_));
    if (initial_k_ < -1) return r.error("last_batch_iteration", fmt::format("{} is below -1", initial_k_));
    if (!(first_ > 0.0)) return r.error("cycle_first_step_size", fmt::format("must be positive, got {}", first_));
    if (!(second_ > 0.0)) return r.error("cycle_second_step_size", fmt::format("must be positive, got {}", second_));
    if (decay_step_size_ < 0.0) return r.error("decay_step_size", fmt::format("must not be negative, got {}", decay_step_size_));
    if (first_stairs_ < 0) return r.error("cycle_first_stair_count", "must not be negative");
    if (second_stairs_ < 0) return r.error("cycle_second_stair_count", "must not be negative");
    total_ = first_ + second_;
    step_ratio_ = first_ / total_;
    return Status::ok();
  }

  // Where step k sits on the triangle: 0 at the bottom, 1 at the peak.
  double scale_factor(std::int64_t k) const {
    const double b = static_cast<double>(std::max<std::int64_t>(k, -1) + 1);
    const double cycle = std::floor(1.0 + b / total_);
    const double x = 1.0 + b / total_ - cycle;
    double scale = 0.0;
    std::int64_t stairs = 0;
    if (x <= step_ratio_) {
      scale = x / step_ratio_;
      stairs = first_stairs_;
    } else {
      scale = (x - 1.0) / (step_ratio_ - 1.0);
      stairs = second_stairs_;
    }
    if (stairs > 0) {  // hold flat across stairs, quantised from the integer position
      const double in_cycle = std::fmod(b, total_);
      const double stair_count = static_cast<double>(stairs);
      const double position = in_cycle <= first_ ? in_cycle * stair_count / first_
                                                 : (total_ - in_cycle) * stair_count / second_;
      scale = std::floor(position) / stair_count;
    }
    return scale;
  }

  double min_lr_ = 0.0, max_lr_ = 0.0, decay_lr_rate_ = 0.0;
  double first_ = 2000.0, second_ = 2000.0, total_ = 4000.0, step_ratio_ = 0.5;
  std::int64_t first_stairs_ = 0, second_stairs_ = 0;
  double decay_step_size_ = 0.0;
  bool cycle_momentum_ = true;
  double min_mom_ = 0.8, max_mom_ = 0.9, decay_mom_rate_ = 0.0;
};

}  // namespace

Result<std::unique_ptr<LrSchedule>> make_one_cycle(const ParamMap& params) { return OneCycle::make(params); }

}  // namespace zinf::optim
