// Host side of the fused GPU Adam: the per-step scalars, the argument checks, and the host run
// of the same per-element code that tests hold against optim::adam_step.
#include <fmt/format.h>

#include <cmath>
#include <initializer_list>

#include "gpu/adam.h"

namespace zinf::gpu {

using optim::detail::AdamScalars;
using optim::detail::Decay;

AdamScalars adam_scalars(const optim::AdamParams& hp, std::int64_t step, double grad_scale) {
  // As optim::adam_step (optimizer.cpp); tests compare the two bit for bit.
  const double t = static_cast<double>(step);
  const double bc1 = hp.bias_correction ? 1.0 - std::pow(hp.beta1, t) : 1.0;
  const double bc2 = hp.bias_correction ? 1.0 - std::pow(hp.beta2, t) : 1.0;
  AdamScalars s{};
  s.beta1 = static_cast<float>(hp.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - hp.beta1);
  s.beta2 = static_cast<float>(hp.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - hp.beta2);
  s.eps = static_cast<float>(hp.eps);
  s.rsqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  s.neg_step_size = static_cast<float>(-hp.lr / bc1);
  s.l2_decay = static_cast<float>(hp.weight_decay);
  s.decoupled_decay = static_cast<float>(-hp.lr * hp.weight_decay);
  s.grad_scale = static_cast<float>(grad_scale);
  s.decay = hp.weight_decay > 0.0 ? (hp.adam_w_mode ? Decay::kDecoupled : Decay::kL2) : Decay::kNone;
  return s;
}

namespace {

struct Extent {
  const void* data;
  std::size_t bytes;
  const char* name;
};

Status check_disjoint(std::initializer_list<Extent> extents) {
  for (auto a = extents.begin(); a != extents.end(); ++a) {
    for (auto b = a + 1; b != extents.end(); ++b) {
      if (a->bytes == 0 || b->bytes == 0) continue;
      const auto a0 = reinterpret_cast<std::uintptr_t>(a->data);
      const auto b0 = reinterpret_cast<std::uintptr_t>(b->data);
      if (a0 < b0 + b->bytes && b0 < a0 + a->bytes) {
        return Status::invalid_argument(fmt::format("gpu adam_step: {} and {} overlap", a->name, b->name));
      }
    }
  }
  return Status::ok();
}

}  // namespace

Status check_adam_step(const optim::AdamParams& hp, std::int64_t step, double grad_scale, const AdamArrays& a) {
  constexpr std::string_view kOp = "gpu adam_step";
  if (step < 1) return Status::invalid_argument(fmt::format("{}: step {} (steps count from 1)", kOp, step));
  if (!std::isfinite(hp.lr) || hp.lr < 0.0) return Status::invalid_argument(fmt::format("{}: invalid lr {}", kOp, hp.lr));
  if (!std::isfinite(hp.weight_decay) || hp.weight_decay < 0.0) {
    return Status::invalid_argument(fmt::format("{}: invalid weight_decay {}", kOp, hp.weight_decay));
  }
  for (double b : {hp.beta1, hp.beta2}) {
    if (!(b >= 0.0 && b < 1.0)) return Status::invalid_argument(fmt::format("{}: invalid beta {} (need 0 <= beta < 1)", kOp, b));
  }
  if (!std::isfinite(hp.eps) || hp.eps < 0.0) return Status::invalid_argument(fmt::format("{}: invalid eps {}", kOp, hp.eps));
  const float scale = static_cast<float>(grad_scale);
  if (!std::isfinite(scale) || scale == 0.0f) {
    return Status::invalid_argument(fmt::format("{}: gradient scale {} is not a finite non-zero float", kOp, grad_scale));
  }
  const std::size_t n = a.n;
  if (n > 0 && (a.params == nullptr || a.exp_avg == nullptr || a.exp_avg_sq == nullptr || a.grad == nullptr)) {
    return Status::invalid_argument(fmt::format("{}: null params, state or gradient for {} elements", kOp, n));
  }
  if (reinterpret_cast<std::uintptr_t>(a.grad) % optim::dtype_size(a.grad_dtype) != 0) {
    return Status::invalid_argument(fmt::format("{}: {} gradient at {} is not aligned to its element size", kOp,
                                                optim::dtype_name(a.grad_dtype), a.grad));
  }
  for (const float* p : std::initializer_list<const float*>{a.params, a.exp_avg, a.exp_avg_sq}) {
    if (reinterpret_cast<std::uintptr_t>(p) % 4 != 0) {
      return Status::invalid_argument(fmt::format("{}: fp32 array at {} is not 4-byte aligned", kOp, static_cast<const void*>(p)));
    }
  }
  if (a.copy != nullptr) {
    if (a.copy_dtype == optim::DType::kF32) {
      return Status::invalid_argument(fmt::format("{}: the parameter copy must be bf16 or fp16", kOp));
    }
    if (reinterpret_cast<std::uintptr_t>(a.copy) % 2 != 0) {
      return Status::invalid_argument(fmt::format("{}: 16-bit copy at {} is not 2-byte aligned", kOp, a.copy));
    }
  }
  return check_disjoint({{a.params, 4 * n, "params"},
                         {a.exp_avg, 4 * n, "exp_avg"},
                         {a.exp_avg_sq, 4 * n, "exp_avg_sq"},
                         {a.grad, optim::dtype_size(a.grad_dtype) * n, "grad"},
                         {a.copy, a.copy == nullptr ? 0 : 2 * n, "copy"}});
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
