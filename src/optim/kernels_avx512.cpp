// AVX-512 kernels (16 floats per vector). Compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512dq -ffp-contract=off; chosen at run time only on CPUs that have them (isa_x86.cpp).
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized
// wrongly reports (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "optim/dtype_dispatch.h"
#include "optim/kernels.h"

namespace zinf::optim::detail {
namespace {

struct V {
  static constexpr std::size_t kWidth = 16;
  using F = __m512;

  static F set1(float x) { return _mm512_set1_ps(x); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F sqrt(F a) { return _mm512_sqrt_ps(a); }

  static F load_bf16(const std::uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static F load_f16(const std::uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // Round to nearest even on the integer bits; NaN -> 0x7FC0 (f32_to_bf16_bits). Not
  // VCVTNEPS2BF16, which flushes subnormals.
  static void store_bf16(std::uint16_t* p, F x) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), lsb);
    r = _mm512_srli_epi32(r, 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
  }
  static void store_f16(std::uint16_t* p, F x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  static F sign(F c) {
    const F zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
    const F pos = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(c, zero, _CMP_GT_OQ), one);
    const F neg = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(c, zero, _CMP_LT_OQ), one);
    return _mm512_mask_mov_ps(_mm512_sub_ps(pos, neg), _mm512_cmp_ps_mask(c, c, _CMP_UNORD_Q), c);
  }

  // Lanes 0-7 and 8-15.
  struct Acc {
    __m512d a[2];
  };
  static Acc acc_zero() { return {{_mm512_setzero_pd(), _mm512_setzero_pd()}}; }
  static void acc_add(Acc& acc, const F* x) {
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x[0]));
    const __m512d hi = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(x[0]), 1)));
    acc.a[0] = _mm512_add_pd(acc.a[0], _mm512_mul_pd(lo, lo));
    acc.a[1] = _mm512_add_pd(acc.a[1], _mm512_mul_pd(hi, hi));
  }
  static void acc_store(const Acc& acc, double* lanes) {
    _mm512_storeu_pd(lanes, acc.a[0]);
    _mm512_storeu_pd(lanes + 8, acc.a[1]);
  }
};

#include "optim/simd_kernels_impl.h"

}  // namespace

const KernelTable& avx512_kernels() { return kTable; }

}  // namespace zinf::optim::detail
