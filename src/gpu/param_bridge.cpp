// GptGpuModel's protocol bookkeeping: packed layouts and the per-pass state of values and gradients.
#include "gpu/param_bridge.h"

#include <fmt/format.h>

#include <algorithm>

#include "zinf/model/model.h"

namespace zinf::gpu {

PackedLayout pack_layout(std::span<const std::size_t> numels, std::size_t elem_bytes, std::size_t align) {
  PackedLayout l;
  l.offsets.reserve(numels.size());
  for (const std::size_t n : numels) {
    l.offsets.push_back(l.bytes);
    l.bytes += (n * elem_bytes + align - 1) / align * align;
  }
  return l;
}

Result<BridgeLedger> BridgeLedger::create(std::span<const model::ParamSpec> params,
                                          std::span<const model::ModuleSpec> modules) {
  ZINF_RETURN_IF_ERROR(model::validate_layout(params, modules));
  BridgeLedger b;
  b.params_.assign(params.begin(), params.end());
  b.modules_.assign(modules.begin(), modules.end());
  b.owned_.resize(modules.size());
  for (std::size_t m = 0; m < modules.size(); ++m) {
    std::vector<std::size_t> value_numels, grad_numels;
    for (const int p : modules[m].params) {
      const model::ParamSpec& s = params[static_cast<std::size_t>(p)];
      value_numels.push_back(s.numel);
      if (s.module == static_cast<int>(m)) {
        b.owned_[m].push_back(p);
        grad_numels.push_back(s.numel);
      }
    }
    b.value_layouts_.push_back(pack_layout(value_numels, 2));
    b.grad_layouts_.push_back(pack_layout(grad_numels, 4));
    b.staging_bytes_ = std::max({b.staging_bytes_, b.value_layouts_.back().bytes, b.grad_layouts_.back().bytes});
  }
  b.acquired_.assign(modules.size(), false);
  b.grads_open_.assign(modules.size(), false);
  b.grad_live_.assign(params.size(), false);
  return b;
}

void BridgeLedger::begin_pass() {
  std::fill(acquired_.begin(), acquired_.end(), false);
  std::fill(grads_open_.begin(), grads_open_.end(), false);
  std::fill(grad_live_.begin(), grad_live_.end(), false);
}

Status BridgeLedger::check_module(int module, const char* call) const {
  if (module < 0 || static_cast<std::size_t>(module) >= modules_.size()) {
    return Status::invalid_argument(
        fmt::format("{}: module {} out of range (the model has {})", call, module, modules_.size()));
  }
  return Status::ok();
}

Status BridgeLedger::acquire(int module) {
  ZINF_RETURN_IF_ERROR(check_module(module, "acquire"));
  const auto m = static_cast<std::size_t>(module);
  if (acquired_[m]) {
    return Status::internal(fmt::format("acquire: module '{}' is already acquired", modules_[m].name));
  }
  acquired_[m] = true;
  return Status::ok();
}

Status BridgeLedger::release(int module) {
  ZINF_RETURN_IF_ERROR(check_module(module, "release"));
  const auto m = static_cast<std::size_t>(module);
  if (!acquired_[m]) {
    return Status::internal(fmt::format("release: module '{}' was not acquired", modules_[m].name));
  }
  acquired_[m] = false;
  return Status::ok();
}

Result<std::vector<int>> BridgeLedger::open_grads(int module) {
  ZINF_RETURN_IF_ERROR(check_module(module, "grad_buffers"));
  const auto m = static_cast<std::size_t>(module);
  if (grads_open_[m]) {
    return Status::internal(fmt::format("grad_buffers: module '{}' asked twice before grads_ready", modules_[m].name));
  }
  grads_open_[m] = true;
  std::vector<int> fresh;
  for (const int p : modules_[m].params) {
    if (!grad_live_[static_cast<std::size_t>(p)]) {
      grad_live_[static_cast<std::size_t>(p)] = true;
      fresh.push_back(p);
    }
  }
  return fresh;
}

Result<std::vector<int>> BridgeLedger::close_grads(int module) {
  ZINF_RETURN_IF_ERROR(check_module(module, "grads_ready"));
  const auto m = static_cast<std::size_t>(module);
  if (!grads_open_[m]) {
    return Status::internal(
        fmt::format("grads_ready: module '{}' without its grad_buffers call", modules_[m].name));
  }
  grads_open_[m] = false;
  for (const int p : owned_[m]) grad_live_[static_cast<std::size_t>(p)] = false;
  return owned_[m];
}

Status BridgeLedger::check_pass_end() const {
  for (std::size_t m = 0; m < modules_.size(); ++m) {
    if (acquired_[m]) return Status::internal(fmt::format("module '{}' still acquired at the end of the pass", modules_[m].name));
    if (grads_open_[m]) {
      return Status::internal(fmt::format("module '{}': grad_buffers without grads_ready in the pass", modules_[m].name));
    }
  }
  for (std::size_t p = 0; p < params_.size(); ++p) {
    if (grad_live_[p]) {
      return Status::internal(fmt::format(
          "the gradient of '{}' was left on the device: a module listed it after its owner '{}' was made ready",
          params_[p].name, modules_[static_cast<std::size_t>(params_[p].module)].name));
    }
  }
  return Status::ok();
}

}  // namespace zinf::gpu
