// Optimizer steps: argument checks, per-step scalars in double, and the threaded kernel call.
#include "zinf/optim/optimizer.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>

#include <fmt/format.h>

#include "optim/adam_args.h"
#include "optim/exec.h"
#include "optim/kernels.h"

namespace zinf::optim {
namespace {

using detail::StepArrays;

struct Extent {
  const void* data;
  std::size_t bytes;
  std::string_view name;
};

Status check_disjoint(std::string_view op, std::initializer_list<Extent> extents) {
  for (auto a = extents.begin(); a != extents.end(); ++a) {
    for (auto b = a + 1; b != extents.end(); ++b) {
      if (a->bytes == 0 || b->bytes == 0) continue;
      const auto a0 = reinterpret_cast<std::uintptr_t>(a->data);
      const auto b0 = reinterpret_cast<std::uintptr_t>(b->data);
      if (a0 < b0 + b->bytes && b0 < a0 + a->bytes) {
        return Status::invalid_argument(fmt::format("{}: {} and {} overlap", op, a->name, b->name));
      }
    }
  }
  return Status::ok();
}

// Sizes, null pointers, element alignment, the copy dtype and the gradient scale.
Status check_views(std::string_view op, std::size_t n, std::initializer_list<std::span<float>> states,
                   const GradView& grad, const HalfCopy& copy) {
  for (const std::span<float>& s : states) {
    if (s.size() != n) {
      return Status::invalid_argument(
          fmt::format("{}: optimizer state has {} elements but the parameters have {}", op, s.size(), n));
    }
    if (n > 0 && s.data() == nullptr) return Status::invalid_argument(fmt::format("{}: null state", op));
  }
  if (grad.size != n) {
    return Status::invalid_argument(
        fmt::format("{}: gradient has {} elements but the parameters have {}", op, grad.size, n));
  }
  if (n > 0 && grad.data == nullptr) return Status::invalid_argument(fmt::format("{}: null gradient", op));
  if (reinterpret_cast<std::uintptr_t>(grad.data) % dtype_size(grad.dtype) != 0) {
    return Status::invalid_argument(fmt::format("{}: {} gradient at {} is not aligned to its element size", op,
                                                dtype_name(grad.dtype), grad.data));
  }
  const float scale = static_cast<float>(grad.scale);
  if (!std::isfinite(scale) || scale == 0.0f) {
    return Status::invalid_argument(fmt::format("{}: gradient scale {} is not a finite non-zero float", op, grad.scale));
  }
  if (copy.data != nullptr) {
    if (copy.dtype == DType::kF32) {
      return Status::invalid_argument(fmt::format("{}: the parameter copy must be bf16 or fp16", op));
    }
    if (reinterpret_cast<std::uintptr_t>(copy.data) % 2 != 0) {
      return Status::invalid_argument(fmt::format("{}: 16-bit copy at {} is not 2-byte aligned", op, copy.data));
    }
  }
  return Status::ok();
}

Status check_hyper(std::string_view op, double lr, double weight_decay, std::initializer_list<double> betas) {
  if (!std::isfinite(lr) || lr < 0.0) return Status::invalid_argument(fmt::format("{}: invalid lr {}", op, lr));
  if (!std::isfinite(weight_decay) || weight_decay < 0.0) {
    return Status::invalid_argument(fmt::format("{}: invalid weight_decay {}", op, weight_decay));
  }
  for (double b : betas) {
    if (!(b >= 0.0 && b < 1.0)) return Status::invalid_argument(fmt::format("{}: invalid beta {} (need 0 <= beta < 1)", op, b));
  }
  return Status::ok();
}

StepArrays make_arrays(std::span<float> params, float* state1, float* state2, const GradView& grad,
                       const HalfCopy& copy) {
  return StepArrays{params.data(), state1, state2, grad.data, grad.dtype, copy.data, copy.dtype};
}

std::size_t copy_bytes(const HalfCopy& copy, std::size_t n) { return copy.data == nullptr ? 0 : 2 * n; }

}  // namespace

namespace detail {

Status check_adam_args(std::string_view op, const AdamParams& hp, std::int64_t step, std::span<float> params,
                       std::span<float> exp_avg, std::span<float> exp_avg_sq, const GradView& grad,
                       const HalfCopy& copy) {
  const std::size_t n = params.size();
  if (step < 1) return Status::invalid_argument(fmt::format("{}: step {} (steps count from 1)", op, step));
  ZINF_RETURN_IF_ERROR(check_hyper(op, hp.lr, hp.weight_decay, {hp.beta1, hp.beta2}));
  if (!std::isfinite(hp.eps) || hp.eps < 0.0) return Status::invalid_argument(fmt::format("{}: invalid eps {}", op, hp.eps));
  ZINF_RETURN_IF_ERROR(check_views(op, n, {exp_avg, exp_avg_sq}, grad, copy));
  return check_disjoint(op, {{params.data(), 4 * n, "params"},
                             {exp_avg.data(), 4 * n, "exp_avg"},
                             {exp_avg_sq.data(), 4 * n, "exp_avg_sq"},
                             {grad.data, dtype_size(grad.dtype) * n, "grad"},
                             {copy.data, copy_bytes(copy, n), "copy"}});
}

AdamScalars adam_scalars(const AdamParams& hp, std::int64_t step, double grad_scale) {
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

}  // namespace detail

Status adam_step(const AdamParams& hp, std::int64_t step, std::span<float> params, std::span<float> exp_avg,
                 std::span<float> exp_avg_sq, GradView grad, HalfCopy copy, const ExecOptions& exec) {
  ZINF_RETURN_IF_ERROR(detail::check_adam_args("adam_step", hp, step, params, exp_avg, exp_avg_sq, grad, copy));
  ZINF_ASSIGN_OR_RETURN(const detail::KernelTable* kernels, detail::resolve_kernels(exec));
  const detail::AdamScalars s = detail::adam_scalars(hp, step, grad.scale);
  const StepArrays arrays = make_arrays(params, exp_avg.data(), exp_avg_sq.data(), grad, copy);
  detail::parallel_ranges(exec, params.size(), 16,
                          [&](std::size_t b, std::size_t e) { kernels->adam(s, arrays, b, e); });
  return Status::ok();
}

Status adagrad_step(const AdagradParams& hp, std::span<float> params, std::span<float> sum_sq, GradView grad,
                    HalfCopy copy, const ExecOptions& exec) {
  constexpr std::string_view kOp = "adagrad_step";
  const std::size_t n = params.size();
  ZINF_RETURN_IF_ERROR(check_hyper(kOp, hp.lr, hp.weight_decay, {}));
  if (!std::isfinite(hp.eps) || hp.eps < 0.0) return Status::invalid_argument(fmt::format("{}: invalid eps {}", kOp, hp.eps));
  ZINF_RETURN_IF_ERROR(check_views(kOp, n, {sum_sq}, grad, copy));
  ZINF_RETURN_IF_ERROR(check_disjoint(kOp, {{params.data(), 4 * n, "params"},
                                            {sum_sq.data(), 4 * n, "sum_sq"},
                                            {grad.data, dtype_size(grad.dtype) * n, "grad"},
                                            {copy.data, copy_bytes(copy, n), "copy"}}));
  ZINF_ASSIGN_OR_RETURN(const detail::KernelTable* kernels, detail::resolve_kernels(exec));

  detail::AdagradScalars s{};
  s.eps = static_cast<float>(hp.eps);
  s.neg_lr = static_cast<float>(-hp.lr);
  s.weight_decay = static_cast<float>(hp.weight_decay);
  s.grad_scale = static_cast<float>(grad.scale);
  s.decay = hp.weight_decay > 0.0;

  const StepArrays arrays = make_arrays(params, sum_sq.data(), nullptr, grad, copy);
  detail::parallel_ranges(exec, n, 16, [&](std::size_t b, std::size_t e) { kernels->adagrad(s, arrays, b, e); });
  return Status::ok();
}

Status lion_step(const LionParams& hp, std::span<float> params, std::span<float> exp_avg, GradView grad,
                 HalfCopy copy, const ExecOptions& exec) {
  constexpr std::string_view kOp = "lion_step";
  const std::size_t n = params.size();
  ZINF_RETURN_IF_ERROR(check_hyper(kOp, hp.lr, hp.weight_decay, {hp.beta1, hp.beta2}));
  ZINF_RETURN_IF_ERROR(check_views(kOp, n, {exp_avg}, grad, copy));
  ZINF_RETURN_IF_ERROR(check_disjoint(kOp, {{params.data(), 4 * n, "params"},
                                            {exp_avg.data(), 4 * n, "exp_avg"},
                                            {grad.data, dtype_size(grad.dtype) * n, "grad"},
                                            {copy.data, copy_bytes(copy, n), "copy"}}));
  ZINF_ASSIGN_OR_RETURN(const detail::KernelTable* kernels, detail::resolve_kernels(exec));

  detail::LionScalars s{};
  s.beta1 = static_cast<float>(hp.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - hp.beta1);
  s.beta2 = static_cast<float>(hp.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - hp.beta2);
  s.neg_lr = static_cast<float>(-hp.lr);
  s.decay_factor = static_cast<float>(1.0 - hp.lr * hp.weight_decay);
  s.grad_scale = static_cast<float>(grad.scale);

  const StepArrays arrays = make_arrays(params, exp_avg.data(), nullptr, grad, copy);
  detail::parallel_ranges(exec, n, 16, [&](std::size_t b, std::size_t e) { kernels->lion(s, arrays, b, e); });
  return Status::ok();
}

std::size_t Optimizer::state_count() const {
  return config_.kind() == OptimizerKind::kAdam ? 2 : 1;
}

std::string_view Optimizer::state_name(std::size_t i) const {
  switch (config_.kind()) {
    case OptimizerKind::kAdam: return i == 0 ? "exp_avg" : "exp_avg_sq";
    case OptimizerKind::kAdagrad: return "sum_sq";
    case OptimizerKind::kLion: return "exp_avg";
  }
  return "?";
}

Status Optimizer::step(const StepContext& ctx, std::span<float> params, std::span<const std::span<float>> state,
                       GradView grad, HalfCopy copy, const ExecOptions& exec) const {
  if (state.size() != state_count()) {
    return Status::invalid_argument(fmt::format("{} step: {} state tensors given, {} expected", config_.name(),
                                                state.size(), state_count()));
  }
  switch (config_.kind()) {
    case OptimizerKind::kAdam: {
      AdamParams hp = std::get<AdamParams>(config_.params);
      hp.lr = ctx.lr.value_or(hp.lr);
      hp.beta1 = ctx.beta1.value_or(hp.beta1);
      return adam_step(hp, ctx.step, params, state[0], state[1], grad, copy, exec);
    }
    case OptimizerKind::kAdagrad: {
      AdagradParams hp = std::get<AdagradParams>(config_.params);
      hp.lr = ctx.lr.value_or(hp.lr);
      return adagrad_step(hp, params, state[0], grad, copy, exec);
    }
    case OptimizerKind::kLion: {
      LionParams hp = std::get<LionParams>(config_.params);
      hp.lr = ctx.lr.value_or(hp.lr);
      hp.beta1 = ctx.beta1.value_or(hp.beta1);
      return lion_step(hp, params, state[0], grad, copy, exec);
    }
  }
  return Status::internal("unknown optimizer kind");
}

}  // namespace zinf::optim
