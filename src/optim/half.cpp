// Bulk fp32 <-> 16-bit conversions over the thread pool.
#include "zinf/optim/half.h"

#include <cstdint>

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

}  // namespace zinf::optim
