// Internal: the ZeRO-3 parameter coordinator: gathers partition groups (the parameters a module
// owns, one flat array) into full fp32 values for the model module by module, one in-place
// all-gather per group; prefetches along the recorded trace, holds gathered elements under a hard
// max_live_parameters budget, checks that all ranks record the same trace, and reduce-scatters
// gradients into the rank's fp32 gradient partitions in reduce_bucket_size buckets.
//
// Its memory (gathered values and gradient buffers) is the gather target's: host memory, or a
// device's (gather_target.h). With an asynchronous (device) target, the next module's groups are
// gathered (uploaded) while the current module computes, and each completed gradient is
// downloaded on the device's D2H stream and added into its partition once it has landed, while
// backward goes on; end_pass() waits for the last ones. The sums are the same, in the same
// order, so the results are bit-identical to the host target's.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <vector>

#include "zero3/gather_target.h"
#include "zero3/grad_store.h"
#include "zero3/tiers.h"
#include "zinf/model/float_buffer.h"
#include "zinf/model/model.h"
#include "zinf/status.h"
#include "zinf/swap/optimizer_swapper.h"
#include "zinf/zero3/comm.h"
#include "zinf/zero3/partition.h"

namespace zinf::zero3 {

struct CoordinatorOptions {
  std::uint64_t prefetch_bucket_size = 50000000;
  std::uint64_t param_persistence_threshold = 100000;
  std::uint64_t model_persistence_threshold = UINT64_MAX;
  std::uint64_t max_live_parameters = 1000000000;
  std::uint64_t max_reuse_distance = 1000000000;
  std::uint64_t reduce_bucket_size = 500000000;
  // Gradient elements that may be summed across micro-batches in the target's memory instead of
  // coming back after each one (set_hold_gradients; an asynchronous target and one rank).
  std::uint64_t hold_gradient_elements = 0;
};

struct CoordinatorStats {
  std::uint64_t gathers = 0;            // partition groups gathered into full values
  std::uint64_t gathered_elements = 0;
  std::uint64_t prefetches = 0;         // partitions prefetched along the trace
  std::uint64_t gathers_ahead = 0;      // gathers an asynchronous target started before the module asked
  std::uint64_t ahead_hits = 0;         // acquires served by a gather started ahead
  std::uint64_t reuse_hits = 0;         // acquires served by a kept (released) copy
  std::uint64_t evictions = 0;          // kept copies dropped to stay under the budget
  std::uint64_t live_high_water = 0;    // most non-persistent gathered elements at once (buffers,
                                        // W * ceil(n / W) a group)
  std::uint64_t persistent_elements = 0;
  std::uint64_t trace_invalidations = 0;
  std::uint64_t buckets = 0;            // gradient reduce-scatters
  std::uint64_t grad_allocations = 0;   // gradient buffers allocated (not reused from a pass before)
  std::uint64_t grad_downloads = 0;     // gradient slices downloaded (asynchronous target)
  std::uint64_t grad_high_water = 0;    // most gradient elements held at once, in use or kept
  std::uint64_t held_high_water = 0;    // most gradient elements summed in the target's memory at once
                                        // (set_hold_gradients)
  double backward_start_s = 0;          // seconds into the micro-step when backward began
  // Seconds so far in the gather target's gathers (a synchronous target: the tier's reads and
  // their conversion to fp32, and the all-gather) and in the gradient store's accumulations (its
  // NVMe reads and writes included): the passes' time that is not the model's own.
  double gather_s = 0;
  double grad_store_s = 0;
  std::uint64_t train_trace_hash = 0;   // chained XXH3 of the recorded train trace (module, phase)
};

// Freed buffers kept for reuse by exact size (a model's layers repeat their shapes), so a pass
// takes memory it already touched instead of faulting in fresh pages. Buffer: a move-only owner
// with data() and size() (model::FloatBuffer, GatherBlock).
template <typename Buffer>
class SparePool {
 public:
  // A kept buffer of n elements, else an empty one (the caller allocates).
  Buffer take(std::size_t n) {
    auto it = bufs_.find(n);
    if (it == bufs_.end()) return Buffer();
    Buffer b = std::move(it->second);
    bufs_.erase(it);
    elements_ -= n;
    return b;
  }
  bool holds(std::size_t n) const { return bufs_.count(n) > 0; }
  void keep(Buffer b) {  // empty buffers are ignored
    if (b.data() == nullptr) return;
    const std::size_t n = b.size();
    elements_ += n;
    bufs_.emplace(n, std::move(b));
  }
  // Frees kept buffers, smallest first, until at most max_elements are kept.
  void trim_to(std::uint64_t max_elements) {
    while (!bufs_.empty() && elements_ > max_elements) {
      elements_ -= bufs_.begin()->first;
      bufs_.erase(bufs_.begin());
    }
  }
  std::uint64_t elements() const { return elements_; }

