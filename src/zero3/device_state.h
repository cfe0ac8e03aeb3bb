// Internal: the training state in a device's memory: with offload_param and offload_optimizer
// "none", one rank, and a device that has DeviceOps (device/ops.h: the host device, a GPU model's
// CUDA device), the fp32 master weights, the optimizer states, the parameters in the compute
// dtype and the gradient partitions all live on the device (ZeRO-3 with nothing offloaded). Per
// step nothing crosses to the host but the loss and the norm: the coordinator copies each
// module's values from the parameter tier into its gathered block on the compute stream, adds
// each gradient into the store there, and the optimizer steps there (tier_factory.h picks these).
//
// Bits: the ops are the CPU's arithmetic (ops.h), so a run gives the host path's results.
//
// Everything is enqueued on the device's compute stream, in order, so the tiers need no fences
// between themselves; what crosses to or from the host (initial weights, checkpoints,
// read_full_param) goes through pinned staging in chunks and waits.
#pragma once

#include <memory>

#include "device/device.h"
#include "zero3/grad_store.h"
#include "zero3/tiers.h"

namespace zinf::zero3 {

// `device` must have ops() that steps `optimizer` (DeviceOps::steps), and outlive the tier.
Result<std::unique_ptr<OptimizerTier>> make_device_optimizer_tier(const swap::PartitionLayout& layout,
                                                                  optim::Optimizer optimizer, device::Device& device);
// The parameters in `dtype` on the device: an fp32 tier is the optimizer tier's master weights
// (read in place); a 16-bit one holds the copies the optimizer's kernel writes. `optimizer` must
// be a device optimizer tier on the same device; both must outlive this tier.
Result<std::unique_ptr<ParamTier>> make_device_param_tier(const swap::PartitionLayout& layout, swap::DType dtype,
                                                          OptimizerTier& optimizer, device::Device& device);
// One fp32 array per sub-group on the device.
Result<std::unique_ptr<GradStore>> make_device_grad_store(const swap::PartitionLayout& layout, device::Device& device);

}  // namespace zinf::zero3
