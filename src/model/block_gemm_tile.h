// Internal: the store that ends every AVX-512 register tile of block_gemm and block_gemm_bf16.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstddef>

namespace zinf::model::kernels::detail {

// C (R rows of ldc, NV vectors of 16 columns) = alpha * acc, plus C when accumulating, as
// block_gemm.h's contract says (the multiply, then the add: no contraction); the last vector of
// each row stores only the columns in `last`. Inlined into the kernels, whose targets include
// avx512f.
template <int R, int NV>
__attribute__((target("avx512f"), always_inline)) inline void store_tile(__m512 (&acc)[R][NV], float alpha,
                                                                         bool accumulate, float* C, size_t ldc,
                                                                         __mmask16 last) {
  const __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) {
    float* crow = C + r * ldc;
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) {
      const __mmask16 m = v == NV - 1 ? last : __mmask16(0xffff);
      __m512 x = _mm512_mul_ps(va, acc[r][v]);
      if (accumulate) x = _mm512_add_ps(_mm512_maskz_loadu_ps(m, crow + 16 * v), x);
      _mm512_mask_storeu_ps(crow + 16 * v, m, x);
    }
  }
}

}  // namespace zinf::model::kernels::detail
#endif
