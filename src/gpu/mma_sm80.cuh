// Internal, device code only: the warp-level tensor-core instructions the tensor-core attention
// uses (tc_attention_kernels.cuh), as PTX, with their register layouts stated so that the
// kernels, the host emulation (tests/gpu/cuda_emulation.h, which implements these same functions
// on threads) and the host tests of the lane arithmetic (tc_attention_tiles.h) agree.
//
// mma_bf16_16816: D (16x8, fp32) = A (16x16, bf16, row-major) B (16x8, bf16, "col") + C, as
// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`. Lane l, g = l / 4, t = l % 4, holds
//   A: a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..2t+1), a[2] = (g, 2t+8..2t+9), a[3] = (g+8, 2t+8..2t+9)
//   B: b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
//   C, D: c[0], c[1] = (g, 2t), (g, 2t+1); c[2], c[3] = (g+8, 2t), (g+8, 2t+1)
// each .b32 register two bf16, the lower column (or k) in the low half. So the accumulators of
// two adjacent n8 tiles, packed pairwise to bf16, are an A operand over k = those 16 columns.
//
// ldmatrix_x4: four 8x8 bf16 matrices from shared memory; lanes 8i .. 8i+7 give the addresses of
// matrix i's 8 rows (16 bytes each, 16-byte aligned), and register i of lane l receives matrix
// i's (row l / 4, columns 2(l % 4), 2(l % 4) + 1); with _trans, (rows 2(l % 4), 2(l % 4) + 1,
// column l / 4). tc_attention_tiles.h's ldm_* functions say which row each lane points at.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "gpu/numerics.h"

namespace zinf::gpu::mma {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
}

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to bf16 in one register, `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

}  // namespace zinf::gpu::mma
