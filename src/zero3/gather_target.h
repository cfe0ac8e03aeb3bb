// Internal: where the coordinator gathers a partition group's full values for the model.
//
// Host memory today (make_host_gather_target). A device-resident engine gathers into device
// memory instead: its target allocates device blocks and fills them from the tier through a
// staging copy and a device all-gather; the coordinator's budget, trace, prefetch and reuse
// logic stay as they are. The model receives pointers into the target's memory
// (model::ParamAccess::acquire), so the target must match where the model computes.
//
// Threading: a target is used by one coordinator, from the thread that drives its passes.
#pragma once

#include <cstddef>
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
  // Fills `block` (W * per_rank elements) with `group`'s full values: this rank's slice
  // [rank * per_rank, (rank + 1) * per_rank) from the tier, then the all-gather in place.
  // Returns once the values are usable by the model.
  virtual Status gather(ParamTier& tier, std::size_t group, std::size_t per_rank, Communicator& comm,
                        GatherBlock& block) = 0;

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
