// Optimizer swapper (offload_optimizer with device nvme): the optimizer step over state on NVMe.
//
// Parameter partitions are packed, in order, into sub-groups that close once they hold
// sub_group_size elements (a partition is never split). Each sub-group has flat fp32 tensors in
// the store: the master weights and the optimizer's states (Adam: exp_avg, exp_avg_sq). In a
// sub-group every partition starts at a multiple of PartitionLayout::kAlign elements (the gap
// is zero padding), so every transfer is 4 KiB aligned; gradients and 16-bit copies in memory
// use the same padded layout.
//
// A step walks the sub-groups in tiles of tile_elements() (the pinned budget decides the tile,
// not sub_group_size): read (master, states, gradients if swapped) -> optimizer kernel with the
// 16-bit copy fused -> hand the tile's copy to the parameter sink (param_sink.h: into host
// memory, or written from the slot; an fp32 sink takes the master itself) -> write (master,
// states). With pipeline_read the
// next tile's read overlaps this tile's compute; with pipeline_write the previous tile's write
// does. Each pipeline stage has its own pinned slot, carved from a pool of buffer_count x
// buffer_size fp32 elements. read_ahead() fills the slots with the first tiles' master and
// states before the step (they do not depend on the gradients), while the passes run.
//
// Failure safety: every state tensor has two slots in the store. A step reads the committed
// slot and writes the other; only when every tile is written does it commit the manifest that
// flips the slot. A step that fails (an I/O error, say) returns the error and leaves the
// previous step's state committed, intact and readable; the step can be retried. The parameter
// copies written by a failed step are not rolled back: write_param_copies() rewrites them from
// the committed master weights.
//
// State creation: init_master() streams the initial fp32 weights tile by tile from a callback;
// the moments are created on first use (zero tiles in pinned memory during the first step), so
// no step ever holds more than the pinned budget.
//
// Threading: one call at a time (not thread-safe). The aio handle must outlive the swapper.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zinf/aio/handle.h"
#include "zinf/optim/isa.h"
#include "zinf/optim/optimizer.h"
#include "zinf/status.h"
#include "zinf/swap/partition_layout.h"
#include "zinf/swap/pinned_pool.h"
#include "zinf/swap/swap_store.h"
#include "zinf/swap/types.h"

namespace zinf::swap {

class ParamSink;

// The offload_optimizer block and sub_group_size, resolved.
struct OptimizerSwapConfig {
  // Where the state lives (nvme_paths: several stripe extents across them; rank, stripe unit,
  // durability, checksums). The swapper sets store.kind itself.
  StoreConfig store;
  std::size_t buffer_count = 4;
  std::size_t buffer_size = 0;  // fp32 elements per pinned buffer; 0: the largest sub-group (reference)
  bool pipeline_read = false;
  bool pipeline_write = false;
  std::uint64_t sub_group_size = 1000000000;
  bool pin_memory = false;
  bool swap_gradients = false;   // gradients come from a gradient store (write_gradients)
  DType gradient_dtype = DType::kF32;
  optim::ExecOptions exec;       // how the kernels run
};

// The name this layout had before it was used beyond the optimizer (kept for code written then).
using OptimizerLayout [[deprecated("renamed PartitionLayout (zinf/swap/partition_layout.h)")]] = PartitionLayout;

// Fills `out` with elements [offset, offset + out.size()) of partition `param` (fp32 master).
using MasterSource = std::function<Status(std::size_t param, std::uint64_t offset, std::span<float> out)>;

// What one step() takes: its hyperparameters and gradients, and where its updated copies go.
struct StepArgs {
  optim::StepContext ctx;   // step count t (>= 1), lr and beta1 overrides
  double grad_scale = 1.0;  // applied to every gradient: 1 / (loss scale * clip factor)
  // Gradients in memory, one view per sub-group of layout().subgroups[i].numel elements in
  // the padded layout (zero in the padding); their own scale is ignored. Empty when the
  // gradients are swapped (config.swap_gradients).
  std::vector<optim::GradView> grads;
  // Where the updated parameter copies go (the parameter tier's sink; an output, not owned);
  // nullptr: no copies.
  ParamSink* sink = nullptr;
};

using StepInputs [[deprecated("renamed StepArgs: it also names where the step writes (sink)")]] = StepArgs;

struct StepStats {
  double seconds = 0;
  double compute_seconds = 0;     // in the optimizer kernels
  double read_wait_seconds = 0;   // blocked on reads
  double write_wait_seconds = 0;  // blocked on writes (16-bit copies included)
  double copy_wait_seconds = 0;   // of which blocked on the 16-bit copies' writes
  double commit_seconds = 0;      // the manifest commit (fdatasync when durable)
  std::uint64_t bytes_read = 0;   // optimizer and gradient stores
  std::uint64_t bytes_written = 0;
  std::size_t tiles = 0;
};

class OptimizerSwapper {
 public:
  // kCreate starts empty; kOpen continues the committed state of an earlier run, which must
  // have the same partitions, sub_group_size and optimizer type.
  static Result<std::unique_ptr<OptimizerSwapper>> create(const OptimizerSwapConfig& config,
                                                          std::vector<ParamPartition> params,
                                                          optim::Optimizer optimizer, aio::Handle& handle,
                                                          OpenMode mode = OpenMode::kCreate);
  ~OptimizerSwapper();
  OptimizerSwapper(const OptimizerSwapper&) = delete;
  OptimizerSwapper& operator=(const OptimizerSwapper&) = delete;

