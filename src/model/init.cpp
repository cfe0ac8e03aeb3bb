// Deterministic GPT-2 parameter initialisation, element by element from (seed, param, index).
#include <algorithm>
#include <cassert>
#include <cmath>

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
        const size_t end = std::min(out.size(), (c + 1) * kChunk);
        for (size_t i = c * kChunk; i < end; i++) {
          const uint64_t key = detail::splitmix64(param_key ^ (element_offset + i));
          out[i] = static_cast<float>(std_dev * detail::normal_from_key(key));
        }
      };
      if (chunks > 1) {
        default_thread_pool().run(chunks, fill);
      } else if (chunks == 1) {
        fill(0);
      }
      return;
    }
  }
}

}  // namespace zinf::model
