// LocalParams: all parameters and gradients in two flat allocations, handed out by pointer.
#include "zinf/model/local_params.h"
#include "zinf/thread_pool.h"

#include <fmt/format.h>

#include <cstring>

namespace zinf::model {

Result<LocalParams> LocalParams::create(std::span<const ParamSpec> params,
                                        std::span<const ModuleSpec> modules) {
  LocalParams lp;
  lp.specs_.assign(params.begin(), params.end());
  lp.offsets_.reserve(params.size() + 1);
  size_t total = 0;
  lp.offsets_.push_back(0);
  for (const ParamSpec& p : params) {
    total += p.numel;
    lp.offsets_.push_back(total);
  }
  for (const ModuleSpec& m : modules) {
    for (int p : m.params) {
      if (p < 0 || static_cast<size_t>(p) >= params.size()) {
        return Status::invalid_argument(
            fmt::format("module {} lists parameter {} of {}", m.name, p, params.size()));
      }
    }
    lp.module_params_.push_back(m.params);
  }
  lp.values_ = FloatBuffer::allocate(total);
  lp.grads_ = FloatBuffer::allocate(total);
  if (total > 0 && (lp.values_.data() == nullptr || lp.grads_.data() == nullptr)) {
    return Status::resource_exhausted(
        fmt::format("LocalParams: cannot allocate 2 x {} bytes for {} parameters",
                    total * sizeof(float), total));
  }
  zero_fill(lp.values_.data(), total * sizeof(float));
  lp.zero_grads();
  return lp;
}

void LocalParams::init(uint64_t seed) {
  for (size_t i = 0; i < specs_.size(); i++) {
    init_param(specs_[i], seed, param(static_cast<int>(i)), 0);
  }
}

void LocalParams::zero_grads() {
  if (grads_.size() > 0) std::memset(grads_.data(), 0, grads_.size() * sizeof(float));
}

Status LocalParams::check_module(int module, size_t n) const {
  if (module < 0 || static_cast<size_t>(module) >= module_params_.size()) {
    return Status::internal(fmt::format("LocalParams: no module {}", module));
  }
  if (n != module_params_[module].size()) {
    return Status::internal(fmt::format("LocalParams: module {} has {} parameters, asked for {}",
                                        module, module_params_[module].size(), n));
  }
  return Status::ok();
}

Status LocalParams::acquire(int module, Phase, std::span<const float*> values) {
  ZINF_RETURN_IF_ERROR(check_module(module, values.size()));
  for (size_t k = 0; k < values.size(); k++) {
    values[k] = values_.data() + offsets_[module_params_[module][k]];
  }
  return Status::ok();
}

Status LocalParams::release(int module, Phase) {
  if (module < 0 || static_cast<size_t>(module) >= module_params_.size()) {
    return Status::internal(fmt::format("LocalParams: release of unknown module {}", module));
  }
  return Status::ok();
}

Status LocalParams::grad_buffers(int module, std::span<float*> grads) {
  ZINF_RETURN_IF_ERROR(check_module(module, grads.size()));
  for (size_t k = 0; k < grads.size(); k++) {
    grads[k] = grads_.data() + offsets_[module_params_[module][k]];
  }
  return Status::ok();
}

Status LocalParams::grads_ready(int module) {
  if (module < 0 || static_cast<size_t>(module) >= module_params_.size()) {
    return Status::internal(fmt::format("LocalParams: grads_ready of unknown module {}", module));
  }
  return Status::ok();
}

}  // namespace zinf::model
