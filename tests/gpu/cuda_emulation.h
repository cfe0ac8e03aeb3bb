// A host emulation of the CUDA features the tensor-core attention's kernels use
// (src/gpu/tc_attention_kernels.cuh), so that their source runs on machines without a GPU: one
// std::thread per CUDA thread, std::barrier for __syncthreads and __syncwarp, a warp exchange for
// __shfl_xor_sync, and src/gpu/mma_sm80.cuh's ldmatrix_x4(_trans) and mma m16n8k16 with the
// register layouts PTX defines (stated in mma_sm80.cuh): a warp collective gathers the lanes'
// registers into matrices and hands each lane its elements back. ldmatrix checks that every row
// address is 16-byte aligned and inside the block's shared memory and aborts otherwise, and every
// block's shared memory starts filled with NaN patterns. Blocks run one at a time; a kernel whose
// lanes diverge around a collective deadlocks here, as it would misbehave on a GPU.
#pragma once

#include <cuda_bf16.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include "gpu/numerics.h"

#define ZINF_TC_EMULATION 1
#define ZINF_TC_DYNAMIC_SMEM(name) unsigned char* name = ::cuda_emulation::block_smem()
#undef __global__
#undef __device__
#undef __forceinline__
#undef __launch_bounds__
#undef __align__
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __align__(x)

struct EmulatedDim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local EmulatedDim3 threadIdx, blockIdx;
inline EmulatedDim3 gridDim, blockDim;

namespace cuda_emulation {

inline constexpr int kMaxWarps = 32;
struct Block {
  std::barrier<>* all = nullptr;
  std::vector<std::barrier<>*> warps;
  unsigned char* smem = nullptr;
  std::size_t smem_bytes = 0;  // what the launch asked for
};
inline Block g_block;
inline float g_exchange[kMaxWarps][32];
inline const void* g_rows[kMaxWarps][32];
inline float g_a[kMaxWarps][16][16], g_b[kMaxWarps][16][8], g_c[kMaxWarps][16][8];

inline unsigned char* block_smem() { return g_block.smem; }
inline int lane() { return static_cast<int>(threadIdx.x % 32); }
inline int warp() { return static_cast<int>(threadIdx.x / 32); }
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "cuda_emulation: %s\n", what);
    std::abort();
  }
}

// Runs body() as every thread of a (gx, gy) grid of `threads`-thread blocks (a multiple of 32),
// block after block, each with `smem_bytes` of 128-byte aligned shared memory. The block's
// threads are created once and walk the blocks in step.
template <typename Body>
void launch(unsigned gx, unsigned gy, int threads, std::size_t smem_bytes, Body&& body) {
  require(threads % 32 == 0 && threads / 32 <= kMaxWarps, "threads per block");
  gridDim = EmulatedDim3{gx, gy, 1};
  blockDim = EmulatedDim3{static_cast<unsigned>(threads), 1, 1};
  const std::size_t bytes = (smem_bytes + 127) / 128 * 128 + 128;
  const std::unique_ptr<unsigned char, decltype(&std::free)> smem(
      static_cast<unsigned char*>(std::aligned_alloc(128, bytes)), &std::free);
  require(smem != nullptr, "shared memory allocation");
  std::barrier<> all(threads);
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<std::barrier<>*> warp_ptrs;
  for (int w = 0; w < threads / 32; w++) {
    warps.push_back(std::make_unique<std::barrier<>>(32));
    warp_ptrs.push_back(warps.back().get());
  }
  g_block = Block{&all, warp_ptrs, smem.get(), smem_bytes};
  std::vector<std::thread> team;
  for (int t = 0; t < threads; t++) {
    team.emplace_back([&, t] {
      threadIdx = EmulatedDim3{static_cast<unsigned>(t), 0, 0};
      for (unsigned by = 0; by < gy; by++) {
        for (unsigned bx = 0; bx < gx; bx++) {
          if (t == 0) std::memset(smem.get(), 0xFF, bytes);  // NaN as bf16 and as fp32
          all.arrive_and_wait();
          blockIdx = EmulatedDim3{bx, by, 0};
          body();
          all.arrive_and_wait();  // the block is done before the next one's memset
        }
      }
    });
  }
  for (std::thread& th : team) th.join();
}

}  // namespace cuda_emulation

