// The fused Adam/AdamW kernel: one grid-stride pass over the parameters, per-element code
// shared with the host (adam.h).
#include "gpu/adam.h"
#include "gpu/kernel_util.cuh"

namespace zinf::gpu {
namespace {

using optim::DType;
using optim::detail::AdamScalars;
using optim::detail::Decay;

template <DType G, DType C, Decay D>
__global__ void adam_kernel(AdamScalars s, AdamArrays a) {
  for (std::size_t i = detail::grid_start(); i < a.n; i += detail::grid_stride()) detail::adam_update<G, C, D>(s, a, i);
}

}  // namespace

Status adam_step(const optim::AdamParams& hp, std::int64_t step, double grad_scale, const AdamArrays& a,
                 cudaStream_t stream) {
  ZINF_RETURN_IF_ERROR(check_adam_step(hp, step, grad_scale, a));
  if (a.n == 0) return Status::ok();
  const AdamScalars s = adam_scalars(hp, step, grad_scale);
  const unsigned blocks = grid_for(a.n, kThreads);
  detail::with_adam_types(a, s.decay, [&]<DType G, DType C, Decay D>() {
    adam_kernel<G, C, D><<<blocks, kThreads, 0, stream>>>(s, a);
  });
  return launched("adam_step", {Dim{"n", static_cast<long long>(a.n)}, Dim{"step", step},
                                Dim{"grad_dtype", static_cast<long long>(a.grad_dtype)}});
}

}  // namespace zinf::gpu
