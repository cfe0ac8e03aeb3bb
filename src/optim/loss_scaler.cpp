// The reference's dynamic loss scaler state machine, and the static scale.
#include "zinf/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "optim/param_reader.h"

namespace zinf::optim {

Result<LossScalerConfig> LossScalerConfig::parse(const ParamMap& fp16_block) {
  detail::ParamReader r("fp16", "fp16 loss scaling", fp16_block);
  LossScalerConfig c;
  std::int64_t power = c.initial_scale_power;
  std::int64_t hysteresis = c.hysteresis;
  ZINF_RETURN_IF_ERROR(r.number("loss_scale", &c.loss_scale));
  ZINF_RETURN_IF_ERROR(r.integer("initial_scale_power", &power));
  ZINF_RETURN_IF_ERROR(r.integer("loss_scale_window", &c.loss_scale_window));
  ZINF_RETURN_IF_ERROR(r.integer("hysteresis", &hysteresis));
  ZINF_RETURN_IF_ERROR(r.boolean("consecutive_hysteresis", &c.consecutive_hysteresis));
  ZINF_RETURN_IF_ERROR(r.number("min_loss_scale", &c.min_loss_scale));
  ZINF_RETURN_IF_ERROR(r.finish());
  if (power < 0 || power > 127) return r.error("initial_scale_power", fmt::format("{} is not in [0, 127]", power));
  if (hysteresis < 1 || hysteresis > 1'000'000) return r.error("hysteresis", fmt::format("{} must be at least 1", hysteresis));
  c.initial_scale_power = static_cast<int>(power);
  c.hysteresis = static_cast<int>(hysteresis);
  return c;
}

LossScaler::LossScaler(const LossScalerConfig& config) : config_(config) {
  state_.scale = dynamic() ? std::ldexp(1.0, config.initial_scale_power) : config.loss_scale;
  state_.hysteresis_left = config.hysteresis;
}

Result<LossScaler> LossScaler::create(const LossScalerConfig& config) {
  if (!(config.loss_scale >= 0.0) || !std::isfinite(config.loss_scale)) {
    return Status::invalid_argument(fmt::format("fp16.loss_scale: {} must be 0 (dynamic) or positive", config.loss_scale));
  }
  if (config.initial_scale_power < 0 || config.initial_scale_power > 127) {
    return Status::invalid_argument(fmt::format("fp16.initial_scale_power: {} is not in [0, 127]", config.initial_scale_power));
  }
  if (config.loss_scale_window < 1) {
    return Status::invalid_argument(fmt::format("fp16.loss_scale_window: {} must be at least 1", config.loss_scale_window));
  }
  if (config.hysteresis < 1) {
    return Status::invalid_argument(fmt::format("fp16.hysteresis: {} must be at least 1", config.hysteresis));
  }
  if (!(config.min_loss_scale > 0.0) || !std::isfinite(config.min_loss_scale)) {
    return Status::invalid_argument(fmt::format("fp16.min_loss_scale: {} must be positive", config.min_loss_scale));
  }
  return LossScaler(config);
}

Status LossScaler::restore(const State& state) {
  if (!(state.scale > 0.0) || !std::isfinite(state.scale) || state.iteration < 0 ||
      state.last_overflow_iteration < -1 || state.hysteresis_left < 1 || state.hysteresis_left > config_.hysteresis) {
    return Status::invalid_argument(fmt::format(
        "loss scaler state: invalid (scale {}, iteration {}, last overflow {}, hysteresis left {})", state.scale,
        state.iteration, state.last_overflow_iteration, state.hysteresis_left));
  }
  state_ = state;
  return Status::ok();
}

Status LossScaler::update(bool overflow) {
  if (!dynamic()) {
    ++state_.iteration;
    return Status::ok();
  }
  if (overflow) {
    if (config_.hysteresis == 1 || state_.hysteresis_left == 1) {
      if (state_.scale == config_.min_loss_scale) {
        return Status::aborted(fmt::format(
            "loss scale is already at its minimum ({}) and the gradients overflowed again at iteration {}; "
            "training cannot continue (lower fp16.min_loss_scale or check the model for inf/NaN)",
            config_.min_loss_scale, state_.iteration));
      }
      state_.scale = std::max(state_.scale / 2.0, config_.min_loss_scale);
    } else {
      --state_.hysteresis_left;
    }
    state_.last_overflow_iteration = state_.iteration;
  } else {
    if (config_.consecutive_hysteresis) state_.hysteresis_left = config_.hysteresis;
    if ((state_.iteration - state_.last_overflow_iteration) % config_.loss_scale_window == 0) {
      if (!config_.consecutive_hysteresis) state_.hysteresis_left = config_.hysteresis;
      state_.scale *= 2.0;
    }
  }
  ++state_.iteration;
  return Status::ok();
}

}  // namespace zinf::optim
