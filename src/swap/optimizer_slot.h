// Internal: the optimizer swapper's pipeline slot and small helpers shared by its source files.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "zinf/swap/optimizer_swapper.h"
#include "zinf/swap/tensor_swapper.h"

namespace zinf::swap {

// One pipeline stage's pinned buffers and the I/O in flight on them.
struct OptimizerSwapper::Slot {
  PinnedBlock block;
  float* master = nullptr;     // (tile,) fp32
  std::vector<float*> states;  // state_count x (tile,) fp32
  std::byte* grad = nullptr;   // (tile,) gradient_dtype, when gradients are swapped
  std::byte* copy = nullptr;   // (tile,) 16-bit copies bound for a sink's write()
  std::vector<std::pair<SwapStore*, IoBatch>> reads, writes;
  std::vector<SwapTicket> copy_writes;
};

namespace detail {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The part of partition p (in sub-group elements) that overlaps [lo, hi), as [first, last).
struct Overlap {
  std::uint64_t first = 0;
  std::uint64_t last = 0;
  bool empty() const { return last <= first; }
};

inline Overlap overlap(const PartitionLayout& l, std::size_t p, std::uint64_t lo, std::uint64_t hi) {
  const std::uint64_t begin = l.offset_in_subgroup[p];
  return Overlap{std::max(lo, begin), std::min(hi, begin + l.params[p].numel)};
}

}  // namespace detail
}  // namespace zinf::swap
