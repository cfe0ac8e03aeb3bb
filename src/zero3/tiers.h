// Internal: where this rank's parameter partitions (compute dtype) and optimizer state live.
//
// Both tiers use the optimizer layout (swap::PartitionLayout): partitions packed into
// sub-groups, each partition at a kAlign-aligned offset. The parameter tier holds the copy the
// model computes with (bf16/fp16, or fp32 when training in fp32); the optimizer tier holds the
// fp32 master weights and the optimizer's states. "memory" tiers are host arrays (offload
// device none or cpu: on a CPU-only engine both are host memory, the parameter partitions pinned);
// "nvme" tiers are the swap layer's ParamSwapper / OptimizerSwapper.
//
// The seam between them is the parameter tier's sink (swap::ParamSink): the optimizer tier
// writes every updated copy there, whatever the dtype and wherever the tier keeps it, so the
// engine never asks which tiers it runs. tier_factory.h makes them from ds_config; a new kind of
// tier is a class here and a case there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zinf/aio/handle.h"
#include "zinf/optim/optimizer.h"
#include "zinf/status.h"
#include "zinf/swap/optimizer_swapper.h"
#include "zinf/swap/param_sink.h"
#include "zinf/swap/param_swapper.h"

namespace zinf::zero3 {

class OptimizerTier;

// One of a sub-group's fp32 arrays in an optimizer tier: the master weights, or the optimizer's
// state i (optim::Optimizer::state_name(i)). position() is its place in the order master, state 0,
// state 1, ...: the order of a checkpoint's rank file and of the swapper's tensors.
class StateArray {
 public:
  static constexpr StateArray master() { return StateArray(0); }
  static constexpr StateArray optimizer_state(std::size_t i) { return StateArray(1 + i); }
  static constexpr StateArray at_position(std::size_t position) { return StateArray(position); }
  constexpr std::size_t position() const { return position_; }
  constexpr bool operator==(const StateArray&) const = default;

 private:
  constexpr explicit StateArray(std::size_t position) : position_(position) {}
  std::size_t position_;
};
// A tier's pinned staging pool (swap::PinnedPool): bytes that are memory now and the most ever
// leased at once. Zero for tiers without one (memory tiers).
struct PinnedUse {
  std::uint64_t allocated = 0;
  std::uint64_t high_water = 0;
  PinnedUse& operator+=(const PinnedUse& o) {
    allocated += o.allocated;
    high_water += o.high_water;
    return *this;
  }
};
inline PinnedUse pinned_use_of(const swap::PinnedPool& pool) { return {pool.allocated(), pool.high_water()}; }

class ParamTier {
 public:
  virtual ~ParamTier() = default;
  virtual swap::DType dtype() const = 0;
  virtual std::string describe() const = 0;
  // `partition` indexes layout().params: the partition of one partition group (a module's
  // parameters), as PartitionPlan::group() numbers them.
  // Starts bringing `partition` close (nvme: an async read into pinned staging).
  virtual void prefetch(std::size_t partition) = 0;
  // Gives up a prefetch that will not be read (the pass left the trace).
  virtual void drop_prefetch(std::size_t partition) = 0;
  // Writes `partition` (layout().params[partition].numel elements) as fp32 into dst; waits for it.
  virtual Status read_f32(std::size_t partition, std::span<float> dst) = 0;
  // Where the optimizer writes this tier's updated partitions (dtype(), the layout's padded
  // sub-groups); valid for the tier's lifetime. An fp32 tier's sink takes the master weights.
  virtual swap::ParamSink& sink() = 0;
  // Waits for outstanding writes (nvme: and commits the store's manifest).
  virtual Status flush() = 0;
  // Seconds spent blocked on parameter reads so far.
  virtual double io_wait_seconds() const = 0;
  // Where `partition`'s values are in the memory of the device the engine gathers into (a
  // device-resident tier, device_state.h): the coordinator's gathers then copy them there on the
  // compute stream. data == nullptr (every other tier): read_f32.
  struct DeviceValues {
    const void* data = nullptr;
    swap::DType dtype = swap::DType::kF32;
  };
  virtual DeviceValues device_values(std::size_t /*partition*/) { return {}; }
  // Where `partition`'s values are in page-locked host memory in dtype() (a memory tier of its
  // own, not aliasing the master weights): a device gather then uploads them as they are and
  // widens them on the device. data == nullptr: read_f32.
  struct HostValues {
    const void* data = nullptr;
    swap::DType dtype = swap::DType::kF32;
  };
  virtual HostValues pinned_values(std::size_t /*partition*/) { return {}; }
  // The swapper of an nvme tier (param_device_reader.h reads its files into device memory),
  // else nullptr.
  virtual swap::ParamSwapper* nvme_swapper() { return nullptr; }
  virtual PinnedUse pinned_use() const { return {}; }
};

// device none / cpu. dtype fp32, bf16 or fp16. An fp32 tier given an optimizer tier whose master
// weights stay in memory holds no copy: its partitions are those master weights (the optimizer
// step updates them in place; its sink's memory is theirs, so handing them over copies
// nothing). `optimizer` must outlive the parameter tier.
Result<std::unique_ptr<ParamTier>> make_memory_param_tier(const swap::PartitionLayout& layout, swap::DType dtype,
                                                          OptimizerTier* optimizer = nullptr);
// device nvme (fp32, bf16 or fp16).
Result<std::unique_ptr<ParamTier>> make_nvme_param_tier(const swap::PartitionLayout& layout,
                                                        const swap::ParamSwapConfig& config, aio::Handle& handle);

class OptimizerTier {
 public:
  virtual ~OptimizerTier() = default;
  virtual std::string describe() const = 0;
  virtual const optim::Optimizer& optimizer() const = 0;
  virtual Status init_master(const swap::MasterSource& source) = 0;
  // Starts reading the state the next step() reads first while the passes run (nvme: the
  // swapper's read_ahead(); memory: nothing). A read error surfaces at that step().
  virtual Status read_ahead() { return Status::ok(); }
  // One step over every sub-group; the updated copies go to in.sink (nullptr: none).
  virtual Status step(const swap::StepArgs& in) = 0;

