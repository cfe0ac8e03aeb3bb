// Loss scaling for fp16 training: the reference's dynamic scaler state machine, or a static scale.
#pragma once

#include <cstdint>

#include "zinf/optim/params.h"
#include "zinf/status.h"

namespace zinf::optim {

// The scaler settings of the "fp16" block (reference defaults).
struct LossScalerConfig {
  double loss_scale = 0.0;            // 0: dynamic; > 0: this static scale
  int initial_scale_power = 16;       // dynamic: start at 2^initial_scale_power
  std::int64_t loss_scale_window = 1000;  // good iterations between doublings
  int hysteresis = 2;                 // overflows tolerated before the scale drops
  bool consecutive_hysteresis = false;  // refill hysteresis after every good iteration
  double min_loss_scale = 1.0;

  // Reads the keys above from the fp16 block; other keys (e.g. "enabled", which is the config
  // layer's business) must be removed first: an unknown key is an error naming it.
  static Result<LossScalerConfig> parse(const ParamMap& fp16_block);
};

// The state machine, per iteration (update() is called once per iteration, after the overflow
// check and before the step that overflow may skip):
//   overflow: if the configured or remaining hysteresis is 1, scale = max(scale / 2, min) -
//             unless scale is already min, which is an error (training cannot go on);
//             otherwise remaining hysteresis -= 1. The iteration is remembered.
//   no overflow: with consecutive_hysteresis, hysteresis is refilled; every
//             loss_scale_window iterations after the last overflow (counted from iteration -1
//             at start) the hysteresis is refilled and the scale doubles.
//   The iteration counter goes up by one either way. A static scale never changes.
// Not thread-safe; the training loop owns it.
class LossScaler {
 public:
  // What a checkpoint saves and restores.
  struct State {
    double scale = 1.0;
    std::int64_t iteration = 0;
    std::int64_t last_overflow_iteration = -1;
    int hysteresis_left = 1;
  };

  static Result<LossScaler> create(const LossScalerConfig& config);

  double scale() const { return state_.scale; }
  bool dynamic() const { return config_.loss_scale == 0.0; }
  const State& state() const { return state_; }
  Status restore(const State& state);

  // Records one iteration. Fails, leaving the state unchanged, when an overflow finds the
  // scale already at min_loss_scale with no hysteresis left.
  Status update(bool overflow);

 private:
  explicit LossScaler(const LossScalerConfig& config);
  LossScalerConfig config_;
  State state_;
};

}  // namespace zinf::optim
