// bf16 block products for the attention core: operands rounded to bf16 while they are packed
// into K-pair panels, VDPBF16PS (AVX512-BF16) with fp32 accumulation, and the scalar reference
// it matches bit for bit (block_gemm.h).
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "model/bf16.h"
#include "model/block_gemm.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "model/block_gemm_tile.h"
#include "model/transpose16.h"
#define ZINF_BLOCK_GEMM_BF16_X86 1
#endif

namespace zinf::model::kernels::detail {

namespace {

using model::detail::from_bf16;
using model::detail::to_bf16;

// A bf16 denormal read as zero (VDPBF16PS's DAZ).
inline uint16_t bf16_daz(uint16_t h) { return (h & 0x7f80u) == 0 ? static_cast<uint16_t>(h & 0x8000u) : h; }

// An operand as VDPBF16PS reads it: rounded to bf16, a denormal read as zero, widened to fp32.
inline float bf16_operand(float v) { return from_bf16(bf16_daz(to_bf16(v))); }

// One lane of one VDPBF16PS half: acc + x * y for operands x, y from bf16_operand(), as
// block_gemm.h states.
float dot_step(float acc, float x, float y) {
  if (std::fabs(acc) < FLT_MIN) acc = std::copysign(0.0f, acc);  // DAZ on the accumulator too
  const float r = std::fma(x, y, acc);  // the product of two bf16 is exact; one rounding
  const float mag = std::fabs(r);
  if (!(mag <= FLT_MIN) || mag == 0.0f) return r;      // normal, infinite, NaN or zero
  if (mag < FLT_MIN) return std::copysign(0.0f, r);  // tiny however it is detected
  // |r| == FLT_MIN: std::fma rounds with gradual underflow (on the 2^-149 grid), which can round
  // up to FLT_MIN a result that x86 rounds to 24 bits with an unbounded exponent (grid 2^-150)
  // to below FLT_MIN, so tiny. That happens when the exact value lies below the midpoint between
  // FLT_MIN and its unbounded predecessor. In double, acc + x * y is exact where it is near that
  // midpoint (x * y has 16 significant bits; a product too small to be exact there cannot move
  // acc, a multiple of 2^-149, across it), so the comparison is exact.
  const double exact = static_cast<double>(acc) + static_cast<double>(x) * static_cast<double>(y);
  const double midpoint = std::ldexp(1.0, -126) - std::ldexp(1.0, -151);
  return std::fabs(exact) < midpoint ? std::copysign(0.0f, r) : r;
}

}  // namespace

void block_gemm_bf16_reference(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                               const float* B, int ldb, bool accumulate, float* C, int ldc) {
  const size_t a_rs = trans_a ? 1 : lda, a_ks = trans_a ? lda : 1;  // A(i, k) = A[i * a_rs + k * a_ks]
  const size_t b_ks = trans_b ? 1 : ldb, b_cs = trans_b ? ldb : 1;  // B(k, j) = B[k * b_ks + j * b_cs]
  // Each operand rounded once, rows of A and columns of B contiguous, K padded with a zero to
  // whole pairs: the same steps as rounding at every use, at a fraction of the cost (on CPUs
  // without AVX512-BF16 the tests of the bf16 attention path run this product).
  const size_t K2 = (static_cast<size_t>(K) + 1) / 2 * 2;
  std::vector<float> a(static_cast<size_t>(M) * K2, 0.0f), b(static_cast<size_t>(N) * K2, 0.0f);
  for (int i = 0; i < M; i++) {
    for (int k = 0; k < K; k++) a[i * K2 + k] = bf16_operand(A[i * a_rs + k * a_ks]);
  }
  for (int j = 0; j < N; j++) {
    for (int k = 0; k < K; k++) b[j * K2 + k] = bf16_operand(B[k * b_ks + j * b_cs]);
  }
  for (int i = 0; i < M; i++) {
    const float* ai = a.data() + i * K2;
    for (int j = 0; j < N; j++) {
      const float* bj = b.data() + j * K2;
      float sum = 0.0f;
      for (size_t k = 0; k < K2; k += 2) {
        sum = dot_step(sum, ai[k + 1], bj[k + 1]);
        sum = dot_step(sum, ai[k], bj[k]);
      }
      float& c = C[static_cast<size_t>(i) * ldc + j];
      c = accumulate ? c + alpha * sum : alpha * sum;
    }
  }
}

#ifdef ZINF_BLOCK_GEMM_BF16_X86
// GCC 12 warns about the unused pass-through operand (__Y) of several AVX-512 intrinsics here, as
// in transpose16.h.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace {

// The packed operands are dwords of bf16 pairs: (element 2p) in the low half, (element 2p + 1)
// in the high half, as VDPBF16PS reads them.

// Each lane: to_bf16 of the float (bf16.h's formula) in the upper 16 bits; the lower 16 are
// left over from the rounding.
__attribute__((target("avx512f"))) inline __m512i round_to_bf16_high(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));  // quiet: bf16 bit 6
}

