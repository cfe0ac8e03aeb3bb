// Element types of the gradients and parameter copies that the optimizer kernels read and write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zinf::optim {

enum class DType : std::uint8_t {
  kF32,   // IEEE binary32
  kBF16,  // bfloat16: the top 16 bits of a binary32
  kF16,   // IEEE binary16
};

constexpr std::size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
  }
  return "?";
}

}  // namespace zinf::optim
