// A host emulation of the CUDA features the tensor-core attention's kernels use
// (src/gpu/tc_attention_kernels.cuh), so that their source runs on machines without a GPU: one
// std::thread per CUDA thread, std::barrier for __syncthreads and __syncwarp, a warp exchange for
// __shfl_xor_sync, and nvcuda::wmma with bf16 16x16x16 fragments. The fragments' element-to-lane
// mapping is deliberately scrambled (CUDA leaves it unspecified, and the kernels must not depend
// on it), loads and stores check WMMA's pointer alignment and ldm rules and abort on a violation,
// and every block's shared memory starts filled with NaN patterns. Blocks run one at a time; a
// kernel whose lanes diverge around a collective deadlocks here, as it would misbehave on a GPU.
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
};
inline Block g_block;
inline float g_exchange[kMaxWarps][32];
inline float g_a[kMaxWarps][16][16], g_b[kMaxWarps][16][16], g_c[kMaxWarps][16][16];

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
  g_block = Block{&all, warp_ptrs, smem.get()};
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
inline bf16 to_bf16(float x) { return __float2bfloat16_rn(x); }
inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
}  // namespace zinf::gpu::detail

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  enum { num_elements = 8 };
  T x[num_elements];
};

// Scrambled bijections (lane, i) -> (row, column), one for operands, another for accumulators.
inline void operand_at(int lane, int i, int& r, int& c) {
  const int e = (lane * 8 + i) * 37 % 256;
  r = e / 16;
  c = e % 16;
}
inline void accumulator_at(int lane, int i, int& r, int& c) {
  const int e = ((lane * 8 + i) * 101 + 3) % 256;
  r = e / 16;
  c = e % 16;
}
inline void check_pointer(const void* p, unsigned ldm, std::size_t element) {
  cuda_emulation::require(reinterpret_cast<std::uintptr_t>(p) % 32 == 0, "WMMA pointer not 256-bit aligned");
  cuda_emulation::require(ldm * element % 16 == 0, "WMMA ldm not a multiple of 16 bytes");
}

template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  __syncwarp();
  check_pointer(p, ldm, sizeof(T));
  for (int i = 0; i < 8; i++) {
    int r = 0, c = 0;
    operand_at(cuda_emulation::lane(), i, r, c);
    f.x[i] = std::is_same_v<Layout, row_major> ? p[r * ldm + c] : p[c * ldm + r];
  }
  __syncwarp();
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm, layout_t l) {
  __syncwarp();
  check_pointer(p, ldm, 4);
  for (int i = 0; i < 8; i++) {
    int r = 0, c = 0;
    accumulator_at(cuda_emulation::lane(), i, r, c);
    f.x[i] = l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
  }
  __syncwarp();
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t l) {
  __syncwarp();
  check_pointer(p, ldm, 4);
  for (int i = 0; i < 8; i++) {
    int r = 0, c = 0;
    accumulator_at(cuda_emulation::lane(), i, r, c);
    (l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[i];
  }
  __syncwarp();
}
template <typename Fragment>
void fill_fragment(Fragment& f, float v) {
  for (auto& x : f.x) x = v;
}
// d = a b + c in fp32 (the sum in k order; the hardware's order differs, within rounding).
template <typename LayoutA, typename LayoutB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  const int w = cuda_emulation::warp();
  const int lane = cuda_emulation::lane();
  __syncwarp();
  for (int i = 0; i < 8; i++) {
    int r = 0, col = 0;
    operand_at(lane, i, r, col);
    cuda_emulation::g_a[w][r][col] = __bfloat162float(a.x[i]);
    cuda_emulation::g_b[w][r][col] = __bfloat162float(b.x[i]);
    accumulator_at(lane, i, r, col);
    cuda_emulation::g_c[w][r][col] = c.x[i];
  }
  __syncwarp();
  for (int i = 0; i < 8; i++) {
    int r = 0, col = 0;
    accumulator_at(lane, i, r, col);
    float s = cuda_emulation::g_c[w][r][col];
    for (int k = 0; k < 16; k++) s += cuda_emulation::g_a[w][r][k] * cuda_emulation::g_b[w][k][col];
    d.x[i] = s;
  }
  __syncwarp();
}

}  // namespace nvcuda::wmma
