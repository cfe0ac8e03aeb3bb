// Internal: picks the kernel table for a call and cuts [0, n) into pieces for the thread pool.
#pragma once

#include <algorithm>
#include <cstddef>

#include "optim/kernels.h"
#include "zinf/optim/isa.h"
#include "zinf/status.h"
#include "zinf/thread_pool.h"

namespace zinf::optim::detail {

// The kernels for exec.isa (or active_isa()); an error when the chosen ISA cannot run here.
Result<const KernelTable*> resolve_kernels(const ExecOptions& exec);

// Calls fn(begin, end) on consecutive pieces of [0, n) whose boundaries are multiples of
// `align` elements, spread over the pool (at most one piece per thread, each at least
// exec.min_elements_per_thread long), and returns when all are done. fn must not throw.
template <typename Fn>
void parallel_ranges(const ExecOptions& exec, std::size_t n, std::size_t align, Fn&& fn) {
  if (n == 0) return;
  const std::size_t min_piece = std::max<std::size_t>(exec.min_elements_per_thread, 1);
  std::size_t pieces = n / min_piece;
  if (pieces <= 1) {
    fn(std::size_t{0}, n);
    return;
  }
  ThreadPool& pool = exec.pool != nullptr ? *exec.pool : default_thread_pool();
  pieces = std::min(pieces, pool.threads());
  std::size_t piece = (n + pieces - 1) / pieces;
  piece = (piece + align - 1) / align * align;
  pieces = (n + piece - 1) / piece;
  if (pieces <= 1) {
    fn(std::size_t{0}, n);
    return;
  }
  pool.run(pieces, [&](std::size_t i) { fn(i * piece, std::min(n, (i + 1) * piece)); });
}

}  // namespace zinf::optim::detail
