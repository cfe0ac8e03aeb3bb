// Learning-rate schedules of the reference: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle
// (with momentum) and LRRangeTest, as pure functions of the step index.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "zinf/optim/params.h"
#include "zinf/status.h"

namespace zinf::optim {

// k is the reference's last_batch_iteration: the number of scheduler steps taken so far
// minus one. The reference sets lr(-1) when the scheduler is built and advances k after every
// optimizer step that was not skipped, so optimizer step t (from 1, counting only steps taken)
// runs with lr(t - 2). Values for k < -1 equal lr(-1). All math is in double.
class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  virtual std::string_view type() const = 0;
  virtual double lr(std::int64_t k) const = 0;
  // beta1 at step k when the schedule cycles momentum (OneCycle with cycle_momentum), else
  // nullopt. The reference also forces beta2 to 0.99 while cycling; zinf keeps the configured
  // beta2 (see docs/optim.md).
  virtual std::optional<double> momentum(std::int64_t k) const {
    (void)k;
    return std::nullopt;
  }
  // The configured last_batch_iteration (default -1): where a resumed reference run starts.
  std::int64_t initial_k() const { return initial_k_; }

 protected:
  std::int64_t initial_k_ = -1;
};

// Builds a schedule from the "scheduler" block. `optimizer_lr` is the optimizer's lr
// (WarmupCosineLR scales it). Parameter names and defaults are the reference's; an unknown
// parameter or type is an error naming it, e.g. "scheduler.params.warmup_steps: unknown
// parameter for WarmupLR (known: ...)".
Result<std::unique_ptr<LrSchedule>> make_schedule(std::string_view type, const ParamMap& params,
                                                  double optimizer_lr);

}  // namespace zinf::optim
