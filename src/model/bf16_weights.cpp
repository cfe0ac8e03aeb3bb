// Bf16Weights: bf16 copies of the weight matrices, rounded once per pass (bf16_weights.h).
#include "model/bf16_weights.h"

#include <cassert>

#include "model/fused_kernels.h"

namespace zinf::model::detail {

void Bf16Weights::configure(std::span<const ParamSpec> params, bool on) {
  on_ = on;
  copies_.clear();
  copies_.resize(on ? params.size() : 0);
  held_ = 0;
  roundings_ = 0;
}

void Bf16Weights::begin_pass() {
  for (Copy& c : copies_) c.valid = false;
}

MatmulInput Bf16Weights::get(int param, const float* weight, int rows, int cols) {
  if (!on_) return MatmulInput(weight);
  assert(param >= 0 && static_cast<size_t>(param) < copies_.size());
  Copy& c = copies_[static_cast<size_t>(param)];
  if (!c.valid) {
    const size_t n = static_cast<size_t>(rows) * cols;
    if (c.bits.size() != n) {
      const size_t grown = held_ - c.bits.size() * sizeof(uint16_t) + n * sizeof(uint16_t);
      if (grown > limit_) return MatmulInput(weight);  // over the limit: the product rounds it
      c.bits.resize(n);
      held_ = grown;
    }
    kernels::round_to_bf16(c.bits.data(), weight, rows, cols);
    c.valid = true;
    roundings_++;
  }
  return MatmulInput(weight, c.bits.data());
}

size_t Bf16Weights::bytes_for(std::span<const ParamSpec> params, std::span<const int> matrices) {
  size_t bytes = 0;
  for (int m : matrices) bytes += params[static_cast<size_t>(m)].numel * sizeof(uint16_t);
  return bytes;
}

}  // namespace zinf::model::detail
