// fp32 <-> bf16 / fp16 conversions: exact scalar definitions and bulk (vectorised, threaded) ones.
#pragma once

#include <bit>
#include <cstdint>
#include <span>

#include "zinf/optim/dtype.h"
#include "zinf/optim/isa.h"
#include "zinf/status.h"

namespace zinf::optim {

// The scalar functions below are the definitions every vector path reproduces bit for bit.

// Round to nearest even. Every NaN becomes the quiet NaN 0x7FC0; overflow gives +-inf;
// subnormals round like any other value.
constexpr std::uint16_t f32_to_bf16_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

// Exact: a bf16 is the top half of the float.
constexpr float bf16_bits_to_f32(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

// Round to nearest even, as the F16C instruction VCVTPS2PH does with rounding mode 0:
// |f| >= 65520 gives +-inf, results below 2^-14 are binary16 subnormals, a NaN keeps its sign
// and the top 9 bits of its payload and becomes quiet (bit 9 set).
constexpr std::uint16_t f32_to_f16_bits(float f) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t x = bits & 0x7FFFFFFFu;
  if (x > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((x >> 13) & 0x3FFu));
  if (x >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // rounds to >= 2^16
  if (x >= 0x38800000u) {  // normal binary16: rebias the exponent by -112 and round
    const std::uint32_t r = x - 0x38000000u + 0xFFFu + ((x >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | (r >> 13));
  }
  if (x < 0x33000000u) return sign;  // below half the smallest subnormal (2^-25 ties to 0)
  // Subnormal result in units of 2^-24: mantissa (with its hidden bit) shifted right.
  const std::uint32_t exponent = x >> 23;            // 102..112
  const std::uint32_t mantissa = (x & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126u - exponent;       // 14..24
  std::uint32_t q = mantissa >> shift;
  const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (q & 1u) != 0)) ++q;
  return static_cast<std::uint16_t>(sign | q);
}

// Exact, as VCVTPH2PS: subnormals are widened exactly, a NaN becomes quiet with its payload.
constexpr float f16_bits_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1Fu;
  std::uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) {
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa != 0 ? 0x400000u : 0u) | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);
    std::uint32_t e = 113;  // value = mantissa * 2^-24: normalise so that bit 10 is the hidden bit
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    return std::bit_cast<float>(sign | (e << 23) | ((mantissa & 0x3FFu) << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// Bulk conversions with the same results as the scalar functions, vectorised and spread over
// threads per `exec`. `dst` / `src` hold src.size() / dst.size() elements of `dtype` (any
// alignment); kF32 copies. The buffers must not overlap.
Status convert_from_f32(std::span<const float> src, void* dst, DType dst_dtype, const ExecOptions& exec = {});
Status convert_to_f32(const void* src, DType src_dtype, std::span<float> dst, const ExecOptions& exec = {});
// data's n fp32 values converted to `dst_dtype` (bf16 or fp16) in place: afterwards the first
// 2n bytes hold the 16-bit values, the same bits as convert_from_f32 (and the scalar functions).
// Through the bulk converter: the first values through a small buffer, then ranges [a, 2a), whose
// output ends where their input begins, so no range overlaps its own output.
Status narrow_f32_in_place(float* data, std::size_t n, DType dst_dtype, const ExecOptions& exec = {});

}  // namespace zinf::optim