  const PartitionLayout& layout() const { return layout_; }
  const OptimizerSwapConfig& config() const { return config_; }
  std::uint64_t tile_elements() const { return tile_; }
  // Whether the master weights have been written (init_master, or a reopened store).
  bool initialized() const { return master_written_; }
  // ctx.step of the last committed step; 0 before the first.
  std::int64_t committed_step() const { return committed_step_; }

  // Writes the initial fp32 master weights (padding zero) and commits.
  Status init_master(const MasterSource& source);
  // Writes sub-group `subgroup`'s gradients (numel elements of gradient_dtype, padded layout)
  // to the gradient store, for the next step.
  Status write_gradients(std::size_t subgroup, const void* data);
  // One partition's gradients at a time, for accumulating them in the store: elements
  // [start, start + count) of sub-group `subgroup`'s gradients (gradient_dtype fp32), start a
  // multiple of PartitionLayout::kAlign. `buffer` is 4 KiB aligned with room for count rounded
  // up to kAlign elements; a write writes that padded length (the padding must be zero, as the
  // layout's gaps are). Synchronous; the step reads what was written last.
  Status write_gradient_range(std::size_t subgroup, std::uint64_t start, std::uint64_t count, const float* buffer);
  Status read_gradient_range(std::size_t subgroup, std::uint64_t start, std::uint64_t count, float* buffer);
  // write_gradient_range, started and not waited for: `buffer` must stay unchanged until
  // wait_gradient_write() returns. One such write at a time (a second waits for the first).
  // Every later gradient transfer (a range read or write, write_gradients, step()) waits for it
  // first, so whatever reads the gradients reads what was written last.
  Status start_gradient_range_write(std::size_t subgroup, std::uint64_t start, std::uint64_t count,
                                    const float* buffer);
  // Waits for the write start_gradient_range_write started, if one is pending; its error, if it
  // failed (the range then holds unknown values: the step must not use it).
  Status wait_gradient_write();
  // read_gradient_range, started and not waited for (a read-ahead): `buffer` must not be used
  // until wait_gradient_read() returns. One such read at a time (a second waits for the first).
  // It runs beside a pending write of another range (one of the same range is waited for
  // first); a write started over its range waits for it, and every other gradient transfer
  // (range reads and writes, write_gradients, step()) waits for it first.
  Status start_gradient_range_read(std::size_t subgroup, std::uint64_t start, std::uint64_t count, float* buffer);
  // Waits for the read start_gradient_range_read started, if one is pending; its error, if it
  // failed (the buffer then holds unknown values).
  Status wait_gradient_read();
  // Starts reading the committed master weights and optimizer states of the first tiles, one
  // per pipeline slot, into the slots' pinned buffers (no memory beyond them), so that the next
  // step() finds them read: call it while other work (the forward and backward passes) runs.
  // Gradients are not read ahead. No-op before init_master() or when a read-ahead is pending.
  // The read-ahead stays valid until the committed state changes: step() takes it over (a read
  // error of it fails that step, naming the tile, with the previous state committed); init_master,
  // load_state, read_state and write_param_copies drop it first (they reuse the slots and read or
  // replace the state themselves). Returns a submission error; nothing is then left in flight.
  Status read_ahead();
  // Waits for a pending read-ahead and drops it; returns its first read error. The slots are
  // then idle. Not needed before step() or destruction.
  Status cancel_read_ahead();
  // Tiles whose state a pending read-ahead holds or is reading (0: none).
  std::size_t read_ahead_tiles() const { return ahead_; }
  // One optimizer step over every sub-group; commits on success (see failure safety above).
  Status step(const StepArgs& in);
  // Rewrites the parameter copies in `sink` from the committed master weights.
  Status write_param_copies(ParamSink& sink);
  // Reads committed state of a sub-group: which 0 is the master weights, 1 + i the
  // optimizer's state i (optimizer().state_name(i)). out holds subgroups[sg].numel elements.
  Status read_state(std::size_t subgroup, std::size_t which, std::span<float> out);
  // The inverse, for resuming from a checkpoint: loads one tensor (same arguments) into the
  // uncommitted slot. Once every tensor (each sub-group's master and states) has been loaded
  // since the last commit, the loaded state is committed as a whole (committed_step() is kept);
  // until then the previous state stays committed, so a resume that fails half way changes
  // nothing.
  Status load_state(std::size_t subgroup, std::size_t which, std::span<const float> in);

