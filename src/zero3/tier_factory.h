// Internal: the one place that turns ds_config's offload sections into tiers.
//
// Each offload device maps to one tier class (tiers.h); make_tiers picks them in one switch per
// tier. A new offload device, or a device-resident parameter tier, is one class and one case
// there; the engine, the coordinator and the optimizer step do not change (they see the
// interfaces and the parameter tier's sink). Where the coordinator gathers (host memory now,
// device memory with a device-resident engine) is chosen here too (gather_target.h).
#pragma once

#include <memory>

#include "device/device.h"
#include "zero3/device_gather_target.h"
#include "zero3/gather_target.h"
#include "zero3/grad_store.h"
#include "zero3/tiers.h"
#include "zinf/aio/fault.h"
#include "zinf/aio/handle.h"
#include "zinf/config/ds_config.h"
#include "zinf/optim/optimizer.h"
#include "zinf/swap/optimizer_swapper.h"
#include "zinf/zero3/disk_space.h"

namespace zinf::zero3 {

// What the tiers are made from besides ds_config.
struct TierContext {
  const config::DsConfig& ds;
  const swap::PartitionLayout& layout;  // must outlive the tiers
  int rank = 0;
  swap::DType dtype = swap::DType::kF32;  // the parameters' compute dtype
  std::shared_ptr<aio::FaultInjector> aio_faults;  // null: none (tests inject I/O faults here)
  // Where the coordinator gathers: this device's memory (device_gather_target.h), or host memory
  // when null. Must outlive the tiers.
  device::Device* device = nullptr;
  // Whether the model reads the gathered memory on the driving thread or from kernels on the
  // device's compute stream (device_gather_target.h).
  DeviceGatherOptions::Consumer consumer = DeviceGatherOptions::Consumer::kHostThread;
  // W > 1 with kComputeStream: the collectives on the device's memory (DeviceGatherOptions).
  std::shared_ptr<DeviceCollectives> collectives = nullptr;
  // The gathered values' element type (DeviceGatherOptions::values).
  swap::DType gather_values = swap::DType::kF32;
  int world_size = 1;  // ranks: the state lives on the device with one only
  // fp32 elements per offload_optimizer pinned buffer (a host-memory budget's); 0: the largest
  // sub-group, as the reference.
  std::uint64_t optimizer_buffer_size = 0;
};

// The tiers and what they share. Members are destroyed in reverse order: the parameter tier
// (which may read the optimizer tier's master weights in place) first, the aio handle (which
// the swappers use) last.
struct Tiers {
  std::unique_ptr<aio::Handle> handle;  // null unless a tier is on nvme
  // The parameter tier's own handle when both tiers are on nvme, as the reference gives each
  // swapper its own: the step's 16-bit copies then do not queue behind the optimizer's tiles.
  std::unique_ptr<aio::Handle> param_handle;
  std::unique_ptr<OptimizerTier> optimizer;
  std::unique_ptr<ParamTier> params;
  std::unique_ptr<GatherTarget> gather;  // a DeviceGatherTarget when TierContext::device is set
  // The gradient partitions: in the optimizer swapper's gradient store with an NVMe optimizer
  // tier, else in memory. Destroyed before the optimizer tier whose swapper it may write.
  std::unique_ptr<GradStore> grads;
};

// The swap store settings every swap store of this rank shares (checksums, stripe unit, no
// fdatasync), at nvme_path.
swap::StoreConfig swap_store_config(const std::string& nvme_path, int rank);

Result<Tiers> make_tiers(const TierContext& context, optim::Optimizer optimizer);

// Whether make_tiers keeps the whole training state in the device's memory (device_state.h):
// offload_param and offload_optimizer none, one rank, and a device whose ops step `optimizer`.
bool state_on_device(const TierContext& context, const optim::Optimizer& optimizer);

// What make_tiers' swap stores will take on disk, per tier on nvme (none for memory tiers), for
// an optimizer with `optimizer_states` states and `local_ranks` ranks of this node sharing each
// nvme_path's file system (every rank's folder is the same size, to a partition's padding).
std::vector<DiskUse> swap_disk_uses(const TierContext& context, std::size_t optimizer_states, int local_ranks);

}  // namespace zinf::zero3
