// The optimizer block of ds_config.json: type and params, with the reference's names and defaults.
#include <algorithm>
#include <cctype>
#include <string>

#include <fmt/format.h>

#include "optim/param_reader.h"
#include "zinf/log.h"
#include "zinf/optim/optimizer.h"

namespace zinf::optim {
namespace {

using detail::ParamReader;

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// Options the reference takes that zinf only accepts at the value it always uses.
Status read_fixed_options(ParamReader& r, bool has_amsgrad) {
  bool fp32_states = true;
  ZINF_RETURN_IF_ERROR(r.boolean("fp32_optimizer_states", &fp32_states));
  if (!fp32_states) {
    return r.error("fp32_optimizer_states", "only fp32 optimizer states are supported");
  }
  if (has_amsgrad) {
    bool amsgrad = false;
    ZINF_RETURN_IF_ERROR(r.boolean("amsgrad", &amsgrad));
    if (amsgrad) return r.error("amsgrad", "amsgrad is not supported");
  }
  return Status::ok();
}

Result<AdamParams> parse_adam(bool adamw_type, const ParamMap& params) {
  ParamReader r("optimizer.params", adamw_type ? "AdamW" : "Adam", params);
  AdamParams hp;
  ZINF_RETURN_IF_ERROR(r.number("lr", &hp.lr));
  ZINF_RETURN_IF_ERROR(r.pair("betas", &hp.beta1, &hp.beta2));
  ZINF_RETURN_IF_ERROR(r.number("eps", &hp.eps));
  ZINF_RETURN_IF_ERROR(r.number("weight_decay", &hp.weight_decay));
  ZINF_RETURN_IF_ERROR(r.boolean("bias_correction", &hp.bias_correction));
  ZINF_RETURN_IF_ERROR(r.boolean("adam_w_mode", &hp.adam_w_mode));
  bool torch_adam = false;
  ZINF_RETURN_IF_ERROR(r.boolean("torch_adam", &torch_adam));
  ZINF_RETURN_IF_ERROR(read_fixed_options(r, true));
  ZINF_RETURN_IF_ERROR(r.finish());
  if (torch_adam) {
    log_once(LogLevel::kNotice, "optimizer.params.torch_adam",
             "optimizer.params.torch_adam has no effect: zinf always runs its own CPU Adam");
  }
  if (adamw_type && !hp.adam_w_mode) {
    // The reference runs AdamW for type AdamW whatever adam_w_mode says.
    log_once(LogLevel::kWarning, "optimizer.params.adam_w_mode",
             "optimizer.params.adam_w_mode: false is ignored for type AdamW (decoupled weight decay is used)");
  }
  hp.adam_w_mode = adamw_type || hp.adam_w_mode;
  return hp;
}

Result<AdagradParams> parse_adagrad(const ParamMap& params) {
  ParamReader r("optimizer.params", "Adagrad", params);
  AdagradParams hp;
  ZINF_RETURN_IF_ERROR(r.number("lr", &hp.lr));
  ZINF_RETURN_IF_ERROR(r.number("eps", &hp.eps));
  ZINF_RETURN_IF_ERROR(r.number("weight_decay", &hp.weight_decay));
  ZINF_RETURN_IF_ERROR(read_fixed_options(r, true));
  ZINF_RETURN_IF_ERROR(r.finish());
  return hp;
}

Result<LionParams> parse_lion(const ParamMap& params) {
  ParamReader r("optimizer.params", "Lion", params);
  LionParams hp;
  ZINF_RETURN_IF_ERROR(r.number("lr", &hp.lr));
  ZINF_RETURN_IF_ERROR(r.pair("betas", &hp.beta1, &hp.beta2));
  ZINF_RETURN_IF_ERROR(r.number("weight_decay", &hp.weight_decay));
  ZINF_RETURN_IF_ERROR(read_fixed_options(r, false));
  ZINF_RETURN_IF_ERROR(r.finish());
  return hp;
}

// The ranges torch checks, with the key that is wrong.
Status check_ranges(double lr, double eps, double weight_decay, double beta1, double beta2) {
  if (lr < 0.0) return Status::invalid_argument(fmt::format("optimizer.params.lr: invalid learning rate {}", lr));
  if (eps < 0.0) return Status::invalid_argument(fmt::format("optimizer.params.eps: invalid epsilon {}", eps));
  if (weight_decay < 0.0) {
    return Status::invalid_argument(fmt::format("optimizer.params.weight_decay: invalid weight decay {}", weight_decay));
  }
  if (!(beta1 >= 0.0 && beta1 < 1.0) || !(beta2 >= 0.0 && beta2 < 1.0)) {
    return Status::invalid_argument(
        fmt::format("optimizer.params.betas: [{}, {}] must both be in [0, 1)", beta1, beta2));
  }
  return Status::ok();
}

}  // namespace

Result<OptimizerConfig> OptimizerConfig::parse(std::string_view type, const ParamMap& params) {
  const std::string t = lower(type);
  OptimizerConfig config;
  if (t == "adam" || t == "adamw") {
    ZINF_ASSIGN_OR_RETURN(AdamParams hp, parse_adam(t == "adamw", params));
    ZINF_RETURN_IF_ERROR(check_ranges(hp.lr, hp.eps, hp.weight_decay, hp.beta1, hp.beta2));
    config.params = hp;
  } else if (t == "adagrad") {
    ZINF_ASSIGN_OR_RETURN(AdagradParams hp, parse_adagrad(params));
    ZINF_RETURN_IF_ERROR(check_ranges(hp.lr, hp.eps, hp.weight_decay, 0.0, 0.0));
    config.params = hp;
  } else if (t == "lion") {
    ZINF_ASSIGN_OR_RETURN(LionParams hp, parse_lion(params));
    ZINF_RETURN_IF_ERROR(check_ranges(hp.lr, 0.0, hp.weight_decay, hp.beta1, hp.beta2));
    config.params = hp;
  } else {
    return Status::unsupported(
        fmt::format("optimizer.type: '{}' is not supported by zinf's CPU optimizers (supported: Adam, AdamW, "
                    "Adagrad, Lion)",
                    type));
  }
  return config;
}

double OptimizerConfig::lr() const {
  return std::visit([](const auto& hp) { return hp.lr; }, params);
}

std::string_view OptimizerConfig::name() const {
  switch (kind()) {
    case OptimizerKind::kAdam: return std::get<AdamParams>(params).adam_w_mode ? "AdamW" : "Adam";
    case OptimizerKind::kAdagrad: return "Adagrad";
    case OptimizerKind::kLion: return "Lion";
  }
  return "?";
}

}  // namespace zinf::optim
