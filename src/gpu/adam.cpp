// Host side of the fused GPU Adam: the per-step scalars, the argument checks, and the host run
// of the same per-element code that tests hold against optim::adam_step.
#include "gpu/adam.h"
#include "optim/adam_args.h"

namespace zinf::gpu {

using optim::detail::AdamScalars;
using optim::detail::Decay;

AdamScalars adam_scalars(const optim::AdamParams& hp, std::int64_t step, double grad_scale) {
  return optim::detail::adam_scalars(hp, step, grad_scale);
}

Status check_adam_step(const optim::AdamParams& hp, std::int64_t step, double grad_scale, const AdamArrays& a) {
  // optim::adam_step's checks, on spans that are only looked at as addresses.
  const optim::GradView grad{a.grad, a.grad_dtype, a.n, grad_scale};
  const optim::HalfCopy copy{a.copy, a.copy_dtype};
  return optim::detail::check_adam_args("gpu adam_step", hp, step, {a.params, a.n}, {a.exp_avg, a.n},
                                        {a.exp_avg_sq, a.n}, grad, copy);
}

Status adam_step_on_host(const optim::AdamParams& hp, std::int64_t step, double grad_scale, const AdamArrays& a) {
  ZINF_RETURN_IF_ERROR(check_adam_step(hp, step, grad_scale, a));
  const AdamScalars s = adam_scalars(hp, step, grad_scale);
  detail::with_adam_types(a, s.decay, [&]<optim::DType G, optim::DType C, Decay D>() {
    for (std::size_t i = 0; i < a.n; i++) detail::adam_update<G, C, D>(s, a, i);
  });
  return Status::ok();
}

}  // namespace zinf::gpu