 private:
  std::multimap<std::size_t, Buffer> bufs_;
  std::uint64_t elements_ = 0;
};

class Coordinator final : public model::ParamAccess {
 public:
  // grad_store: the rank's fp32 gradient partitions (grad_store.h); the coordinator adds every
  // micro-step's reduced gradients into them. target: where
  // groups are gathered (the model gets pointers into its memory). Every reference must outlive
  // the coordinator.
  Coordinator(const model::Model& model, const PartitionPlan& plan, const swap::PartitionLayout& layout,
              ParamTier& tier, GatherTarget& target, Communicator& comm, const CoordinatorOptions& options,
              GradStore& grad_store);

  // Before each forward/backward (train) or forward_loss (eval).
  void begin_pass(bool train);
  // After it: flushes the last gradient bucket; every module must have been released.
  Status end_pass();
  // After an optimizer step changed the partitions: every gathered copy is stale.
  void invalidate_gathered();
  const CoordinatorStats& stats() const { return stats_; }
  // Called with each partition whose reduced gradient has just been added into the rank's
  // partition (from the thread that drives the passes); empty: none. The engine sets it for the
  // last micro-batch, whose additions are final (early_step.h).
  void set_on_gradient_added(std::function<void(std::size_t partition)> fn) { on_added_ = std::move(fn); }
  // For the passes until the next call, with an asynchronous target and one rank: whether each
  // group's gradient is summed in the target's memory (hold, up to hold_gradient_elements in all;
  // the rest come back as usual) instead of being downloaded and added into its partition. A pass
  // without hold adds every held sum in with its own gradients and brings it back, once. The
  // partitions end with the same bits either way: the target adds the same fp32 values in the same
  // order as the gradient store, and a held sum is added into a zeroed partition, which only
  // turns a -0 into +0, as the store's own first addition does.
  void set_hold_gradients(bool hold) { hold_ = hold; }
  // Drops every held sum (a step that failed, or the start of a step).
  void drop_held_gradients();
  // For the passes until the next call: whether the next pass of the same mode runs on the same
  // values (another micro-batch before the optimizer step). Then a copy whose trace has no further
  // use in this pass is measured against max_reuse_distance to its first use in the next pass
  // (the rest of this pass's traffic plus the next's up to it) instead of being freed at once, so
  // that with room in the live budget a step gathers each group once, not once per micro-batch.
  // The values read are the same bits either way; the engine drops every copy after the step.
  void set_next_pass_reuses_values(bool reuses) { next_pass_reuses_ = reuses; }
  std::uint64_t live_elements() const { return live_; }

  Status acquire(int module, model::Phase phase, std::span<const float*> values) override;
  // With one rank and a parameter tier whose every partition of the module is bf16 in the target's
  // device memory (ParamTier::device_values: the state on the device): pointers into it, nothing
  // gathered; and from then on no gathers ahead for groups served so.
  Status acquire_bf16(int module, model::Phase phase, std::span<const std::uint16_t*> values) override;
  Status release(int module, model::Phase phase) override;
  Status grad_buffers(int module, std::span<float*> grads) override;
  Status grads_ready(int module) override;

 private:
  struct Gathered {
    GatherBlock buf;
    bool valid = false;
    bool persistent = false;
    bool prefetched = false;
    bool ahead = false;  // gathered by gather_ahead(), not yet acquired
    int users = 0;
  };
  // The order in which modules acquired parameters in one pass, flattened to groups.
  struct Trace {
    bool complete = false;            // recorded over a whole pass and not invalidated since
    bool recording = true;
    std::vector<int> events;          // module per acquire
    std::vector<std::size_t> event_first;  // first index into groups for each event
    std::vector<int> groups;          // partition group per use, in order
    std::vector<std::uint64_t> traffic;    // prefix sums of gathered elements over groups
    std::uint64_t hash = 0;           // chained XXH3 over (module, phase) per event
  };

