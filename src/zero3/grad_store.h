// Internal: the rank's fp32 gradient partitions, accumulated across a step's micro-batches by the
// coordinator, then read by the global norm and the optimizer step. In host memory, or (with
// offload_optimizer.device nvme) in the optimizer swapper's gradient store, so that they do not
// hold 4 bytes per parameter of RAM.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "zinf/optim/grad_stats.h"
#include "zinf/optim/optimizer.h"
#include "zinf/status.h"
#include "zinf/swap/optimizer_swapper.h"
#include "zinf/swap/partition_layout.h"

namespace zinf::zero3 {

// Threading: one call at a time (the coordinator's thread, then the engine's).
class GradStore {
 public:
  virtual ~GradStore() = default;
  // Starts a step: every gradient reads as zero until accumulated.
  virtual Status begin_step() = 0;
  // acc[i] += in[i] for partition `partition` (an index into the layout's params); in.size() is
  // its numel. Once per partition and micro-batch, in any order. The sums are the same floats,
  // added in the same order, wherever the store keeps them: results do not depend on it.
  virtual Status accumulate(std::size_t partition, std::span<const float> in) = 0;
  // Whether the accumulations until the next call are the step's last for their partitions (the
  // engine says so before each micro-batch). A store may take what the norm needs from them then,
  // instead of reading the sums back; stats() is the same either way. Default: every one may be.
  virtual void set_last_micro_batch(bool) {}
  // After the step's last accumulation: partitions no micro-batch reached read as zero from here
  // on (stats() calls it too). step_views() are the step's sums only after it.
  virtual Status end_accumulation() { return Status::ok(); }
  // After the last micro-batch: grad_stats over each sub-group's whole padded array, folded in
  // sub-group order (the norm every store gives bit for bit alike).
  virtual Result<optim::GradStats> stats() = 0;
  // The gradients as swap::StepArgs::grads takes them: one view per sub-group in memory, or
  // none when the optimizer step reads them from its gradient store.
  virtual std::vector<optim::GradView> step_views() const = 0;
  // Bytes of host memory the store holds.
  virtual std::uint64_t host_bytes() const = 0;
  // Whether the partitions are in device memory (device_state.h): the coordinator then adds each
  // gradient with accumulate_on_device, on the device's compute stream, and nothing comes back.
  virtual bool on_device() const { return false; }
  // acc += in, `in` the partition's gradient in the device's memory, read by work enqueued on its
  // compute stream (so the gradient's kernels, enqueued before, have written it).
  virtual Status accumulate_on_device(std::size_t partition, const float* in);
  // Bytes it has read and written on NVMe so far (its accumulation and norm; the optimizer
  // step's gradient reads are the optimizer tier's).
  virtual std::uint64_t bytes_moved() const { return 0; }
};

// One fp32 array per sub-group in host memory. `layout` must outlive the store.
Result<std::unique_ptr<GradStore>> make_memory_grad_store(const swap::PartitionLayout& layout);
// In `swapper`'s gradient store (made with swap_gradients, fp32), through two buffers of the
// largest partition: each accumulation takes the partition's sum so far (unless it is the
// step's first for that partition), adds, and starts writing it back; the write runs while the
// caller goes on (the next module's backward) and the next accumulation, stats() or the step
// waits for it. A failed write fails the next of those. The sum so far is read ahead: after
// each accumulation the store starts reading the sum of the partition that followed this one
// last time (backward's order repeats every micro-batch) into the other buffer, beside the
// write; an accumulation of another partition drops that read and reads its own. The smallest
// partitions (a layer norm's; swapped_gradient_held_bytes) keep their sums in host memory instead,
// so that their accumulation waits for no write; end_accumulation() (stats() calls it) writes
// them, after which the store holds the step's sums for the optimizer step. `swapper` must
// outlive the store.
Result<std::unique_ptr<GradStore>> make_swapped_grad_store(const swap::PartitionLayout& layout,
                                                           swap::OptimizerSwapper& swapper);
// Bytes of the swapped store's two pinned buffers, each the largest partition, at least the
// norm's read chunk, in whole norm blocks (one is written back while the next partition's sum is
// read ahead into the other). With the optimizer on NVMe this and swapped_gradient_held_bytes
// are all of the gradients the host holds (the host-memory budget and zinf plan count both).
std::uint64_t swapped_gradient_buffer_bytes(const swap::PartitionLayout& layout);
// Bytes of host memory (not pinned) in which the swapped store keeps the sums of its smallest
// partitions (a layer norm's) until end_accumulation() writes them: at most half a partition.
std::uint64_t swapped_gradient_held_bytes(const swap::PartitionLayout& layout);
// acc[i] += in[i]: the accumulation loop both stores run, so their sums are the same floats. Large
// spans are split over the default thread pool (element-wise: the same floats whatever the split).
void add_into(float* acc, std::span<const float> in);
// The elements the swapped store's stats() reads back in a step where every partition was
// accumulated: its norm blocks that no one partition's padded range holds (the others' sums are
// taken as they are accumulated).
std::uint64_t swapped_norm_read_elements(const swap::PartitionLayout& layout);

}  // namespace zinf::zero3