  const optim::Optimizer& optimizer() const { return optimizer_; }
  const StepStats& last_stats() const { return stats_; }
  PinnedPool& pool() const { return *pool_; }
  SwapStore& store() const { return *store_; }

 private:
  struct Slot;
  struct Tile {
    std::size_t subgroup;
    std::uint64_t start;
    std::uint64_t length;
  };
  OptimizerSwapper(OptimizerSwapConfig config, optim::Optimizer optimizer);
  Status open_stores(aio::Handle& handle, OpenMode mode);
  Status plan_tiles(aio::Handle& handle);
  Status load_metadata();
  Status commit_metadata(int slot, std::int64_t step, bool states_created, bool master_written);
  std::string state_key(std::size_t subgroup, std::size_t which, int slot) const;
  std::string grad_key(std::size_t subgroup) const;
  Status check_args(const StepArgs& in) const;
  // Master and states (unless read ahead already) and the swapped gradients (not ahead of the
  // step: write_gradients may still rewrite them).
  Status issue_reads(Slot& s, const Tile& t, bool states, bool grads);
  Status wait_reads(Slot& s);
  Status compute(Slot& s, const Tile& t, const StepArgs& in);
  Status issue_writes(Slot& s, const Tile& t, const StepArgs& in, int slot);
  // Hands tile t's updated copy (the slot's 16-bit copy, or its fp32 master) to the sink.
  Status write_copies(Slot& s, const Tile& t, ParamSink& sink);
  Status wait_state_writes(Slot& s);  // before reading into the slot
  Status wait_copy_writes(Slot& s);   // before computing into the slot's 16-bit copy area
  Status wait_writes(Slot& s);        // both
  Status run_pipeline(const StepArgs& in, std::size_t ahead);
  Status drain();         // every read and write of every slot
  Status drain_writes();  // every write; reads (a read-ahead) stay in flight

  OptimizerSwapConfig config_;
  optim::Optimizer optimizer_;
  PartitionLayout layout_;
  std::unique_ptr<SwapStore> store_;
  std::unique_ptr<SwapStore> grad_store_;
  // A pending range transfer of the gradient store: the batch (empty: none) and its elements.
  struct GradRange {
    IoBatch batch;
    std::size_t subgroup = 0;
    std::uint64_t start = 0, end = 0;
    bool overlaps(std::size_t sg, std::uint64_t s, std::uint64_t e) const {
      return !batch.empty() && subgroup == sg && s < end && start < e;
    }
  };
  GradRange grad_write_;  // start_gradient_range_write's
  GradRange grad_read_;   // start_gradient_range_read's
  // Both of them; the first error.
  Status wait_gradient_transfers();
  std::unique_ptr<PinnedPool> pool_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<Tile> tiles_;
  std::uint64_t tile_ = 0;
  int slot_ = 0;  // the committed slot of every state tensor
  std::int64_t committed_step_ = 0;
  bool states_created_ = false;
  bool master_written_ = false;
  std::size_t ahead_ = 0;     // read_ahead(): tiles [0, ahead_) are being read into slots [0, ahead_)
  StoreStats ahead_before_;   // the store's counters when that read-ahead began
  std::vector<bool> loaded_;  // per (sub-group, tensor): loaded by load_state since the last commit
  StepStats stats_;
};

}  // namespace zinf::swap
