// AVX2 + F16C kernels (8 floats per vector). Compiled with -mavx2 -mf16c -ffp-contract=off;
// chosen at run time only on CPUs that have both (isa_x86.cpp).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "optim/dtype_dispatch.h"
#include "optim/kernels.h"

namespace zinf::optim::detail {
namespace {

struct V {
  static constexpr std::size_t kWidth = 8;
  using F = __m256;

  static F set1(float x) { return _mm256_set1_ps(x); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F sqrt(F a) { return _mm256_sqrt_ps(a); }

  static F load_bf16(const std::uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static F load_f16(const std::uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // Round to nearest even on the integer bits; NaN -> 0x7FC0 (f32_to_bf16_bits).
  static void store_bf16(std::uint16_t* p, F x) {
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), lsb);
    r = _mm256_srli_epi32(r, 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
    // Values are <= 0xFFFF, so the unsigned saturating pack is a plain narrowing.
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  static void store_f16(std::uint16_t* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  static F sign(F c) {
    const F zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
    const F pos = _mm256_and_ps(_mm256_cmp_ps(c, zero, _CMP_GT_OQ), one);
    const F neg = _mm256_and_ps(_mm256_cmp_ps(c, zero, _CMP_LT_OQ), one);
    return _mm256_blendv_ps(_mm256_sub_ps(pos, neg), c, _mm256_cmp_ps(c, c, _CMP_UNORD_Q));
  }

  // Lanes 0-3, 4-7, 8-11, 12-15.
  struct Acc {
    __m256d a[4];
  };
  static Acc acc_zero() { return {{_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()}}; }
  static void acc_add(Acc& acc, const F* x) {
    for (int k = 0; k < 2; ++k) {
      const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x[k]));
      const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x[k], 1));
      acc.a[2 * k] = _mm256_add_pd(acc.a[2 * k], _mm256_mul_pd(lo, lo));
      acc.a[2 * k + 1] = _mm256_add_pd(acc.a[2 * k + 1], _mm256_mul_pd(hi, hi));
    }
  }
  static void acc_store(const Acc& acc, double* lanes) {
    for (int k = 0; k < 4; ++k) _mm256_storeu_pd(lanes + 4 * k, acc.a[k]);
  }
};

#include "optim/simd_kernels_impl.h"

}  // namespace

const KernelTable& avx2_kernels() { return kTable; }

}  // namespace zinf::optim::detail
