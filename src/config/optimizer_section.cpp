// optimizer and scheduler blocks: type names, per-type params with defaults, "auto" from the command line.
#include <algorithm>
#include <cctype>

#include "config/known_keys.h"
#include "config/param_table.h"
#include "config/sections.h"
#include "zinf/optim/optimizer.h"

namespace zinf::config::detail {

namespace {

constexpr NumberRange kNonNegativeNumber{0.0};
constexpr NumberRange kPositiveNumber{0.0, kInf, /*min_exclusive=*/true};
constexpr NumberRange kBetaRange{0.0, 1.0, false, /*max_exclusive=*/true};
constexpr NumberRange kUnit{0.0, 1.0};
constexpr NumberRange kSteps{0.0};
constexpr NumberRange kPositiveSteps{1.0};
constexpr NumberRange kLastIteration{-1.0};

using K = ParamKind;
using S = ParamSource;
using P = Presence;

// The defaults are optim's (one schema: the reference's values, kept in include/zinf/optim/optimizer.h).
constexpr optim::AdamParams kAdam{};
constexpr optim::AdagradParams kAdagrad{};
constexpr optim::LionParams kLion{};

// torch options that change the math zinf does not implement, and ones with no effect here.
constexpr ParamSpec kAdamParams[] = {
    {"lr", K::kNumber, P::kDefault, kAdam.lr, 0, S::kLr, kNonNegativeNumber},
    {"betas", K::kBetas, P::kDefault, kAdam.beta1, kAdam.beta2, S::kBetas, kBetaRange},
    {"eps", K::kNumber, P::kDefault, kAdam.eps, 0, S::kEps, kPositiveNumber},
    {"weight_decay", K::kNumber, P::kDefault, kAdam.weight_decay, 0, S::kWeightDecay, kNonNegativeNumber},
    {"bias_correction", K::kBool, P::kDefault, 1.0},
    {"adam_w_mode", K::kBool, P::kDefault, 1.0},
    {"amsgrad", K::kMustBeFalse},
    {"maximize", K::kMustBeFalse},
    {"torch_adam", K::kIgnored},
    {"fused", K::kIgnored},
    {"foreach", K::kIgnored},
    {"capturable", K::kIgnored},
    {"differentiable", K::kIgnored},
};

constexpr ParamSpec kAdagradParams[] = {
    {"lr", K::kNumber, P::kDefault, kAdagrad.lr, 0, S::kLr, kNonNegativeNumber},
    {"eps", K::kNumber, P::kDefault, kAdagrad.eps, 0, S::kEps, kPositiveNumber},
    {"weight_decay", K::kNumber, P::kDefault, kAdagrad.weight_decay, 0, S::kWeightDecay, kNonNegativeNumber},
    {"lr_decay", K::kMustBeZero},
    {"initial_accumulator_value", K::kMustBeZero},
    {"maximize", K::kMustBeFalse},
    {"foreach", K::kIgnored},
    {"differentiable", K::kIgnored},
    {"fused", K::kIgnored},
};

constexpr ParamSpec kLionParams[] = {
    {"lr", K::kNumber, P::kDefault, kLion.lr, 0, S::kLr, kNonNegativeNumber},
    {"betas", K::kBetas, P::kDefault, kLion.beta1, kLion.beta2, S::kBetas, kBetaRange},
    {"weight_decay", K::kNumber, P::kDefault, kLion.weight_decay, 0, S::kWeightDecay, kNonNegativeNumber},
};

constexpr ParamSpec kWarmupParams[] = {
    {"warmup_min_lr", K::kNumber, P::kDefault, 0.0, 0, S::kZero, kNonNegativeNumber},
    {"warmup_max_lr", K::kNumber, P::kDefault, 1e-3, 0, S::kLr, kNonNegativeNumber},
    {"warmup_num_steps", K::kInt, P::kDefault, 1000, 0, S::kWarmupSteps, kSteps},
    {"warmup_type", K::kWarmupType, P::kDefault, 0, 0, S::kNone, {}, "log"},
    {"last_batch_iteration", K::kInt, P::kDefault, -1, 0, S::kNone, kLastIteration},
};

constexpr ParamSpec kWarmupDecayParams[] = {
    {"total_num_steps", K::kInt, P::kRequired, 0, 0, S::kTotalSteps, kPositiveSteps},
    {"warmup_min_lr", K::kNumber, P::kDefault, 0.0, 0, S::kZero, kNonNegativeNumber},
    {"warmup_max_lr", K::kNumber, P::kDefault, 1e-3, 0, S::kLr, kNonNegativeNumber},
    {"warmup_num_steps", K::kInt, P::kDefault, 1000, 0, S::kWarmupSteps, kSteps},
    {"warmup_type", K::kWarmupType, P::kDefault, 0, 0, S::kNone, {}, "log"},
    {"last_batch_iteration", K::kInt, P::kDefault, -1, 0, S::kNone, kLastIteration},
};

constexpr ParamSpec kWarmupCosineParams[] = {
    {"total_num_steps", K::kInt, P::kRequired, 0, 0, S::kTotalSteps, kPositiveSteps},
    {"warmup_min_ratio", K::kNumber, P::kDefault, 0.0, 0, S::kNone, kUnit},
    {"warmup_num_steps", K::kInt, P::kDefault, 1000, 0, S::kWarmupSteps, kSteps},
    {"cos_min_ratio", K::kNumber, P::kDefault, 1e-4, 0, S::kNone, kUnit},
    {"warmup_type", K::kWarmupType, P::kDefault, 0, 0, S::kNone, {}, "log"},
    {"last_batch_iteration", K::kInt, P::kDefault, -1, 0, S::kNone, kLastIteration},
};

constexpr ParamSpec kOneCycleParams[] = {
    {"cycle_min_lr", K::kNumber, P::kRequired, 0, 0, S::kNone, kNonNegativeNumber},
    {"cycle_max_lr", K::kNumber, P::kRequired, 0, 0, S::kNone, kNonNegativeNumber},
    {"decay_lr_rate", K::kNumber, P::kDefault, 0.0, 0, S::kNone, kNonNegativeNumber},
    {"cycle_first_step_size", K::kInt, P::kDefault, 2000, 0, S::kNone, kPositiveSteps},
    {"cycle_second_step_size", K::kInt, P::kOptional, 0, 0, S::kNone, kPositiveSteps},
    {"cycle_first_stair_count", K::kInt, P::kDefault, 0, 0, S::kNone, kSteps},
    {"cycle_second_stair_count", K::kInt, P::kOptional, 0, 0, S::kNone, kSteps},
    {"decay_step_size", K::kInt, P::kDefault, 0, 0, S::kNone, kSteps},
    {"cycle_momentum", K::kBool, P::kDefault, 1.0},
    {"cycle_min_mom", K::kNumber, P::kDefault, 0.8, 0, S::kNone, kUnit},
    {"cycle_max_mom", K::kNumber, P::kDefault, 0.9, 0, S::kNone, kUnit},
    {"decay_mom_rate", K::kNumber, P::kDefault, 0.0, 0, S::kNone, kNonNegativeNumber},
    {"last_batch_iteration", K::kInt, P::kDefault, -1, 0, S::kNone, kLastIteration},
};

constexpr ParamSpec kRangeTestParams[] = {
    {"lr_range_test_min_lr", K::kNumber, P::kDefault, 1e-3, 0, S::kNone, kNonNegativeNumber},
    {"lr_range_test_step_size", K::kInt, P::kDefault, 2000, 0, S::kNone, kPositiveSteps},
    {"lr_range_test_step_rate", K::kNumber, P::kDefault, 1.0, 0, S::kNone, kNonNegativeNumber},
    {"lr_range_test_staircase", K::kBool, P::kDefault, 0.0},
    {"last_batch_iteration", K::kInt, P::kDefault, -1, 0, S::kNone, kLastIteration},
};

struct TypeEntry {
  std::string_view name;
  std::span<const ParamSpec> params;
};

constexpr TypeEntry kOptimizers[] = {
    {"Adam", kAdamParams}, {"AdamW", kAdamParams}, {"Adagrad", kAdagradParams}, {"Lion", kLionParams},
};
// Names the reference accepts that zinf does not implement (any torch.optim class is also
// accepted there).
constexpr std::string_view kReferenceOnlyOptimizers[] = {
    "Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb", "MuAdam", "MuAdamW", "MuSGD", "Muon",
};

constexpr TypeEntry kSchedulers[] = {
    {"WarmupLR", kWarmupParams},         {"WarmupDecayLR", kWarmupDecayParams},
    {"WarmupCosineLR", kWarmupCosineParams}, {"OneCycle", kOneCycleParams},
    {"LRRangeTest", kRangeTestParams},
};

bool iequal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// The canonical entry for a type name (case-insensitive, as the reference lowercases names).
Result<const TypeEntry*> find_type(ObjectReader& r, std::span<const TypeEntry> entries,
                                   std::span<const std::string_view> reference_only,
                                   std::string_view what) {
  ZINF_ASSIGN_OR_RETURN(auto type, r.string("type"));
  if (!type.present) return r.error("type", fmt::format("required: the {} name", what));
  if (type.is_auto) return r.error("type", fmt::format("cannot be \"auto\"; name the {}", what));
  std::vector<std::string> names;
  for (const TypeEntry& e : entries) {
    if (iequal(e.name, type.value)) return &e;
    names.emplace_back(e.name);
  }
  std::string offered = fmt::format("zinf implements {}", fmt::join(names, ", "));
  for (std::string_view ref : reference_only) {
    if (iequal(ref, type.value)) {
      return r.error("type", fmt::format("zinf does not implement the {} \"{}\"; {}", what,
                                         type.value, offered));
    }
  }
  std::optional<std::string> near = closest_match(type.value, names);
  if (near) {
    return r.error("type", fmt::format("unknown {} \"{}\"; did you mean \"{}\"?", what,
                                       type.value, *near));
  }
  return r.error("type", fmt::format("unknown {} \"{}\" (the reference would look it up in torch, "
                                     "which zinf cannot); {}",
                                     what, type.value, offered));
}

}  // namespace

Status parse_optimizer(ParseState& st, const Json* obj, std::optional<OptimizerSection>* out) {
  if (obj == nullptr) return Status::ok();
  ObjectReader r(st, obj, "optimizer");
  ZINF_ASSIGN_OR_RETURN(const TypeEntry* type,
                        find_type(r, kOptimizers, kReferenceOnlyOptimizers, "optimizer"));
  ZINF_ASSIGN_OR_RETURN(const Json* params_obj, r.object("params"));
  r.ignore(ignored_optimizer_keys());
  ZINF_RETURN_IF_ERROR(r.finish());

  OptimizerSection section;
  section.type = std::string(type->name);
  ObjectReader p(st, params_obj, "optimizer.params");
  ZINF_RETURN_IF_ERROR(read_params(st, p, type->params, type->name, &section.params));
  if (p.has("max_grad_norm")) {
    st.warn(p.key_path("max_grad_norm"), "is not an optimizer parameter in DeepSpeed or zinf and "
                                         "is ignored; use gradient_clipping");
  }
  ZINF_RETURN_IF_ERROR(p.finish());
  if (section.type == "AdamW" && section.params.boolean("adam_w_mode") == false) {
    return st.error("optimizer.params.adam_w_mode",
                    "is false, but the type \"AdamW\" always decouples weight decay; use "
                    "\"type\": \"Adam\" for L2 mode");
  }
  *out = std::move(section);
  return Status::ok();
}

Status parse_scheduler(ParseState& st, const Json* obj, std::optional<SchedulerSection>* out) {
  if (obj == nullptr) return Status::ok();
  ObjectReader r(st, obj, "scheduler");
  ZINF_ASSIGN_OR_RETURN(const TypeEntry* type, find_type(r, kSchedulers, {}, "scheduler"));
  ZINF_ASSIGN_OR_RETURN(const Json* params_obj, r.object("params"));
  ZINF_RETURN_IF_ERROR(r.finish());

  SchedulerSection section;
  section.type = std::string(type->name);
  ObjectReader p(st, params_obj, "scheduler.params");
  ZINF_RETURN_IF_ERROR(read_params(st, p, type->params, type->name, &section.params));
  ZINF_RETURN_IF_ERROR(p.finish());
  if (section.type == "OneCycle" &&
      *section.params.number("cycle_max_lr") < *section.params.number("cycle_min_lr")) {
    return st.error("scheduler.params.cycle_max_lr", "is below cycle_min_lr");
  }
  *out = std::move(section);
  return Status::ok();
}

}  // namespace zinf::config::detail
