// Bulk fp32 <-> 16-bit conversions over the thread pool.
#include "zinf/optim/half.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "optim/exec.h"

namespace zinf::optim {
namespace {

Status check_buffer(std::string_view op, const void* p, DType dtype, std::size_t n) {
  if (n > 0 && p == nullptr) return Status::invalid_argument(fmt::format("{}: null {} buffer", op, dtype_name(dtype)));
  if (reinterpret_cast<std::uintptr_t>(p) % dtype_size(dtype) != 0) {
    return Status::invalid_argument(fmt::format("{}: {} buffer at {} is not aligned to its element size", op,
                                                dtype_name(dtype), p));
  }
  return Status::ok();
}

}  // namespace

Status convert_from_f32(std::span<const float> src, void* dst, DType dst_dtype, const ExecOptions& exec) {
  ZINF_RETURN_IF_ERROR(check_buffer("convert_from_f32", src.data(), DType::kF32, src.size()));
  ZINF_RETURN_IF_ERROR(check_buffer("convert_from_f32", dst, dst_dtype, src.size()));
  ZINF_ASSIGN_OR_RETURN(const detail::KernelTable* kernels, detail::resolve_kernels(exec));
  detail::parallel_ranges(exec, src.size(), 32,
                          [&](std::size_t b, std::size_t e) { kernels->from_f32(src.data(), dst, dst_dtype, b, e); });
  return Status::ok();
}

Status convert_to_f32(const void* src, DType src_dtype, std::span<float> dst, const ExecOptions& exec) {
  ZINF_RETURN_IF_ERROR(check_buffer("convert_to_f32", src, src_dtype, dst.size()));
  ZINF_RETURN_IF_ERROR(check_buffer("convert_to_f32", dst.data(), DType::kF32, dst.size()));
  ZINF_ASSIGN_OR_RETURN(const detail::KernelTable* kernels, detail::resolve_kernels(exec));
  detail::parallel_ranges(exec, dst.size(), 32,
                          [&](std::size_t b, std::size_t e) { kernels->to_f32(src, src_dtype, dst.data(), b, e); });
  return Status::ok();
}

Status narrow_f32_in_place(float* data, std::size_t n, DType dst_dtype, const ExecOptions& exec) {
  if (dtype_size(dst_dtype) != 2) {
    return Status::invalid_argument(fmt::format("narrow_f32_in_place: {} is not a 16-bit type", dtype_name(dst_dtype)));
  }
  ZINF_RETURN_IF_ERROR(check_buffer("narrow_f32_in_place", data, DType::kF32, n));
  auto* out = reinterpret_cast<std::uint16_t*>(data);
  constexpr std::size_t kHead = std::size_t{1} << 14;
  const std::size_t head = std::min(n, kHead);
  std::vector<std::uint16_t> first(head);
  ZINF_RETURN_IF_ERROR(convert_from_f32(std::span<const float>(data, head), first.data(), dst_dtype, exec));
  if (head > 0) std::memcpy(out, first.data(), head * sizeof(std::uint16_t));
  // [a, b) with b <= 2a: its output bytes [2a, 2b) end at or before its input's first byte, 4a.
  for (std::size_t a = head; a < n; a *= 2) {
    const std::size_t b = std::min(n, 2 * a);
    ZINF_RETURN_IF_ERROR(convert_from_f32(std::span<const float>(data + a, b - a), out + a, dst_dtype, exec));
  }
  return Status::ok();
}

}  // namespace zinf::optim
