// Deterministic GPT-2 parameter initialisation, element by element from (seed, param, index).
#include <algorithm>
#include <cassert>
#include <cmath>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "model/rng.h"
#include "zinf/thread_pool.h"
#include "zinf/model/params.h"

namespace zinf::model {

namespace detail {

double portable_log(double x) {
  // x = m * 2^e with m in [sqrt(1/2), sqrt(2)); log(m) = 2 atanh(z), z = (m-1)/(m+1), |z| < 0.172.
  int e = 0;
  double m = std::frexp(x, &e);  // exact: m in [0.5, 1)
  if (m < 0.70710678118654752440) {
    m *= 2.0;
    e -= 1;
  }
  const double z = (m - 1.0) / (m + 1.0);
  const double z2 = z * z;
  // atanh(z)/z = sum_k z2^k / (2k+1); z2^13 < 1.2e-20, so 13 terms reach double precision.
  double series = 0.0;
  for (int k = 12; k >= 0; k--) series = series * z2 + 1.0 / (2 * k + 1);
  constexpr double kLn2 = 0.69314718055994530942;
  return static_cast<double>(e) * kLn2 + 2.0 * z * series;
}

double normal_from_key(uint64_t key) {
  uint64_t stream = splitmix64(key);
  for (uint64_t k = 0;; k += 2) {
    const double v1 = 2.0 * unit_double(splitmix64(stream + k * 0x9E3779B97F4A7C15ull)) - 1.0;
    const double v2 = 2.0 * unit_double(splitmix64(stream + (k + 1) * 0x9E3779B97F4A7C15ull)) - 1.0;
    const double s = v1 * v1 + v2 * v2;
    if (s >= 1.0 || s == 0.0) continue;                 // rejected with probability 1 - pi/4
    return v1 * std::sqrt(-2.0 * portable_log(s) / s);  // sqrt is correctly rounded by IEEE
  }
}

void fill_normal(uint64_t param_key, double std_dev, size_t first_index, std::span<float> out, bool vector) {
  size_t i = 0;
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (vector && avx2) i = fill_normal_avx2(param_key, std_dev, first_index, out);
#else
  (void)vector;
#endif
  for (; i < out.size(); i++) {
    const uint64_t key = splitmix64(param_key ^ (first_index + i));
    out[i] = static_cast<float>(std_dev * normal_from_key(key));
  }
}

#if defined(__x86_64__)
namespace {

// uint64_t multiplication by a constant (the low 64 bits) from AVX2's 32 x 32 -> 64 products.
__attribute__((target("avx2"))) inline __m256i mul64(__m256i a, uint64_t c) {
  const __m256i b_lo = _mm256_set1_epi64x(static_cast<long long>(c & 0xffffffffull));
  const __m256i b_hi = _mm256_set1_epi64x(static_cast<long long>(c >> 32));
  const __m256i lo = _mm256_mul_epu32(a, b_lo);
  const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b_lo), _mm256_mul_epu32(a, b_hi));
  return _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32));
}

__attribute__((target("avx2"))) inline __m256i splitmix64_x4(__m256i x) {
  x = _mm256_add_epi64(x, _mm256_set1_epi64x(static_cast<long long>(0x9E3779B97F4A7C15ull)));
  x = mul64(_mm256_xor_si256(x, _mm256_srli_epi64(x, 30)), 0xBF58476D1CE4E5B9ull);
  x = mul64(_mm256_xor_si256(x, _mm256_srli_epi64(x, 27)), 0x94D049BB133111EBull);
  return _mm256_xor_si256(x, _mm256_srli_epi64(x, 31));
}

// unit_double: (x >> 11) * 2^-53. The 53-bit integer is converted exactly as two halves (each
// below 2^52, through the 2^52 exponent trick) whose sum is exact, as the scalar cast is.
__attribute__((target("avx2"))) inline __m256d unit_double_x4(__m256i x) {
  const __m256i v = _mm256_srli_epi64(x, 11);
  const __m256i magic = _mm256_set1_epi64x(0x4330000000000000ll);
  const __m256d two52 = _mm256_set1_pd(0x1.0p52);
  const __m256d lo =
      _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi64x(0xffffffffll)), magic)), two52);
  const __m256d hi = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(_mm256_srli_epi64(v, 32), magic)), two52);
  return _mm256_mul_pd(_mm256_add_pd(_mm256_mul_pd(hi, _mm256_set1_pd(0x1.0p32)), lo), _mm256_set1_pd(0x1.0p-53));
}

// portable_log for normal x in (0, 1): the same operations in the same order, four at a time
// (frexp from the bits: exact for normal numbers).
__attribute__((target("avx2"))) inline __m256d portable_log_x4(__m256d x) {
  const __m256i bits = _mm256_castpd_si256(x);
  __m256i e = _mm256_sub_epi64(_mm256_and_si256(_mm256_srli_epi64(bits, 52), _mm256_set1_epi64x(0x7ff)),
                               _mm256_set1_epi64x(1022));
  __m256d m = _mm256_castsi256_pd(_mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi64x(0x000fffffffffffffll)),
                                                  _mm256_set1_epi64x(0x3fe0000000000000ll)));
  const __m256d small = _mm256_cmp_pd(m, _mm256_set1_pd(0.70710678118654752440), _CMP_LT_OQ);
  m = _mm256_blendv_pd(m, _mm256_mul_pd(m, _mm256_set1_pd(2.0)), small);
  e = _mm256_add_epi64(e, _mm256_castpd_si256(small));  // all-ones lanes: -1
  const __m256d one = _mm256_set1_pd(1.0);
  const __m256d z = _mm256_div_pd(_mm256_sub_pd(m, one), _mm256_add_pd(m, one));
  const __m256d z2 = _mm256_mul_pd(z, z);
  __m256d series = _mm256_setzero_pd();
  for (int k = 12; k >= 0; k--) {
    series = _mm256_add_pd(_mm256_mul_pd(series, z2), _mm256_set1_pd(1.0 / (2 * k + 1)));
  }
  // e fits 32 bits: lanes 0, 2, 4, 6 of the 32-bit view are the low halves.
  const __m128i e32 = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(e, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6)));
  const __m256d ed = _mm256_cvtepi32_pd(e32);
  constexpr double kLn2 = 0.69314718055994530942;
  return _mm256_add_pd(_mm256_mul_pd(ed, _mm256_set1_pd(kLn2)),
                       _mm256_mul_pd(_mm256_mul_pd(_mm256_set1_pd(2.0), z), series));
}

