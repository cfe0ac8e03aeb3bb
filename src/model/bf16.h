// Internal: fp32 -> bf16 rounding, the one definition every writer of bf16 activations uses (the
// bf16 matmul backend's own rounding pass and the kernels that write bf16 copies of their outputs),
// so a copy written by a producing kernel has the bits the backend's pass would give.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace zinf::model::detail {

// Round to nearest even; a NaN stays a (quiet) NaN. Branch-free so that loops around it vectorise.
inline uint16_t to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(nan ? ((u >> 16) | 0x40u) : rounded);
}

// The bf16 value as an fp32 (exact).
inline float from_bf16(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

}  // namespace zinf::model::detail
