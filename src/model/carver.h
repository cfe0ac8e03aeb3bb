// Internal: hands out aligned views of one activation allocation (llm.c malloc_and_point).
#pragma once

#include <cstddef>
#include <cstdint>

namespace zinf::model::detail {

// Views are 64-byte aligned when base is; with base == nullptr it only counts, so one function
// both sizes and points a model's buffers.
class Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* take(size_t n) {
    float* p = base_ != nullptr ? base_ + used_ : nullptr;
    used_ += (n + 15) / 16 * 16;
    return p;
  }
  // n bf16 values (uint16_t), in floats' storage.
  uint16_t* take_bf16(size_t n) { return reinterpret_cast<uint16_t*>(take((n + 1) / 2)); }
  size_t used() const { return used_; }

 private:
  float* base_;
  size_t used_ = 0;
};

}  // namespace zinf::model::detail
