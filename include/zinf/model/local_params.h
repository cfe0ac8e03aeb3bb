// LocalParams: every parameter and gradient in memory, one contiguous allocation each; the
// ParamAccess for tests and the no-ZeRO baseline.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "zinf/model/float_buffer.h"
#include "zinf/model/params.h"
#include "zinf/status.h"

namespace zinf::model {

// Parameter i lives at flat_params()[offset(i), offset(i) + numel); gradients likewise.
// acquire() hands out pointers into that storage, grad_buffers() into the gradient storage,
// which accumulates until zero_grads(). Not thread-safe.
class LocalParams final : public ParamAccess {
 public:
  // Copies the layout of `params` and `modules` (e.g. GptModel::params()/modules()).
  // Fails with resource_exhausted if the two allocations cannot be made. Contents are zero.
  static Result<LocalParams> create(std::span<const ParamSpec> params,
                                    std::span<const ModuleSpec> modules);

  // init_param() for every parameter.
  void init(uint64_t seed);
  void zero_grads();

  size_t num_params() const { return offsets_.empty() ? 0 : offsets_.back(); }
  std::span<float> param(int i) { return values_.span().subspan(offsets_[i], numel(i)); }
  std::span<const float> param(int i) const {
    return values_.span().subspan(offsets_[i], numel(i));
  }
  std::span<float> grad(int i) { return grads_.span().subspan(offsets_[i], numel(i)); }
  std::span<const float> grad(int i) const { return grads_.span().subspan(offsets_[i], numel(i)); }
  std::span<float> flat_params() { return values_.span(); }
  std::span<const float> flat_params() const { return values_.span(); }
  std::span<float> flat_grads() { return grads_.span(); }
  std::span<const float> flat_grads() const { return grads_.span(); }

  Status acquire(int module, Phase phase, std::span<const float*> values) override;
  Status release(int module, Phase phase) override;
  Status grad_buffers(int module, std::span<float*> grads) override;
  Status grads_ready(int module) override;

 private:
  size_t numel(int i) const { return offsets_[i + 1] - offsets_[i]; }
  Status check_module(int module, size_t n) const;

  std::vector<ParamSpec> specs_;
  std::vector<std::vector<int>> module_params_;
  std::vector<size_t> offsets_;  // num params + 1
  FloatBuffer values_;
  FloatBuffer grads_;
};

}  // namespace zinf::model
