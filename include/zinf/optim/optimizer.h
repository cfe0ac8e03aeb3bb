// CPU optimizers (Adam/AdamW, Adagrad, Lion) over flat fp32 spans, with the 16-bit parameter
// copy and the gradient unscaling fused into the same pass.
//
// Ownership: every span and view is owned by the caller (the swap layer hands in one
// sub-group at a time); nothing is kept between calls. Spans may have any length and any
// alignment, must not overlap one another, and must all have the same length.
// Threading: a call spreads its work over exec.pool and returns when it is done. Different
// calls may run concurrently on disjoint spans. Results are bit-identical whatever the ISA
// and the thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "zinf/optim/dtype.h"
#include "zinf/optim/isa.h"
#include "zinf/optim/params.h"
#include "zinf/status.h"

namespace zinf::optim {

// Gradients as stored, read-only. Each element is read as fp32 and multiplied by `scale`
// (converted to float once) before use: pass 1 / (loss scale * clip factor) here, see
// clipping.h, so that unscaling and clipping cost no extra pass. `size` counts elements.
struct GradView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  std::size_t size = 0;
  double scale = 1.0;
};

// Where to write the 16-bit copy of the updated parameters (params.size() elements of
// `dtype`, which must be kBF16 or kF16). data == nullptr: no copy.
struct HalfCopy {
  void* data = nullptr;
  DType dtype = DType::kBF16;
};

// Hyperparameters of one step. lr and beta1 may change from step to step (schedules,
// OneCycle momentum); the step count t starts at 1.
struct AdamParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
  bool adam_w_mode = true;  // true: decoupled decay (AdamW); false: L2 decay added to the gradient
};

struct AdagradParams {
  double lr = 1e-2;
  double eps = 1e-10;
  double weight_decay = 0.0;
};

// DeepSpeed's DeepSpeedCPULion defaults (lr 1e-3, betas (0.9, 0.999), weight_decay 0); the
// ds_config reader takes its defaults from these structs.
struct LionParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double weight_decay = 0.0;
};

// One Adam step at step count `step` (>= 1) over params / exp_avg / exp_avg_sq (updated in place).
Status adam_step(const AdamParams& hp, std::int64_t step, std::span<float> params,
                 std::span<float> exp_avg, std::span<float> exp_avg_sq, GradView grad,
                 HalfCopy copy = {}, const ExecOptions& exec = {});

// One Adagrad step (torch semantics: g' = g + wd * p in the accumulator and the numerator).
Status adagrad_step(const AdagradParams& hp, std::span<float> params, std::span<float> sum_sq,
                    GradView grad, HalfCopy copy = {}, const ExecOptions& exec = {});

// One Lion step.
Status lion_step(const LionParams& hp, std::span<float> params, std::span<float> exp_avg,
                 GradView grad, HalfCopy copy = {}, const ExecOptions& exec = {});

// ---- configuration ------------------------------------------------------------------------

enum class OptimizerKind { kAdam, kAdagrad, kLion };

// The optimizer block of ds_config.json. Types (case-insensitive): "Adam" (AdamW unless
// adam_w_mode is false), "AdamW", "Adagrad", "Lion". Known params per type, reference defaults:
//   Adam/AdamW: lr, betas, eps, weight_decay, bias_correction, adam_w_mode, amsgrad (false
//               only), torch_adam (no effect), fp32_optimizer_states (true only)
//   Adagrad:    lr, eps, weight_decay, amsgrad (false only), fp32_optimizer_states (true only)
//   Lion:       lr, betas, weight_decay, fp32_optimizer_states (true only)
// Anything else is an error naming the key, e.g. "optimizer.params.amsgrad: amsgrad is not supported".
struct OptimizerConfig {
  std::variant<AdamParams, AdagradParams, LionParams> params;

  static Result<OptimizerConfig> parse(std::string_view type, const ParamMap& params);
  OptimizerKind kind() const { return static_cast<OptimizerKind>(params.index()); }
  double lr() const;
  std::string_view name() const;  // "Adam", "AdamW", "Adagrad", "Lion"
};

// What changes from one step to the next.
struct StepContext {
  std::int64_t step = 1;          // t, from 1
  std::optional<double> lr;       // unset: the configured lr
  std::optional<double> beta1;    // unset: the configured beta1 (ignored by Adagrad)
};

// A configured optimizer that the swap layer can drive without knowing which one it is.
class Optimizer {
 public:
  explicit Optimizer(OptimizerConfig config) : config_(std::move(config)) {}

  const OptimizerConfig& config() const { return config_; }
  // Optimizer state tensors per parameter tensor, each the size of the parameters, in the
  // order step() takes them: Adam {exp_avg, exp_avg_sq}; Adagrad {sum_sq}; Lion {exp_avg}.
  std::size_t state_count() const;
  std::string_view state_name(std::size_t i) const;

  // One step; `state` holds state_count() spans. New state must be zero-filled.
  Status step(const StepContext& ctx, std::span<float> params, std::span<const std::span<float>> state,
              GradView grad, HalfCopy copy = {}, const ExecOptions& exec = {}) const;

 private:
  OptimizerConfig config_;
};

}  // namespace zinf::optim
