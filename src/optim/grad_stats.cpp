// The fused overflow check and squared norm over the gradients, and the clipping formula.
#include "zinf/optim/grad_stats.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "optim/exec.h"
#include "zinf/optim/clipping.h"

namespace zinf::optim {

bool GradStats::finite() const { return std::isfinite(sq_norm); }

static_assert(kGradStatsBlock == detail::kNormBlock, "grad_stats.h states the kernels' block");

Status grad_block_sums(const GradView& grad, std::span<double> out, const ExecOptions& exec) {
  const std::size_t n = grad.size;
  if (n > 0 && grad.data == nullptr) return Status::invalid_argument("grad_stats: null gradient");
  if (reinterpret_cast<std::uintptr_t>(grad.data) % dtype_size(grad.dtype) != 0) {
    return Status::invalid_argument(fmt::format("grad_stats: {} gradient at {} is not aligned to its element size",
                                                dtype_name(grad.dtype), grad.data));
  }
  const std::size_t blocks = (n + detail::kNormBlock - 1) / detail::kNormBlock;
  if (out.size() != blocks) {
    return Status::invalid_argument(
        fmt::format("grad_block_sums: {} sums for {} elements, which are {} blocks", out.size(), n, blocks));
  }
  ZINF_ASSIGN_OR_RETURN(const detail::KernelTable* kernels, detail::resolve_kernels(exec));
  // Pieces start on block boundaries, so every block is summed whole by one thread.
  detail::parallel_ranges(exec, n, detail::kNormBlock, [&](std::size_t b, std::size_t e) {
    kernels->sq_norm_blocks(grad.data, grad.dtype, b, e, out.data() + b / detail::kNormBlock);
  });
  return Status::ok();
}

Result<GradStats> grad_stats(const GradView& grad, const ExecOptions& exec) {
  std::vector<double> block_sums((grad.size + detail::kNormBlock - 1) / detail::kNormBlock);
  ZINF_RETURN_IF_ERROR(grad_block_sums(grad, block_sums, exec));
  GradStats stats;
  stats.elements = grad.size;
  for (double s : block_sums) stats.sq_norm += s;
  return stats;
}

ClipResult clip_gradients(double scaled_norm, double loss_scale, double max_norm) {
  ClipResult r;
  r.norm = scaled_norm / loss_scale;
  double combined = loss_scale;
  if (max_norm > 0.0) {
    const double clip = (r.norm + 1e-6) / max_norm;
    if (clip > 1.0) {
      combined = clip * loss_scale;
      r.clipped = true;
    }
  }
  r.grad_scale = 1.0 / combined;
  return r;
}

}  // namespace zinf::optim
