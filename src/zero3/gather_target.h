// Internal: where the coordinator keeps a module's memory: its partition groups' full values,
// gathered for the model, and their gradients.
//
// Host memory (make_host_gather_target), or device memory (device_gather_target.h: blocks of a
// device::Device, filled through staging and the H2D stream, gradients drained through the D2H
// stream). The coordinator's budget, trace, prefetch and reuse logic are the same for both. The
// model receives pointers into the target's memory (model::ParamAccess::acquire and
// grad_buffers), so the target must match where the model computes.
//
// Threading: a target is used by one coordinator, from the thread that drives its passes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "zero3/tiers.h"
#include "zinf/status.h"
#include "zinf/zero3/comm.h"

namespace zinf::zero3 {

class GatherTarget;

namespace detail {
// Hands a block back to the target that made it.
struct GatherRelease {
  GatherTarget* target = nullptr;
  std::size_t size = 0;
  void operator()(float* p) const;
};
}  // namespace detail

// One gathered group's storage in a target's memory (fp32 elements): move-only; handed back to
// its target when destroyed, so the target must outlive its blocks.
class GatherBlock {
 public:
  GatherBlock() = default;
  float* data() const { return data_.get(); }
  std::size_t size() const { return data_ ? data_.get_deleter().size : 0; }
  std::span<float> span() const { return {data(), size()}; }

 private:
  friend class GatherTarget;
  GatherBlock(float* data, detail::GatherRelease release) : data_(data, release) {}
  std::unique_ptr<float, detail::GatherRelease> data_;
};

class GatherTarget {
 public:
  virtual ~GatherTarget() = default;
  virtual std::string_view name() const = 0;
  // A block of n elements, contents undefined; an empty block (data() == nullptr) when n == 0 or
  // the memory is exhausted (the caller names what it was for).
  virtual GatherBlock allocate(std::size_t n) = 0;
  // The element type of the value blocks (allocate_values, gather): fp32 (what acquire hands
  // out), or bf16 for a target that gathers in a GPU model's compute dtype (acquire_bf16).
  virtual swap::DType values_dtype() const { return swap::DType::kF32; }
  // A block for n gathered values of values_dtype(); size() counts elements, not floats.
  virtual GatherBlock allocate_values(std::size_t n) { return allocate(n); }
  // Fills `block` (W * per_rank elements) with `group`'s full values: this rank's slice
  // [rank * per_rank, (rank + 1) * per_rank) from the tier, then the all-gather in place.
  // Returns once the values are usable by the model, unless the target is asynchronous().
  virtual Status gather(ParamTier& tier, std::size_t group, std::size_t per_rank, Communicator& comm,
                        GatherBlock& block) = 0;
  // Whether gather() may return before the values have landed. Then the model may read a block
  // only after ready(block), and the coordinator starts gathers ahead of use along the trace.
  virtual bool asynchronous() const { return false; }
  // Makes `block`'s gathered values usable by the model (waits for the transfers that fill it).
  virtual Status ready(GatherBlock&) { return Status::ok(); }
  // Sets every element of a block the model will add gradients into to zero, before it does.
  virtual Status zero(GatherBlock& block) = 0;

  // Gradient downloads, for asynchronous targets (the others hand out host memory, which the
  // coordinator reads in place). start_download copies `n` elements of `src` from `offset` to host
  // memory; `src` may be handed back right after (the target fences it). finish_download gives
  // the landed elements (wait: blocking until they have; else an empty span while in flight),
  // valid until release_download(ticket).
  virtual Result<std::uint64_t> start_download(const GatherBlock& src, std::size_t offset, std::size_t n);
  virtual Result<std::span<const float>> finish_download(std::uint64_t ticket, bool wait);
  virtual void release_download(std::uint64_t ticket);
  // Downloads started and not yet released that this target holds staging for; the coordinator
  // finishes the oldest before starting one past it, so that pinned staging stays bounded.
  virtual std::size_t max_downloads_in_flight() const { return SIZE_MAX; }
  // acc[i] += in[i] for i < acc.size() (in at least as large), both blocks of this target: a
  // gradient summed across micro-batches where it was computed (Coordinator::set_hold_gradients).
  // fp32 adds, the sums the gradient store would make. An asynchronous target orders it after the
  // compute work enqueued so far; `in` may be handed back right after.
  virtual Status add(GatherBlock& acc, const GatherBlock& in);

  // Gradient reduction across ranks, for targets whose memory the host collectives cannot read
  // (W > 1 on a GPU). When reduces_in_place(), the coordinator hands each complete gradient to
  // reduce_scatter instead of the communicator, and then downloads the rank's slice
  // [rank * per_rank, (rank + 1) * per_rank) of it; the target orders the reduction after the
  // compute work enqueued so far and the download after the reduction.
  virtual bool reduces_in_place() const { return false; }
  virtual Status reduce_scatter(GatherBlock& grad, std::size_t per_rank);
  // Returns once the collectives this target has enqueued have completed: the coordinator calls
  // it before each host collective of its own and at the end of a pass (device_collectives.h).
  virtual Status finish_collectives() { return Status::ok(); }

 protected:
  // Wraps memory this target allocated; free() gets it back.
  GatherBlock adopt(float* data, std::size_t n) { return GatherBlock(data, detail::GatherRelease{this, n}); }
  virtual void free(float* data, std::size_t n) = 0;

 private:
  friend struct detail::GatherRelease;
};

inline void detail::GatherRelease::operator()(float* p) const {
  if (p != nullptr) target->free(p, size);
}

// Gathers into 64-byte aligned host memory, reading fp32 from the tier and all-gathering with
// the communicator's host collective.
std::unique_ptr<GatherTarget> make_host_gather_target();

}  // namespace zinf::zero3
