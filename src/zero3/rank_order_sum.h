// Internal: the communicators' reproducible reduction: W blocks summed elementwise in rank order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>

namespace zinf::zero3 {

// out[i] = ((blocks[0*n + i] + blocks[1*n + i]) + ...) + blocks[(W-1)*n + i], for n = out.size().
// The same order for every element and every run, so the same bits; done in L1-sized chunks so
// each output element is written once per block while it is still in cache (one pass instead of
// a copy plus W-1 read-modify-write sweeps).
template <typename T>
void sum_in_rank_order(const T* blocks, int world, std::span<T> out) {
  constexpr std::size_t kChunk = 2048;
  const std::size_t n = out.size();
  for (std::size_t at = 0; at < n; at += kChunk) {
    const std::size_t len = std::min(kChunk, n - at);
    T* dst = out.data() + at;
    std::copy_n(blocks + at, len, dst);
    for (int r = 1; r < world; ++r) {
      const T* src = blocks + n * static_cast<std::size_t>(r) + at;
      for (std::size_t i = 0; i < len; ++i) dst[i] += src[i];
    }
  }
}

}  // namespace zinf::zero3