  // Early steps (early_step.h): a sub-group stepped on its own as soon as its gradients are
  // final, under a snapshot that restore() brings back if the step must be taken again. Tiers
  // that cannot (nvme: its step is one pipelined, committed pass) answer false and kUnsupported.
  virtual bool steps_subgroups() const { return false; }
  // step() over sub-group sg alone (in.grads[sg]); thread-compatible with the passes: touches
  // only sub-group sg's state and sg's part of the sink.
  virtual Status step_subgroup(const swap::StepArgs& in, std::size_t sg);
  // Keeps a copy of sub-group sg's master weights and states; restore(sg) puts it back.
  virtual Status snapshot(std::size_t sg);
  virtual Status restore(std::size_t sg);
  // Rewrites every copy in `sink` from the current master weights (after init and resume).
  virtual Status write_param_copies(swap::ParamSink& sink) = 0;
  // Sub-group sg's committed `array` into out (subgroups[sg].numel elements).
  virtual Status read_state(std::size_t sg, StateArray array, std::span<float> out) = 0;
  // The inverse, for resume: replaces committed state (memory tiers write in place).
  virtual Status load_state(std::size_t sg, StateArray array, std::span<const float> in) = 0;
  // Sub-group sg's fp32 master weights where they stay in host memory for the tier's lifetime
  // (memory tiers), else nullptr. An fp32 memory parameter tier reads them in place (the
  // factory asks once, at construction).
  virtual float* master_in_memory(std::size_t) { return nullptr; }
  // Sub-group sg's fp32 master weights in device memory (the device tier, device_state.h), else
  // nullptr; an fp32 device parameter tier reads them in place.
  virtual float* master_on_device(std::size_t) { return nullptr; }
  virtual double io_wait_seconds() const = 0;
  virtual std::uint64_t bytes_moved() const = 0;
  virtual PinnedUse pinned_use() const { return {}; }
  // The NVMe tier's swapper (its gradient store takes the gradients when it swaps them); null
  // for memory tiers.
  virtual swap::OptimizerSwapper* swapper() { return nullptr; }
};

Result<std::unique_ptr<OptimizerTier>> make_memory_optimizer_tier(const swap::PartitionLayout& layout,
                                                                  optim::Optimizer optimizer,
                                                                  const optim::ExecOptions& exec);
Result<std::unique_ptr<OptimizerTier>> make_nvme_optimizer_tier(const swap::OptimizerSwapConfig& config,
                                                                std::vector<swap::ParamPartition> partitions,
                                                                optim::Optimizer optimizer, aio::Handle& handle,
                                                                swap::OpenMode mode);

}  // namespace zinf::zero3