inline void __syncthreads() { cuda_emulation::g_block.all->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) {
  cuda_emulation::g_block.warps[static_cast<std::size_t>(cuda_emulation::warp())]->arrive_and_wait();
}
inline float __shfl_xor_sync(unsigned, float v, int offset) {
  const int w = cuda_emulation::warp();
  cuda_emulation::g_exchange[w][cuda_emulation::lane()] = v;
  __syncwarp();
  const float r = cuda_emulation::g_exchange[w][cuda_emulation::lane() ^ offset];
  __syncwarp();
  return r;
}

namespace zinf::gpu::detail {  // as kernel_util.cuh
inline constexpr unsigned kFullMask = 0xffffffffu;
inline float to_f32(float x) { return x; }
inline float to_f32(bf16 x) { return __bfloat162float(x); }
inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
}  // namespace zinf::gpu::detail

namespace zinf::gpu::mma {  // as src/gpu/mma_sm80.cuh

inline uint32_t bits16(bf16 v) {
  uint16_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}
inline float lo_f32(uint32_t r) { return f32_from_bits(r << 16); }
inline float hi_f32(uint32_t r) { return f32_from_bits(r & 0xffff0000u); }

inline uint32_t pack_bf16x2(float lo, float hi) {
  return bits16(__float2bfloat16_rn(lo)) | (bits16(__float2bfloat16_rn(hi)) << 16);
}

inline void ldmatrix(uint32_t (&r)[4], const bf16* row, bool trans) {
  const int w = cuda_emulation::warp();
  const int l = cuda_emulation::lane();
  const auto* at = reinterpret_cast<const unsigned char*>(row);
  const unsigned char* smem = cuda_emulation::g_block.smem;
  cuda_emulation::require(reinterpret_cast<std::uintptr_t>(row) % 16 == 0, "ldmatrix row not 16-byte aligned");
  cuda_emulation::require(at >= smem && at + 16 <= smem + cuda_emulation::g_block.smem_bytes,
                          "ldmatrix row outside the block's shared memory");
  __syncwarp();
  cuda_emulation::g_rows[w][l] = row;
  __syncwarp();
  for (int i = 0; i < 4; i++) {
    const bf16* const* rows = reinterpret_cast<const bf16* const*>(&cuda_emulation::g_rows[w][8 * i]);
    const int g = l / 4;
    const int t = l % 4;
    const bf16 lo = trans ? rows[2 * t][g] : rows[g][2 * t];
    const bf16 hi = trans ? rows[2 * t + 1][g] : rows[g][2 * t + 1];
    r[i] = bits16(lo) | (bits16(hi) << 16);
  }
  __syncwarp();
}
inline void ldmatrix_x4(uint32_t (&r)[4], const bf16* row) { ldmatrix(r, row, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* row) { ldmatrix(r, row, true); }

// d = a b + d in fp32 (the sum in k order; the hardware's order differs, within rounding).
inline void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  using cuda_emulation::g_a;
  using cuda_emulation::g_b;
  using cuda_emulation::g_c;
  const int w = cuda_emulation::warp();
  const int l = cuda_emulation::lane();
  const int g = l / 4;
  const int t = l % 4;
  __syncwarp();
  for (int j = 0; j < 4; j++) {
    const int row = g + 8 * (j & 1);
    const int col = 2 * t + 8 * (j >> 1);
    g_a[w][row][col] = lo_f32(a[j]);
    g_a[w][row][col + 1] = hi_f32(a[j]);
  }
  g_b[w][2 * t][g] = lo_f32(b0);
  g_b[w][2 * t + 1][g] = hi_f32(b0);
  g_b[w][2 * t + 8][g] = lo_f32(b1);
  g_b[w][2 * t + 9][g] = hi_f32(b1);
  for (int i = 0; i < 4; i++) g_c[w][g + 8 * (i >> 1)][2 * t + (i & 1)] = d[i];
  __syncwarp();
  for (int i = 0; i < 4; i++) {
    const int row = g + 8 * (i >> 1);
    const int col = 2 * t + (i & 1);
    float s = g_c[w][row][col];
    for (int k = 0; k < 16; k++) s += g_a[w][row][k] * g_b[w][k][col];
    d[i] = s;
  }
  __syncwarp();
}

}  // namespace zinf::gpu::mma