// The upper halves of lo's 16 lanes, then of hi's, as 32 16-bit values in order.
__attribute__((target("avx512f,avx512bw"))) inline __m512i upper_halves(__m512i lo, __m512i hi) {
  static constexpr uint16_t kOdd[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
                                        33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  return _mm512_permutex2var_epi16(lo, _mm512_loadu_si512(kOdd), hi);
}

// dst (pairs, ldd) with dst[p][j] = (src[2p][j], src[2p + 1][j]) for src K rows of ld, `cols`
// columns; the missing row of an odd K and the columns [cols, ldd) are zero. ldd: a multiple of 16.
__attribute__((target("avx512f,avx512bw"))) void pack_row_pairs(const float* src, size_t ld, int K, int cols, uint32_t* dst,
                                                        size_t ldd) {
  for (int k = 0; k < K; k += 2) {
    const float* r0 = src + k * ld;
    const float* r1 = k + 1 < K ? r0 + ld : nullptr;
    uint32_t* out = dst + static_cast<size_t>(k / 2) * ldd;
    for (size_t j0 = 0; j0 < ldd; j0 += 16) {
      const int n = cols - static_cast<int>(j0);
      const __mmask16 m = n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
      const __m512i lo = _mm512_srli_epi32(round_to_bf16_high(_mm512_maskz_loadu_ps(m, r0 + j0)), 16);
      const __m512i hi = r1 == nullptr ? _mm512_setzero_si512() : round_to_bf16_high(_mm512_maskz_loadu_ps(m, r1 + j0));
      _mm512_storeu_si512(out + j0, _mm512_mask_blend_epi16(0xaaaaaaaau, lo, hi));  // hi's upper halves
    }
  }
}

// dst (rows, width dwords of ldd) with dst[i][p] = (src[i][2p], src[i][2p + 1]) for src rows of
// ld, K columns; pairs past K are zero. width: a multiple of 16, at least (K + 1) / 2.
__attribute__((target("avx512f,avx512bw"))) void pack_column_pairs(const float* src, size_t ld, int rows, int K, int width,
                                                           uint32_t* dst, size_t ldd) {
  for (int i = 0; i < rows; i++) {
    const float* row = src + i * ld;
    for (int k0 = 0; k0 < 2 * width; k0 += 32) {
      __m512i r[2];
      for (int h = 0; h < 2; h++) {
        const int n = K - (k0 + 16 * h);
        const __mmask16 m = n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
        r[h] = round_to_bf16_high(_mm512_maskz_loadu_ps(m, row + k0 + 16 * h));
      }
      _mm512_storeu_si512(dst + i * ldd + k0 / 2, upper_halves(r[0], r[1]));  // 32 bf16 in order
    }
  }
}

// dst (pairs, ldd) with dst[p][j] = (src[j][2p], src[j][2p + 1]) for src N rows of ld, K
// columns: the rows packed into tmp, then transposed 16 x 16 in registers. dst must hold
// round_up_16(pairs) rows; columns [N, ldd) are zero. ldd: round_up_16(N).
__attribute__((target("avx512f,avx512bw"))) void pack_transposed_pairs(const float* src, size_t ld, int N, int K,
                                                               uint32_t* dst, size_t ldd,
                                                               std::vector<uint32_t>& tmp) {
  const int width = ((K + 1) / 2 + 15) / 16 * 16;
  if (tmp.size() < ldd * width) tmp.resize(ldd * width);
  pack_column_pairs(src, ld, N, K, width, tmp.data(), width);
  std::memset(tmp.data() + static_cast<size_t>(N) * width, 0, (ldd - N) * width * sizeof(uint32_t));
  for (size_t j0 = 0; j0 < ldd; j0 += 16) {
    for (int p0 = 0; p0 < width; p0 += 16) {
      __m512 r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(reinterpret_cast<const float*>(tmp.data() + (j0 + i) * width + p0));
      transpose16(r);
#pragma GCC unroll 16
      for (int i = 0; i < 16; i++) _mm512_storeu_ps(reinterpret_cast<float*>(dst + (p0 + i) * ldd + j0), r[i]);
    }
  }
}
constexpr int kTileRows = 6;  // as block_gemm's AVX-512 kernel: 24 accumulators, 4 B vectors

// Rows [0, R) x vectors [0, NV) of C from the packed A(i, p) = A[i * a_rs + p * a_ks] and B
// (pairs rows of ldb dwords, zero past the last column); the last vector's columns are `last`.
template <int R, int NV>
__attribute__((target("avx512f,avx512bf16"))) void tile(const uint32_t* A, size_t a_rs, size_t a_ks,
                                                         const uint32_t* B, size_t ldb, int pairs, float alpha,
                                                         bool accumulate, float* C, size_t ldc, __mmask16 last) {
  __m512 acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
  }
  for (int p = 0; p < pairs; p++) {
    const uint32_t* brow = B + p * ldb;
    __m512bh b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) b[v] = (__m512bh)_mm512_loadu_si512(brow + 16 * v);
    const uint32_t* acol = A + p * a_ks;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(acol[r * a_rs]));
