// Internal: the fused Adam/AdamW step on the GPU (offload_optimizer: none): gradient unscaling,
// decay, the moment updates, the parameter update and the 16-bit copy in one pass, bit for bit
// the CPU's scalar kernel (optim/kernels_scalar.cpp) for the same inputs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gpu/numerics.h"
#include "optim/dtype_dispatch.h"
#include "optim/kernels.h"
#include "zinf/optim/dtype.h"
#include "zinf/optim/half.h"
#include "zinf/optim/optimizer.h"
#include "zinf/status.h"

namespace zinf::gpu {

// One step's arrays, n elements each: device pointers for adam_step, host pointers for
// adam_step_on_host. The ranges must not overlap; grad is aligned to its element size, copy to 2.
struct AdamArrays {
  float* params = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  const void* grad = nullptr;
  optim::DType grad_dtype = optim::DType::kF32;
  void* copy = nullptr;  // nullptr: no 16-bit copy; otherwise copy_dtype is kBF16 or kF16
  optim::DType copy_dtype = optim::DType::kBF16;
  std::size_t n = 0;
};

// The per-step scalars exactly as optim::adam_step derives them (double, converted to float
// once). grad_scale is GradView::scale: 1 / (loss scale * clip factor).
optim::detail::AdamScalars adam_scalars(const optim::AdamParams& hp, std::int64_t step, double grad_scale);

// The checks optim::adam_step makes, with the same messages: step >= 1, hyperparameters,
// the gradient scale, null pointers, alignment, the copy dtype, overlapping ranges.
Status check_adam_step(const optim::AdamParams& hp, std::int64_t step, double grad_scale, const AdamArrays& a);

// One Adam step on the GPU, enqueued on `stream` (check_adam_step first).
Status adam_step(const optim::AdamParams& hp, std::int64_t step, double grad_scale, const AdamArrays& a,
                 cudaStream_t stream);

// The same per-element code run on the host over host arrays: what tests compare with
// optim::adam_step to show the GPU kernel's arithmetic is the CPU's.
Status adam_step_on_host(const optim::AdamParams& hp, std::int64_t step, double grad_scale, const AdamArrays& a);

namespace detail {

template <optim::DType G>
ZINF_HD float load_grad(const void* grad, std::size_t i) {
  if constexpr (G == optim::DType::kF32) {
    return static_cast<const float*>(grad)[i];
  } else if constexpr (G == optim::DType::kBF16) {
    return f32_from_bf16_bits(static_cast<const uint16_t*>(grad)[i]);
  } else {
    return optim::f16_bits_to_f32(static_cast<const uint16_t*>(grad)[i]);
  }
}

template <optim::DType C>
ZINF_HD void store_copy(void* copy, std::size_t i, float p) {
  if constexpr (C == optim::DType::kBF16) {
    static_cast<uint16_t*>(copy)[i] = bf16_bits_rne(p);
  } else if constexpr (C == optim::DType::kF16) {
    static_cast<uint16_t*>(copy)[i] = optim::f32_to_f16_bits(p);
  }
}

// Element i, in the operation order of optim/kernels.h (AdamScalars), each operation rounded
// on its own (mul_rn/add_rn...: no fused multiply-add), as the scalar CPU kernel built with
// -ffp-contract=off computes it. C == kF32 means no copy.
template <optim::DType G, optim::DType C, optim::detail::Decay D>
ZINF_HD void adam_update(const optim::detail::AdamScalars& s, const AdamArrays& a, std::size_t i) {
  using optim::detail::Decay;
  float g = mul_rn(load_grad<G>(a.grad, i), s.grad_scale);
  float p = a.params[i];
  if constexpr (D == Decay::kL2) g = add_rn(g, mul_rn(s.l2_decay, p));
  const float m = add_rn(mul_rn(s.beta1, a.exp_avg[i]), mul_rn(s.one_minus_beta1, g));
  const float v = add_rn(mul_rn(s.beta2, a.exp_avg_sq[i]), mul_rn(s.one_minus_beta2, mul_rn(g, g)));
  const float denom = add_rn(mul_rn(sqrt_rn(v), s.rsqrt_bc2), s.eps);
  if constexpr (D == Decay::kDecoupled) p = add_rn(p, mul_rn(s.decoupled_decay, p));
  p = add_rn(p, mul_rn(s.neg_step_size, div_rn(m, denom)));
  a.params[i] = p;
  a.exp_avg[i] = m;
  a.exp_avg_sq[i] = v;
  if constexpr (C != optim::DType::kF32) store_copy<C>(a.copy, i, p);
}

// Calls fn.template operator()<G, C, D>() for the arrays' dtypes and the decay mode.
template <typename Fn>
void with_adam_types(const AdamArrays& a, optim::detail::Decay decay, Fn&& fn) {
  using optim::DType;
  using optim::detail::Decay;
  optim::detail::with_dtypes(a, [&]<DType G, DType C>() {
    optim::detail::with_decay(decay, [&]<Decay D>() { fn.template operator()<G, C, D>(); });
  });
}

}  // namespace detail
}  // namespace zinf::gpu
