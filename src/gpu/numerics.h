// Internal: arithmetic the GPU kernels share with host code, so that the host tests check the
// very formulas the device runs: bf16 rounding, GELU and its derivative, SwiGLU and its
// derivatives, the RoPE rotation, IEEE-exact operations.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ZINF_HD __host__ __device__ __forceinline__
#else
#define ZINF_HD inline
#endif

namespace zinf::gpu {

// Device storage type of activations and 16-bit parameters. Host code sees the same 2 bytes.
using bf16 = __nv_bfloat16;

ZINF_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

ZINF_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Round to nearest even; every NaN becomes 0x7FC0; overflow gives +-inf. Bit for bit
// optim::f32_to_bf16_bits (the CPU's definition), so a GPU bf16 copy equals the CPU's.
// (The hardware conversion __float2bfloat16_rn agrees except for NaN payloads; the model
// kernels use it, the optimizer uses this.)
ZINF_HD uint16_t bf16_bits_rne(float f) {
  const uint32_t x = f32_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

ZINF_HD float f32_from_bf16_bits(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

// IEEE single operations rounded to nearest, never fused into an FMA. On the device nvcc
// contracts a * b + c unless told not to; these keep a kernel bit-identical to a CPU reference
// compiled with -ffp-contract=off.
ZINF_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
ZINF_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
ZINF_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
ZINF_HD float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

ZINF_HD float exp_f(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);  // full-precision expf (zinf never builds device code with --use_fast_math)
#else
  return std::exp(x);
#endif
}

// GPT-2's tanh GELU, written as the CPU kernel (model/kernels.cpp) writes it: tanh through one
// exp, 1 - 2 / (e^(2u) + 1), which saturates to +-1 for large |u|.
inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluCubic = 0.044715f;

ZINF_HD float tanh_via_exp(float u) { return 1.0f - 2.0f / (exp_f(2.0f * u) + 1.0f); }

ZINF_HD float gelu_tanh(float x) {
  const float cube = kGeluCubic * x * x * x;
  return 0.5f * x * (1.0f + tanh_via_exp(kGeluScale * (x + cube)));
}

// d gelu_tanh / dx at x.
ZINF_HD float gelu_tanh_grad(float x) {
  const float cube = kGeluCubic * x * x * x;
  const float t = tanh_via_exp(kGeluScale * (x + cube));
  const float sech2 = 1.0f - t * t;
  return 0.5f * (1.0f + t) + x * 0.5f * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
}

// Llama's SwiGLU as the CPU kernel (model/llama_kernels.cpp) writes it, operation for operation
// and without FMA contraction, so that only exp_f can differ between host and device:
// sigmoid(g) = 1 / (1 + e^-g), silu(g) = g * sigmoid(g), out = silu(g) * up.
ZINF_HD float sigmoid(float g) { return div_rn(1.0f, add_rn(1.0f, exp_f(-g))); }
ZINF_HD float swiglu(float g, float up) { return mul_rn(mul_rn(g, sigmoid(g)), up); }
// d out / d up * dout = dout * silu(g).
ZINF_HD float swiglu_dup(float g, float dout) { return mul_rn(dout, mul_rn(g, sigmoid(g))); }
// d out / d g * dout = dout * up * silu'(g), silu'(g) = sig * (1 + g * (1 - sig)).
ZINF_HD float swiglu_dgate(float g, float up, float dout) {
  const float sig = sigmoid(g);
  const float dsilu = mul_rn(sig, add_rn(1.0f, mul_rn(g, add_rn(1.0f, -sig))));
  return mul_rn(mul_rn(dout, up), dsilu);
}

// One RoPE pair (a, b) = (x[i], x[i + hd/2]) rotated by the angle whose cosine is c and whose
// sine is s (s negated for the backward), as the CPU kernel: a c - b s, b c + a s, each product
// rounded separately.
struct RotatedPair {
  float lo, hi;
};
ZINF_HD RotatedPair rope_rotate(float a, float b, float c, float s) {
  return RotatedPair{add_rn(mul_rn(a, c), -mul_rn(b, s)), add_rn(mul_rn(b, c), mul_rn(a, s))};
}

}  // namespace zinf::gpu
