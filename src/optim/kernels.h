// Internal: the per-ISA kernel table and the per-step scalars every path shares.
//
// The vector translation units (kernels_avx2.cpp, kernels_avx512.cpp) are compiled with their
// own -m flags, so they must not call any inline function or template defined outside them:
// the linker could keep their copy (with AVX-512 instructions) for the whole program. This
// header therefore holds only plain structs and declarations.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zinf/optim/dtype.h"

namespace zinf::optim {
enum class KernelIsa;  // isa.h; not included here, it pulls in status.h
}  // namespace zinf::optim

namespace zinf::optim::detail {

// Elements per block of the squared-norm reduction, and lanes per block (see grad_stats.h).
inline constexpr std::size_t kNormBlock = 8192;
inline constexpr std::size_t kNormLanes = 16;

enum class Decay : std::uint8_t { kNone, kL2, kDecoupled };

// Everything derived from the hyperparameters once per step: computed in double, converted to
// float once, and used unchanged by every path. Per element (fp32, in this order):
//   g = grad * grad_scale;  [L2: g = g + l2_decay * p]
//   m = beta1 * m + one_minus_beta1 * g
//   v = beta2 * v + one_minus_beta2 * (g * g)
//   denom = sqrt(v) * rsqrt_bc2 + eps
//   [decoupled: p = p + decoupled_decay * p]      (decoupled_decay = -lr * wd)
//   p = p + neg_step_size * (m / denom)           (neg_step_size = -lr / bc1)
struct AdamScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float eps, rsqrt_bc2, neg_step_size;
  float l2_decay, decoupled_decay, grad_scale;
  Decay decay;
};

// g = grad * grad_scale; [g = g + weight_decay * p]; v = v + g * g;
// p = p + neg_lr * (g / (sqrt(v) + eps))
struct AdagradScalars {
  float eps, neg_lr, weight_decay, grad_scale;
  bool decay;
};

// g = grad * grad_scale; c = beta1 * m + one_minus_beta1 * g;
// s = (c > 0 ? 1 : 0) - (c < 0 ? 1 : 0), or c itself when c is NaN;
// p = p * decay_factor + neg_lr * s;  m = beta2 * m + one_minus_beta2 * g
struct LionScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float neg_lr, decay_factor, grad_scale;
};

// The arrays of one step, whole spans; a kernel call works on elements [begin, end).
// state1 / state2: Adam {exp_avg, exp_avg_sq}, Adagrad {sum_sq, -}, Lion {exp_avg, -}.
struct StepArrays {
  float* param;
  float* state1;
  float* state2;
  const void* grad;
  DType grad_dtype;
  void* copy;  // nullptr: no 16-bit copy
  DType copy_dtype;
};

struct KernelTable {
  void (*adam)(const AdamScalars& s, const StepArrays& a, std::size_t begin, std::size_t end);
  void (*adagrad)(const AdagradScalars& s, const StepArrays& a, std::size_t begin, std::size_t end);
  void (*lion)(const LionScalars& s, const StepArrays& a, std::size_t begin, std::size_t end);
  // Writes the sum of squares of each block of elements [begin, end) of x: begin is a
  // multiple of kNormBlock, and block j covers [begin + j*kNormBlock, min(end, ...)).
  void (*sq_norm_blocks)(const void* x, DType dtype, std::size_t begin, std::size_t end, double* block_sums);
  void (*to_f32)(const void* src, DType src_dtype, float* dst, std::size_t begin, std::size_t end);
  void (*from_f32)(const float* src, void* dst, DType dst_dtype, std::size_t begin, std::size_t end);
};

const KernelTable& scalar_kernels();
// Defined only in x86-64 builds (kernels_avx2.cpp, kernels_avx512.cpp).
const KernelTable& avx2_kernels();
const KernelTable& avx512_kernels();

// The table for `isa`, or nullptr when this build or this CPU lacks it (isa_x86.cpp / isa_generic.cpp).
const KernelTable* kernels_for(KernelIsa isa);

}  // namespace zinf::optim::detail
