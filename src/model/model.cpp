// Model: the checks every implementation shares (layout contract, batch limits).
#include "zinf/model/model.h"

#include <fmt/format.h>

#include <climits>
#include <unordered_set>
#include <vector>

namespace zinf::model {

uint64_t Model::num_params() const {
  uint64_t n = 0;
  for (const ParamSpec& p : params()) n += p.numel;
  return n;
}

Status validate_layout(std::span<const ParamSpec> params, std::span<const ModuleSpec> modules) {
  if (params.empty()) return Status::invalid_argument("model layout: the model has no parameters");
  if (params.size() > INT_MAX || modules.size() > INT_MAX) {
    return Status::invalid_argument(fmt::format("model layout: {} parameters in {} modules is too many",
                                                params.size(), modules.size()));
  }
  std::unordered_set<std::string_view> names;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& p = params[i];
    const std::string where = fmt::format("model layout: parameter {} ('{}')", i, p.name);
    if (p.name.empty()) return Status::invalid_argument(where + " has no name");
    if (!names.insert(p.name).second) return Status::invalid_argument(where + ": the name is used twice");
    if (p.index != static_cast<int>(i)) {
      return Status::invalid_argument(fmt::format("{} has index {}, expected its position {}", where, p.index, i));
    }
    std::size_t numel = 1;
    for (int64_t d : p.shape) {
      if (d < 1 || numel > SIZE_MAX / static_cast<std::size_t>(d)) {
        return Status::invalid_argument(fmt::format("{}: shape dimension {} must be >= 1 (and the product fit)", where, d));
      }
      numel *= static_cast<std::size_t>(d);
    }
    if (p.shape.empty() || numel != p.numel) {
      return Status::invalid_argument(
          fmt::format("{}: numel {} is not the product of its shape ({} dimensions)", where, p.numel, p.shape.size()));
    }
    if (p.module < 0 || static_cast<std::size_t>(p.module) >= modules.size()) {
      return Status::invalid_argument(
          fmt::format("{}: owning module {} is not one of the {} modules", where, p.module, modules.size()));
    }
    if (p.init == ParamInit::kNormal && !(p.init_std >= 0.0f)) {
      return Status::invalid_argument(fmt::format("{}: init_std {} must be >= 0", where, p.init_std));
    }
  }
  std::vector<char> listed_by_owner(params.size(), 0);
  for (std::size_t m = 0; m < modules.size(); ++m) {
    const ModuleSpec& spec = modules[m];
    const std::string where = fmt::format("model layout: module {} ('{}')", m, spec.name);
    if (spec.name.empty()) return Status::invalid_argument(where + " has no name");
    std::unordered_set<int> seen;
    for (int p : spec.params) {
      if (p < 0 || static_cast<std::size_t>(p) >= params.size()) {
        return Status::invalid_argument(fmt::format("{} lists parameter {}, not one of the {}", where, p, params.size()));
      }
      if (!seen.insert(p).second) return Status::invalid_argument(fmt::format("{} lists parameter {} twice", where, p));
      if (params[static_cast<std::size_t>(p)].module == static_cast<int>(m)) listed_by_owner[static_cast<std::size_t>(p)] = 1;
    }
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (listed_by_owner[i] == 0) {
      return Status::invalid_argument(fmt::format("model layout: parameter {} ('{}') names module {} as its owner, "
                                                  "which does not list it",
                                                  i, params[i].name, params[i].module));
    }
  }
  return Status::ok();
}

namespace {

Status check_tokens(std::span<const int32_t> tokens, std::string_view what, int vocab) {
  for (std::size_t i = 0; i < tokens.size(); i++) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      return Status::invalid_argument(
          fmt::format("{}[{}] = {} is outside [0, {}) (vocab_size)", what, i, tokens[i], vocab));
    }
  }
  return Status::ok();
}

}  // namespace

Status check_batch(const Model& model, std::span<const int32_t> inputs, std::span<const int32_t> targets, int B,
                   int T) {
  if (B < 1) return Status::invalid_argument(fmt::format("batch size B ({}) must be >= 1", B));
  if (T < 1 || T > model.max_seq()) {
    return Status::invalid_argument(
        fmt::format("sequence length T ({}) must be between 1 and max_seq ({})", T, model.max_seq()));
  }
  const int64_t bt = static_cast<int64_t>(B) * T;
  if (bt > INT_MAX / 4) return Status::invalid_argument(fmt::format("B*T ({}) is too large", bt));
  if (inputs.size() != static_cast<std::size_t>(bt) || targets.size() != static_cast<std::size_t>(bt)) {
    return Status::invalid_argument(fmt::format("inputs ({}) and targets ({}) must each hold B*T = {} tokens",
                                                inputs.size(), targets.size(), bt));
  }
  ZINF_RETURN_IF_ERROR(check_tokens(inputs, "inputs", model.vocab_size()));
  return check_tokens(targets, "targets", model.vocab_size());
}

}  // namespace zinf::model
