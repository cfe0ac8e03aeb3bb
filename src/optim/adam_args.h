// Internal: adam_step's argument checks and per-step scalars, shared with the GPU's fused Adam
// (src/gpu/adam.*) so that both refuse the same inputs in the same words and derive the same
// scalar bits. The arrays are only looked at as addresses, never read, so they may be device
// memory.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "optim/kernels.h"
#include "zinf/optim/optimizer.h"
#include "zinf/status.h"

namespace zinf::optim::detail {

// step >= 1, the hyperparameters, sizes, null pointers, alignment, the copy dtype, the
// gradient scale and overlapping ranges; errors start with `op`.
Status check_adam_args(std::string_view op, const AdamParams& hp, std::int64_t step, std::span<float> params,
                       std::span<float> exp_avg, std::span<float> exp_avg_sq, const GradView& grad,
                       const HalfCopy& copy);

// The step's scalars, computed in double and converted to float once (see AdamScalars).
AdamScalars adam_scalars(const AdamParams& hp, std::int64_t step, double grad_scale);

}  // namespace zinf::optim::detail