  // The distinct groups module's parameters belong to, in parameter order.
  const std::vector<int>& groups_of(int module) const { return module_groups_[static_cast<std::size_t>(module)]; }
  std::size_t gathered_size(std::size_t group) const;  // W * ceil(n / W)
  Status check_agreement(std::uint64_t module, std::uint64_t phase, const char* what);
  Status check_trace_hash(const Trace& t);
  // The bookkeeping of an acquire before anything is gathered: backward's start, the trace.
  Status note_event(int module, model::Phase phase);
  // Group g's values as bf16 in device memory (ParamTier::device_values), else nullptr.
  const std::uint16_t* device_bf16(int g);
  // What acquire() and acquire_bf16() of gathered values share: the module's groups gathered,
  // ready and pinned (users), before the caller hands out pointers; then after_acquire().
  Status acquire_gathered(int module, model::Phase phase);
  // The event done: prefetches and gathers ahead of the next.
  Status after_acquire();
  // `block`: a spare of the group's exact size taken for it, or empty (then a spare, else a new one).
  Status ensure_gathered(int g, GatherBlock block);
  Status start_gather(int g, GatherBlock block);  // fills group g's gathered block (bookkeeping included)
  // Starts gathering the groups of the event after `event` (asynchronous targets), within the
  // live budget's free room: no eviction for it.
  Status gather_ahead(std::size_t event);
  // Adds landed gradient downloads into their partitions, oldest first; with wait, blocks until at
  // most `leave` are still in flight (all, by default).
  Status drain_downloads(bool wait, std::size_t leave = 0);
  Status accumulate(std::size_t group, const float* reduced);  // into the gradient store
  // An asynchronous target's gradient of group g with one rank (flush_bucket's case with nothing
  // reduced): into its held sum, or (with that sum) downloaded for accumulate().
  Status hold_or_download(std::size_t g);
  // Evicts kept copies until `need` more elements fit beside the live ones (spares are the
  // caller's to trim, after it has taken the ones it reuses).
  Status make_room(std::uint64_t need, int module);
  // Frees spare blocks until they fit beside live_ + need under max_live_parameters.
  void trim_spare_for(std::uint64_t need);
  void drop(int g);  // releases partition group g's gathered copy (its buffer kept for reuse or freed)
  void prefetch_after(std::size_t event);
  void finish_trace(Trace& t);
  std::uint64_t next_use_distance(int g) const;
  void give_buffer(GatherBlock b);
  Status flush_bucket();
  Trace& trace() { return train_ ? train_trace_ : eval_trace_; }
  const Trace& trace() const { return train_ ? train_trace_ : eval_trace_; }

  const model::Model& model_;
  const PartitionPlan& plan_;
  const swap::PartitionLayout& layout_;
  ParamTier& tier_;
  GatherTarget& target_;
  Communicator& comm_;
  CoordinatorOptions opt_;
  GradStore& grad_store_;

  std::vector<std::vector<int>> module_groups_;
  std::vector<Gathered> gathered_;         // per group
  std::vector<GatherBlock> grads_;  // gathered-size gradients of this pass, per group (target memory)
  SparePool<GatherBlock> spare_;  // freed gathered blocks; live_ + spare_ stays within max_live_parameters
  // Freed gradient buffers; grad_live_ + grad_spare_ within grad_limit_. Host target only: an
  // asynchronous target's buffers go back to it at once, fenced by their downloads.
  SparePool<GatherBlock> grad_spare_;
  // The gradient buffers' bound in elements, the one the host-memory budget and zinf plan count
  // (host_budget's gradient_buffer_elements). The bucket alone would free a buffer whenever
  // modules of two sizes alternate under a one-group bucket, and every gradient would be new memory.
  std::uint64_t grad_limit_ = 0;
  struct PendingDownload {
    std::size_t group;
    std::uint64_t ticket;
  };
  std::vector<PendingDownload> downloads_;  // in start order
  std::vector<GatherBlock> held_;  // per group: its gradients summed over this step's held passes
  std::uint64_t held_elements_ = 0;
  bool hold_ = false;
  bool next_pass_reuses_ = false;  // set_next_pass_reuses_values
  bool direct_bf16_ = false;  // acquire_bf16 has served a module: gathers ahead skip such groups
  std::uint64_t grad_live_ = 0;  // elements of the gradient buffers in grads_
  std::uint64_t live_ = 0;
  bool train_ = true;
  Trace train_trace_, eval_trace_;
  std::size_t position_ = 0;  // next event index in the current pass
  bool on_trace_ = true;      // the pass so far matches the recorded trace
  std::vector<int> bucket_;  // groups
  std::uint64_t bucket_elements_ = 0;
  model::FloatBuffer send_, recv_;  // gradient bucket packing and reduce-scatter output
  std::chrono::steady_clock::time_point pass_start_;
  bool backward_seen_ = false;
  CoordinatorStats stats_;
  std::function<void(std::size_t)> on_added_;
};

}  // namespace zinf::zero3