#pragma GCC unroll 8
      for (int v = 0; v < NV; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
    }
  }
  store_tile(acc, alpha, accumulate, C, ldc, last);
}

using TileFn = void (*)(const uint32_t*, size_t, size_t, const uint32_t*, size_t, int, float, bool, float*, size_t,
                        __mmask16);

template <int R>
constexpr TileFn kRowTiles[4] = {tile<R, 1>, tile<R, 2>, tile<R, 3>, tile<R, 4>};
constexpr const TileFn* kTiles[kTileRows] = {kRowTiles<1>, kRowTiles<2>, kRowTiles<3>,
                                             kRowTiles<4>, kRowTiles<5>, kRowTiles<6>};

__attribute__((target("avx512f,avx512bw,avx512bf16"))) void block_gemm_bf16_avx512(bool trans_a, bool trans_b, int M, int N,
                                                                          int K, float alpha, const float* A, int lda,
                                                                          const float* B, int ldb, bool accumulate,
                                                                          float* C, int ldc) {
  thread_local std::vector<uint32_t> a_packed, b_packed, tmp;
  const int pairs = (K + 1) / 2;
  const int pairs16 = (pairs + 15) / 16 * 16;
  // A: (M, pairs) rows, or (pairs, M) when transposed.
  size_t a_rs, a_ks;
  if (!trans_a) {
    const size_t ldpa = pairs16;
    if (a_packed.size() < ldpa * M) a_packed.resize(ldpa * M);
    pack_column_pairs(A, lda, M, K, pairs16, a_packed.data(), ldpa);
    a_rs = ldpa;
    a_ks = 1;
  } else {
    const size_t ldpa = (static_cast<size_t>(M) + 15) / 16 * 16;
    if (a_packed.size() < ldpa * pairs) a_packed.resize(ldpa * pairs);
    pack_row_pairs(A, lda, K, M, a_packed.data(), ldpa);
    a_rs = 1;
    a_ks = ldpa;
  }
  // B: (pairs, N) rows of ldpb.
  const size_t ldpb = (static_cast<size_t>(N) + 15) / 16 * 16;
  if (b_packed.size() < ldpb * pairs16) b_packed.resize(ldpb * pairs16);
  if (trans_b) {
    pack_transposed_pairs(B, ldb, N, K, b_packed.data(), ldpb, tmp);
  } else {
    pack_row_pairs(B, ldb, K, N, b_packed.data(), ldpb);
  }
  for (int j0 = 0; j0 < N; j0 += 64) {
    const int cols = N - j0 < 64 ? N - j0 : 64;
    const int nv = (cols + 15) / 16;
    const int tail = cols - 16 * (nv - 1);
    const __mmask16 last = static_cast<__mmask16>((1u << tail) - 1);
    for (int i0 = 0; i0 < M; i0 += kTileRows) {
      const int rows = M - i0 < kTileRows ? M - i0 : kTileRows;
      kTiles[rows - 1][nv - 1](a_packed.data() + i0 * a_rs, a_rs, a_ks, b_packed.data() + j0, ldpb, pairs, alpha,
                               accumulate, C + static_cast<size_t>(i0) * ldc + j0, ldc, last);
    }
  }
  _mm256_zeroupper();  // as in block_gemm_avx512 (block_gemm.cpp)
}

}  // namespace
#pragma GCC diagnostic pop
#endif

bool block_gemm_bf16_supported() {
#ifdef ZINF_BLOCK_GEMM_BF16_X86
  static const bool on = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512bf16");
  }();
  return on;
#else
  return false;
#endif
}

void block_gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                     const float* B, int ldb, bool accumulate, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
#ifdef ZINF_BLOCK_GEMM_BF16_X86
  if (block_gemm_bf16_supported()) {
    block_gemm_bf16_avx512(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, accumulate, C, ldc);
    return;
  }
#endif
  block_gemm_bf16_reference(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, accumulate, C, ldc);
}

}  // namespace zinf::model::kernels::detail
