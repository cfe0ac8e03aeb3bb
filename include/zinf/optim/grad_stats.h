// One read over the gradients gives both the overflow check and the squared norm.
#pragma once

#include <cstddef>
#include <span>

#include "zinf/optim/isa.h"
#include "zinf/optim/optimizer.h"
#include "zinf/status.h"

namespace zinf::optim {

struct GradStats {
  // Sum of squares of the elements as stored (GradView::scale is ignored), in double. Each
  // square is exact in double, so the sum is +inf or NaN exactly when an element is inf or NaN.
  double sq_norm = 0.0;
  std::size_t elements = 0;

  bool finite() const;  // false means overflow: skip the step
  // Sums in a fixed order: fold the stats of several spans (sub-groups, ranks) one after the
  // other, always in the same order, to get the same norm on every run.
  GradStats& operator+=(const GradStats& other) {
    sq_norm += other.sq_norm;
    elements += other.elements;
    return *this;
  }
};

// Deterministic: the span is cut into blocks of 8192 elements at fixed offsets; each block
// sums its squares into 16 lanes (element i into lane i % 16) that are then added in lane
// order, and block sums are added in block order. So the result is the same for every ISA
// and thread count (it does depend on where a span starts, so sum the same spans each step).
Result<GradStats> grad_stats(const GradView& grad, const ExecOptions& exec = {});

// grad_stats' block length.
inline constexpr std::size_t kGradStatsBlock = 8192;
// The sums of squares of grad's blocks (as stored), block j covering [j * kGradStatsBlock,
// min(size, (j + 1) * kGradStatsBlock)), into out (out.size() == the block count). grad_stats is
// 0.0 plus these in block order, so a caller that keeps them for parts of a span can fold the
// span's grad_stats later, bit for bit.
Status grad_block_sums(const GradView& grad, std::span<double> out, const ExecOptions& exec = {});

}  // namespace zinf::optim
