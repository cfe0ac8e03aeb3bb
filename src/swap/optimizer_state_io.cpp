// OptimizerSwapper: streaming the initial master weights, gradients, 16-bit copies and state reads.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "swap/optimizer_slot.h"
#include "zinf/optim/half.h"
#include "zinf/swap/optimizer_swapper.h"
#include "zinf/swap/param_sink.h"

namespace zinf::swap {

using detail::overlap;
using detail::Overlap;

Status OptimizerSwapper::init_master(const MasterSource& source) {
  // Written to the uncommitted slot, then committed: a failure here leaves the old state.
  (void)cancel_read_ahead();  // of the state being replaced (its read errors no longer matter)
  const int target = 1 - slot_;
  const std::size_t n_slots = std::min<std::size_t>(slots_.size(), 2);
  Status st = [&]() -> Status {
    for (std::size_t i = 0; i < tiles_.size(); ++i) {
      const Tile& t = tiles_[i];
      Slot& s = *slots_[i % n_slots];
      ZINF_RETURN_IF_ERROR(wait_writes(s));
      std::memset(s.master, 0, t.length * 4);  // padding between partitions stays zero
      const SubGroup& g = layout_.subgroups[t.subgroup];
      for (std::size_t p = g.first_param; p < g.first_param + g.param_count; ++p) {
        const Overlap o = overlap(layout_, p, t.start, t.start + t.length);
        if (o.empty()) continue;
        ZINF_RETURN_IF_ERROR(source(p, o.first - layout_.offset_in_subgroup[p],
                                    std::span<float>(s.master + (o.first - t.start), o.last - o.first))
                                 .with_context(fmt::format("master weights of '{}'", layout_.params[p].key)));
      }
      ZINF_ASSIGN_OR_RETURN(IoBatch b,
                            store_->write_async(state_key(t.subgroup, 0, target), t.start * 4, s.master, t.length * 4));
      s.writes.emplace_back(store_.get(), std::move(b));
    }
    return Status::ok();
  }();
  const Status drained = drain();
  if (st.is_ok()) st = drained;
  if (!st.is_ok()) return st.with_context("writing the initial master weights");
  return commit_metadata(target, 0, false, true);
}

Status OptimizerSwapper::write_gradients(std::size_t subgroup, const void* data) {
  if (!grad_store_) return Status::invalid_argument("write_gradients: gradients are not swapped (swap_gradients)");
  ZINF_RETURN_IF_ERROR(wait_gradient_transfers());
  if (subgroup >= layout_.subgroups.size()) {
    return Status::invalid_argument(fmt::format("write_gradients: no sub-group {}", subgroup));
  }
  const std::size_t esize = dtype_size(config_.gradient_dtype);
  const std::size_t n_slots = std::min<std::size_t>(slots_.size(), 2);
  std::size_t i = 0;
  Status st = [&]() -> Status {
    for (const Tile& t : tiles_) {
      if (t.subgroup != subgroup) continue;
      Slot& s = *slots_[i++ % n_slots];
      ZINF_RETURN_IF_ERROR(wait_writes(s));
      std::memcpy(s.grad, static_cast<const std::byte*>(data) + t.start * esize, t.length * esize);
      ZINF_ASSIGN_OR_RETURN(IoBatch b,
                            grad_store_->write_async(grad_key(subgroup), t.start * esize, s.grad, t.length * esize));
      s.writes.emplace_back(grad_store_.get(), std::move(b));
    }
    return Status::ok();
  }();
  // Writes only: a read ahead of the step (read_ahead) stays in flight for the step.
  const Status drained = drain_writes();
  if (st.is_ok()) st = drained;
  return st.with_context(fmt::format("writing the gradients of sub-group {}", subgroup));
}

namespace {

// Bytes of a gradient range transfer: count rounded up to kAlign elements (a multiple of 4 KiB,
// within the sub-group, whose length is a multiple of kAlign).
Result<std::uint64_t> gradient_range_bytes(const PartitionLayout& layout, bool swapped, DType dtype,
                                           std::size_t subgroup, std::uint64_t start, std::uint64_t count) {
  if (!swapped || dtype != DType::kF32) {
    return Status::invalid_argument("gradient ranges: gradients are not swapped as fp32 (swap_gradients)");
  }
  if (subgroup >= layout.subgroups.size() || start % PartitionLayout::kAlign != 0 ||
      start + align_up(count, PartitionLayout::kAlign) > layout.subgroups[subgroup].numel) {
    return Status::invalid_argument(fmt::format("gradient range [{}, +{}) of sub-group {}: outside it or unaligned",
                                                start, count, subgroup));
  }
  return align_up(count, PartitionLayout::kAlign) * sizeof(float);
}

}  // namespace

Status OptimizerSwapper::write_gradient_range(std::size_t subgroup, std::uint64_t start, std::uint64_t count,
                                              const float* buffer) {
  ZINF_ASSIGN_OR_RETURN(const std::uint64_t bytes, gradient_range_bytes(layout_, grad_store_ != nullptr,
                                                                        config_.gradient_dtype, subgroup, start, count));
  ZINF_RETURN_IF_ERROR(wait_gradient_transfers());
  return grad_store_->write(grad_key(subgroup), start * sizeof(float), buffer, bytes);
}

Status OptimizerSwapper::start_gradient_range_write(std::size_t subgroup, std::uint64_t start, std::uint64_t count,
                                                    const float* buffer) {
  ZINF_ASSIGN_OR_RETURN(const std::uint64_t bytes, gradient_range_bytes(layout_, grad_store_ != nullptr,
                                                                        config_.gradient_dtype, subgroup, start, count));
  ZINF_RETURN_IF_ERROR(wait_gradient_write());
  const std::uint64_t end = start + bytes / sizeof(float);
  if (grad_read_.overlaps(subgroup, start, end)) ZINF_RETURN_IF_ERROR(wait_gradient_read());
  ZINF_ASSIGN_OR_RETURN(IoBatch b, grad_store_->write_async(grad_key(subgroup), start * sizeof(float), buffer, bytes));
  grad_write_ = GradRange{std::move(b), subgroup, start, end};
  return Status::ok();
}

Status OptimizerSwapper::wait_gradient_write() {
  if (grad_write_.batch.empty()) return Status::ok();
  return grad_store_->wait(grad_write_.batch);  // empties the batch, failed or not
}

Status OptimizerSwapper::start_gradient_range_read(std::size_t subgroup, std::uint64_t start, std::uint64_t count,
                                                   float* buffer) {
  ZINF_ASSIGN_OR_RETURN(const std::uint64_t bytes, gradient_range_bytes(layout_, grad_store_ != nullptr,
                                                                        config_.gradient_dtype, subgroup, start, count));
  ZINF_RETURN_IF_ERROR(wait_gradient_read());
  const std::uint64_t end = start + bytes / sizeof(float);
  if (grad_write_.overlaps(subgroup, start, end)) ZINF_RETURN_IF_ERROR(wait_gradient_write());
  ZINF_ASSIGN_OR_RETURN(IoBatch b, grad_store_->read_async(grad_key(subgroup), start * sizeof(float), buffer, bytes));
  grad_read_ = GradRange{std::move(b), subgroup, start, end};
  return Status::ok();
}

Status OptimizerSwapper::wait_gradient_read() {
  if (grad_read_.batch.empty()) return Status::ok();
  return grad_store_->wait(grad_read_.batch);
}

Status OptimizerSwapper::wait_gradient_transfers() {
  const Status read = wait_gradient_read();
  const Status write = wait_gradient_write();
  return read.is_ok() ? write : read;
}

Status OptimizerSwapper::read_gradient_range(std::size_t subgroup, std::uint64_t start, std::uint64_t count,
                                             float* buffer) {
  ZINF_ASSIGN_OR_RETURN(const std::uint64_t bytes, gradient_range_bytes(layout_, grad_store_ != nullptr,
                                                                        config_.gradient_dtype, subgroup, start, count));
  ZINF_RETURN_IF_ERROR(wait_gradient_transfers());
  return grad_store_->read(grad_key(subgroup), start * sizeof(float), buffer, bytes);
}

Status OptimizerSwapper::read_state(std::size_t subgroup, std::size_t which, std::span<float> out) {
  if (subgroup >= layout_.subgroups.size() || which > optimizer_.state_count() ||
      out.size() != layout_.subgroups[subgroup].numel) {
    return Status::invalid_argument(fmt::format(
        "read_state(sub-group {}, tensor {}) with {} elements: {} sub-groups, {} tensors each", subgroup, which,
        out.size(), layout_.subgroups.size(), 1 + optimizer_.state_count()));
  }
  if (!master_written_ || (which > 0 && !states_created_)) {
    std::fill(out.begin(), out.end(), 0.0f);  // not created yet: zeros, as the first step sees them
    return Status::ok();
  }
  // Slot 0 is the bounce buffer: a read ahead is waited for and dropped (its errors with it; the
  // reads below go to the same state and report their own).
  (void)cancel_read_ahead();
  Slot& s = *slots_[0];
  for (const Tile& t : tiles_) {
    if (t.subgroup != subgroup) continue;
    ZINF_RETURN_IF_ERROR(store_->read(state_key(subgroup, which, slot_), t.start * 4, s.master, t.length * 4));
    std::memcpy(out.data() + t.start, s.master, t.length * 4);
  }
  return Status::ok();
}

Status OptimizerSwapper::load_state(std::size_t subgroup, std::size_t which, std::span<const float> in) {
  const std::size_t tensors = 1 + optimizer_.state_count();
  if (subgroup >= layout_.subgroups.size() || which >= tensors || in.size() != layout_.subgroups[subgroup].numel) {
    return Status::invalid_argument(fmt::format(
        "load_state(sub-group {}, tensor {}) with {} elements: {} sub-groups, {} tensors each", subgroup, which,
        in.size(), layout_.subgroups.size(), tensors));
  }
  const int target = 1 - slot_;
  (void)cancel_read_ahead();  // slot 0 is the bounce buffer, and the committed state is replaced
  Slot& s = *slots_[0];
  for (const Tile& t : tiles_) {
    if (t.subgroup != subgroup) continue;
    std::memcpy(s.master, in.data() + t.start, t.length * 4);
    ZINF_RETURN_IF_ERROR(store_->write(state_key(subgroup, which, target), t.start * 4, s.master, t.length * 4)
                             .with_context("loading optimizer state"));
  }
  loaded_.resize(layout_.subgroups.size() * tensors, false);
  loaded_[subgroup * tensors + which] = true;
  if (std::find(loaded_.begin(), loaded_.end(), false) != loaded_.end()) return Status::ok();
  return commit_metadata(target, committed_step_, true, true);
}

Status OptimizerSwapper::write_param_copies(ParamSink& sink) {
  if (!master_written_) return Status::invalid_argument("write_param_copies: no master weights yet");
  (void)cancel_read_ahead();  // slot 0 is the bounce buffer; the reads below report their own errors
  Slot& s = *slots_[0];
  const DType dtype = sink.dtype();
  for (const Tile& t : tiles_) {
    ZINF_RETURN_IF_ERROR(store_->read(state_key(t.subgroup, 0, slot_), t.start * 4, s.master, t.length * 4));
    const std::span<const float> master(s.master, t.length);
    if (void* host = sink.host_subgroup(t.subgroup)) {
      void* dst = static_cast<std::byte*>(host) + t.start * dtype_size(dtype);
      if (dtype == DType::kF32) {
        std::memcpy(dst, master.data(), master.size_bytes());
      } else {
        ZINF_RETURN_IF_ERROR(optim::convert_from_f32(master, dst, dtype, config_.exec));
      }
      continue;
    }
    if (dtype != DType::kF32) ZINF_RETURN_IF_ERROR(optim::convert_from_f32(master, s.copy, dtype, config_.exec));
    ZINF_RETURN_IF_ERROR(write_copies(s, t, sink));
    ZINF_RETURN_IF_ERROR(wait_writes(s));
  }
  return Status::ok();
}

}  // namespace zinf::swap