// Each lane's standard normal from its first candidate pair, and the mask of rejected lanes
// (whose values are meaningless).
__attribute__((target("avx2"))) inline __m256d normal_x4(__m256i key, int* rejected) {
  const __m256d two = _mm256_set1_pd(2.0), one = _mm256_set1_pd(1.0);
  const __m256i stream = splitmix64_x4(key);
  const __m256i golden = _mm256_set1_epi64x(static_cast<long long>(0x9E3779B97F4A7C15ull));
  const __m256d v1 = _mm256_sub_pd(_mm256_mul_pd(two, unit_double_x4(splitmix64_x4(stream))), one);
  const __m256d v2 = _mm256_sub_pd(_mm256_mul_pd(two, unit_double_x4(splitmix64_x4(_mm256_add_epi64(stream, golden)))), one);
  const __m256d s = _mm256_add_pd(_mm256_mul_pd(v1, v1), _mm256_mul_pd(v2, v2));
  const __m256d bad = _mm256_or_pd(_mm256_cmp_pd(s, one, _CMP_GE_OQ), _mm256_cmp_pd(s, _mm256_setzero_pd(), _CMP_EQ_OQ));
  *rejected = _mm256_movemask_pd(bad);
  // Rejected lanes take s = 0.5 (any value in range): their results are replaced.
  const __m256d safe = _mm256_blendv_pd(s, _mm256_set1_pd(0.5), bad);
  return _mm256_mul_pd(v1, _mm256_sqrt_pd(_mm256_div_pd(_mm256_mul_pd(_mm256_set1_pd(-2.0), portable_log_x4(safe)), safe)));
}

}  // namespace

__attribute__((target("avx2"))) void portable_log_avx2(const double* x4, double* out4) {
  _mm256_storeu_pd(out4, portable_log_x4(_mm256_loadu_pd(x4)));
}

__attribute__((target("avx2"))) int normals_avx2(const uint64_t* keys4, double* out4) {
  int rejected = 0;
  _mm256_storeu_pd(out4, normal_x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys4)), &rejected));
  return rejected;
}

// Four elements at a time: each lane's first candidate pair; a lane whose pair is rejected
// (probability 1 - pi/4) is redone by the scalar normal_from_key, which gives the same bits.
__attribute__((target("avx2"))) size_t fill_normal_avx2(uint64_t param_key, double std_dev, size_t first_index,
                                                        std::span<float> out) {
  const size_t n = out.size() / 4 * 4;
  const __m256i pk = _mm256_set1_epi64x(static_cast<long long>(param_key));
  for (size_t i = 0; i < n; i += 4) {
    const auto first = static_cast<long long>(first_index + i);
    const __m256i idx = _mm256_add_epi64(_mm256_set1_epi64x(first), _mm256_setr_epi64x(0, 1, 2, 3));
    const __m256i key = splitmix64_x4(_mm256_xor_si256(pk, idx));
    int rejected = 0;
    const __m256d normal = normal_x4(key, &rejected);
    _mm_storeu_ps(out.data() + i, _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_set1_pd(std_dev), normal)));
    if (rejected != 0) {
      alignas(32) uint64_t keys[4];
      _mm256_store_si256(reinterpret_cast<__m256i*>(keys), key);
      for (int lane = 0; lane < 4; ++lane) {
        if ((rejected >> lane) & 1) out[i + lane] = static_cast<float>(std_dev * normal_from_key(keys[lane]));
      }
    }
  }
  return n;
}
#endif

}  // namespace detail

void init_param(const ParamSpec& spec, uint64_t seed, std::span<float> out, size_t element_offset) {
  assert(element_offset + out.size() <= spec.numel);
  switch (spec.init) {
    case ParamInit::kZeros:
      for (float& x : out) x = 0.0f;
      return;
    case ParamInit::kOnes:
      for (float& x : out) x = 1.0f;
      return;
    case ParamInit::kNormal: {
      const double std_dev = spec.init_std;
      const uint64_t param_key = detail::hash3(seed, static_cast<uint64_t>(spec.index), 0x67707432);
      // Every element comes from its own key, so chunks on the default pool's threads give the
      // bits one thread would (a 7B model's ~50 ns an element is minutes on one core).
      constexpr size_t kChunk = size_t{1} << 16;
      const size_t chunks = (out.size() + kChunk - 1) / kChunk;
      auto fill = [&](size_t c) {
        const size_t first = c * kChunk;
        detail::fill_normal(param_key, std_dev, element_offset + first,
                            out.subspan(first, std::min(kChunk, out.size() - first)), /*vector=*/true);
      };
      default_thread_pool().run(chunks, fill);  // one chunk runs on this thread
      return;
    }
  }
}

}  // namespace zinf::model
