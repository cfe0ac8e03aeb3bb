// Internal: a deterministic parallel loop for the model's row-wise kernels.
#pragma once

#include <algorithm>
#include <cstddef>

#include "zinf/thread_pool.h"

namespace zinf::model::detail {

// Calls fn(begin, end) over [0, n) in chunks of `grain` items on zinf's default thread pool.
// Chunking depends only on n and grain, never on the thread count, and every item belongs to
// exactly one chunk, so a kernel whose items write disjoint outputs gives the same bits with
// any number of threads. `work_per_item` (in rough flops) keeps small loops on the caller.
template <typename Fn>
void parallel_for(size_t n, size_t grain, size_t work_per_item, Fn&& fn) {
  constexpr size_t kMinParallelWork = 1 << 16;
  grain = std::max<size_t>(grain, 1);
  const size_t chunks = (n + grain - 1) / grain;
  if (chunks <= 1 || n * work_per_item < kMinParallelWork) {
    fn(size_t{0}, n);
    return;
  }
  default_thread_pool().run(chunks, [&](size_t c) { fn(c * grain, std::min(n, (c + 1) * grain)); });
}

// Rows per chunk so that a chunk is ~32K flops of `row_work` each.
inline size_t row_grain(size_t row_work) {
  return std::max<size_t>(1, (size_t{1} << 15) / std::max<size_t>(row_work, 1));
}

// Columns per task of a column reduction in which one task sums each column over all rows in row
// order. Such a kernel's bits do not depend on the split, so the split may follow the thread
// count: one contiguous slice per thread (rounded to 16 floats). Narrow slices read a short run
// out of every row, which the prefetcher does not follow: 64-column slices of a (2048, 1536)
// matrix ran slower on two threads than the serial loop.
inline size_t column_slice_grain(size_t columns) {
  const size_t threads = default_thread_pool().threads();
  const size_t width = (columns + threads - 1) / threads;
  return std::max<size_t>(16, (width + 15) / 16 * 16);
}

}  // namespace zinf::model::detail
