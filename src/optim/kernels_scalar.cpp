// The scalar reference kernels: one element at a time, in the operation order of kernels.h.
// Built with -ffp-contract=off (no fused multiply-add) and without auto-vectorisation, so that
// it is the plain reference every vector path is checked against bit for bit.
#include <cmath>
#include <cstring>

#include "optim/dtype_dispatch.h"
#include "optim/kernels.h"
#include "zinf/optim/half.h"

namespace zinf::optim::detail {
namespace {

template <DType T>
float load(const void* base, std::size_t i) {
  if constexpr (T == DType::kF32) {
    return static_cast<const float*>(base)[i];
  } else {
    std::uint16_t h;
    std::memcpy(&h, static_cast<const char*>(base) + 2 * i, 2);  // any alignment
    return T == DType::kBF16 ? bf16_bits_to_f32(h) : f16_bits_to_f32(h);
  }
}

template <DType T>
void store_half(void* base, std::size_t i, float f) {
  const std::uint16_t h = T == DType::kBF16 ? f32_to_bf16_bits(f) : f32_to_f16_bits(f);
  std::memcpy(static_cast<char*>(base) + 2 * i, &h, 2);
}

template <DType G, DType C, Decay D>
void adam_loop(const AdamScalars& s, const StepArrays& a, std::size_t begin, std::size_t end) {
  float* p = a.param;
  float* m = a.state1;
  float* v = a.state2;
  for (std::size_t i = begin; i < end; ++i) {
    float g = load<G>(a.grad, i) * s.grad_scale;
    float pi = p[i];
    if constexpr (D == Decay::kL2) g = g + s.l2_decay * pi;
    const float mi = s.beta1 * m[i] + s.one_minus_beta1 * g;
    const float vi = s.beta2 * v[i] + s.one_minus_beta2 * (g * g);
    const float denom = std::sqrt(vi) * s.rsqrt_bc2 + s.eps;
    if constexpr (D == Decay::kDecoupled) pi = pi + s.decoupled_decay * pi;
    pi = pi + s.neg_step_size * (mi / denom);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if constexpr (C != DType::kF32) store_half<C>(a.copy, i, pi);
  }
}

void adam(const AdamScalars& s, const StepArrays& a, std::size_t begin, std::size_t end) {
  with_dtypes(a, [&]<DType G, DType C>() {
    with_decay(s.decay, [&]<Decay D>() { adam_loop<G, C, D>(s, a, begin, end); });
  });
}

template <DType G, DType C, bool kDecay>
void adagrad_loop(const AdagradScalars& s, const StepArrays& a, std::size_t begin, std::size_t end) {
  float* p = a.param;
  float* v = a.state1;
  for (std::size_t i = begin; i < end; ++i) {
    float g = load<G>(a.grad, i) * s.grad_scale;
    float pi = p[i];
    if constexpr (kDecay) g = g + s.weight_decay * pi;
    const float vi = v[i] + g * g;
    const float denom = std::sqrt(vi) + s.eps;
    pi = pi + s.neg_lr * (g / denom);
    p[i] = pi;
    v[i] = vi;
    if constexpr (C != DType::kF32) store_half<C>(a.copy, i, pi);
  }
}

void adagrad(const AdagradScalars& s, const StepArrays& a, std::size_t begin, std::size_t end) {
  with_dtypes(a, [&]<DType G, DType C>() {
    if (s.decay) {
      adagrad_loop<G, C, true>(s, a, begin, end);
    } else {
      adagrad_loop<G, C, false>(s, a, begin, end);
    }
  });
}

template <DType G, DType C>
void lion_loop(const LionScalars& s, const StepArrays& a, std::size_t begin, std::size_t end) {
  float* p = a.param;
  float* m = a.state1;
  for (std::size_t i = begin; i < end; ++i) {
    const float g = load<G>(a.grad, i) * s.grad_scale;
    const float mi = m[i];
    const float c = s.beta1 * mi + s.one_minus_beta1 * g;
    float sign = (c > 0.0f ? 1.0f : 0.0f) - (c < 0.0f ? 1.0f : 0.0f);
    if (std::isnan(c)) sign = c;
    const float pi = p[i] * s.decay_factor + s.neg_lr * sign;
    p[i] = pi;
    m[i] = s.beta2 * mi + s.one_minus_beta2 * g;
    if constexpr (C != DType::kF32) store_half<C>(a.copy, i, pi);
  }
}

void lion(const LionScalars& s, const StepArrays& a, std::size_t begin, std::size_t end) {
  with_dtypes(a, [&]<DType G, DType C>() { lion_loop<G, C>(s, a, begin, end); });
}

template <DType T>
void sq_norm_loop(const void* x, std::size_t begin, std::size_t end, double* block_sums) {
  for (std::size_t b = begin, j = 0; b < end; b += kNormBlock, ++j) {
    const std::size_t stop = end - b < kNormBlock ? end : b + kNormBlock;
    double lanes[kNormLanes] = {};
    for (std::size_t i = b; i < stop; ++i) {
      const double d = load<T>(x, i);
      lanes[(i - b) % kNormLanes] += d * d;
    }
    double sum = 0.0;
    for (double lane : lanes) sum += lane;
    block_sums[j] = sum;
  }
}

void sq_norm_blocks(const void* x, DType dtype, std::size_t begin, std::size_t end, double* block_sums) {
  switch (dtype) {
    case DType::kF32: sq_norm_loop<DType::kF32>(x, begin, end, block_sums); break;
    case DType::kBF16: sq_norm_loop<DType::kBF16>(x, begin, end, block_sums); break;
    case DType::kF16: sq_norm_loop<DType::kF16>(x, begin, end, block_sums); break;
  }
}

template <DType T>
void to_f32_loop(const void* src, float* dst, std::size_t begin, std::size_t end) {
  for (std::size_t i = begin; i < end; ++i) dst[i] = load<T>(src, i);
}

void to_f32(const void* src, DType src_dtype, float* dst, std::size_t begin, std::size_t end) {
  switch (src_dtype) {
    case DType::kF32: to_f32_loop<DType::kF32>(src, dst, begin, end); break;
    case DType::kBF16: to_f32_loop<DType::kBF16>(src, dst, begin, end); break;
    case DType::kF16: to_f32_loop<DType::kF16>(src, dst, begin, end); break;
  }
}

void from_f32(const float* src, void* dst, DType dst_dtype, std::size_t begin, std::size_t end) {
  switch (dst_dtype) {
    case DType::kF32:
      for (std::size_t i = begin; i < end; ++i) static_cast<float*>(dst)[i] = src[i];
      break;
    case DType::kBF16:
      for (std::size_t i = begin; i < end; ++i) store_half<DType::kBF16>(dst, i, src[i]);
      break;
    case DType::kF16:
      for (std::size_t i = begin; i < end; ++i) store_half<DType::kF16>(dst, i, src[i]);
      break;
  }
}

}  // namespace

const KernelTable& scalar_kernels() {
  static const KernelTable table{adam, adagrad, lion, sq_norm_blocks, to_f32, from_f32};
  return table;
}

}  // namespace zinf::optim::detail
