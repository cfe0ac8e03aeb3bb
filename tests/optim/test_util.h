// Helpers shared by the optim tests: buffers at chosen misalignments and reproducible data.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "zinf/optim/dtype.h"
#include "zinf/optim/half.h"
#include "zinf/optim/isa.h"

namespace zinf::optim::testing {

// `count` elements of `elem` bytes starting `offset` elements past a 64-byte boundary, so
// that tests see pointers that are not vector aligned. Zero-filled.
class Buffer {
 public:
  Buffer(std::size_t count, std::size_t elem, std::size_t offset)
      : storage_((count + offset) * elem + 128, 0), count_(count), elem_(elem) {
    auto base = reinterpret_cast<std::uintptr_t>(storage_.data());
    base = (base + 63) / 64 * 64;
    data_ = reinterpret_cast<unsigned char*>(base) + offset * elem;
  }
  void* data() { return data_; }
  const void* data() const { return data_; }
  float* f32() { return reinterpret_cast<float*>(data_); }
  std::size_t bytes() const { return count_ * elem_; }
  bool same_bytes(const Buffer& o) const { return bytes() == o.bytes() && std::memcmp(data_, o.data_, bytes()) == 0; }

 private:
  std::vector<unsigned char> storage_;
  unsigned char* data_ = nullptr;
  std::size_t count_;
  std::size_t elem_;
};

// Values of mixed sign and magnitude, with some exact zeros.
inline float random_value(std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-12, 4);
  const float v = u(rng);
  if (std::uniform_int_distribution<int>(0, 31)(rng) == 0) return 0.0f;
  return scale * v * static_cast<float>(std::ldexp(1.0, e(rng)));
}

// Writes `n` values as `dtype` (rounded by the scalar conversions) into `dst`.
inline void fill(void* dst, DType dtype, std::size_t n, std::mt19937& rng, float scale, bool non_negative = false) {
  for (std::size_t i = 0; i < n; ++i) {
    float v = random_value(rng, scale);
    if (non_negative) v = std::fabs(v);
    if (dtype == DType::kF32) {
      std::memcpy(static_cast<char*>(dst) + 4 * i, &v, 4);
    } else {
      const std::uint16_t h = dtype == DType::kBF16 ? f32_to_bf16_bits(v) : f32_to_f16_bits(v);
      std::memcpy(static_cast<char*>(dst) + 2 * i, &h, 2);
    }
  }
}

// The vector paths a test compares with the scalar reference.
inline std::vector<KernelIsa> vector_isas() { return {KernelIsa::kAvx2, KernelIsa::kAvx512}; }

}  // namespace zinf::optim::testing
