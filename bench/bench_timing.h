// Timing helpers the interleaved benchmarks share: best of three calls, and a median.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

namespace zinf::bench {

// Seconds of the fastest of three calls of fn.
template <typename Fn>
double best_of_3(Fn&& fn) {
  double best = 1e30;
  for (int r = 0; r < 3; r++) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// The median of v (the mean of the middle two for an even count); 0 when v is empty.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

}  // namespace zinf::bench
