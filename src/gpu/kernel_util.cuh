// Internal, device code only: loads and stores between bf16 and fp32, warp and block
// reductions in a fixed order, and the launch check every launcher ends with.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <initializer_list>
#include <string>

#include "gpu/cuda_error.h"
#include "gpu/launch_geometry.h"
#include "gpu/numerics.h"

namespace zinf::gpu::detail {

inline constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ bf16 to_bf16(float x) { return __float2bfloat16_rn(x); }

// All 32 lanes must call these. The xor butterfly adds a + b where the partner adds b + a, so
// every lane ends with the same bits, and the order depends only on the lane index.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Index of the first element and the stride of a grid-stride loop, in size_t.
__device__ __forceinline__ std::size_t grid_start() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_stride() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}

}  // namespace zinf::gpu::detail

namespace zinf::gpu {

// fmt's compile-time format checks do not build under nvcc, so the .cu files describe their
// launches with this: "softmax_xent N=8 V=50257 ld=50264".
struct Dim {
  const char* name;
  long long value;
};
inline std::string describe(const char* kernel, std::initializer_list<Dim> dims) {
  std::string s = kernel;
  for (const Dim& d : dims) {
    s += ' ';
    s += d.name;
    s += '=';
    s += std::to_string(d.value);
  }
  return s;
}

// last_launch_status() of the kernel just launched, named with its sizes.
inline Status launched(const char* kernel, std::initializer_list<Dim> dims) {
  return last_launch_status(describe(kernel, dims));
}

// invalid_argument "<kernel> <sizes>: <why>".
inline Status bad_sizes(const char* kernel, std::initializer_list<Dim> dims, const char* why) {
  return Status::invalid_argument(describe(kernel, dims) + ": " + why);
}

}  // namespace zinf::gpu
