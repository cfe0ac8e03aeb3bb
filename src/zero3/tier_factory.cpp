// The tier factory: one switch per tier over the offload device, the config copied once.
#include "zero3/tier_factory.h"

#include <fmt/format.h>

#include "device/ops.h"
#include "zinf/log.h"
#include "zero3/device_gather_target.h"
#include "zero3/device_state.h"
#include "zero3/param_device_reader.h"

namespace zinf::zero3 {
namespace {

bool uses_nvme(const config::ZeroSection& zero) {
  return zero.offload_param.device == config::OffloadDevice::kNvme ||
         zero.offload_optimizer.device == config::OffloadDevice::kNvme;
}

Result<std::unique_ptr<aio::Handle>> make_handle(const config::AioSection& a,
                                                 std::shared_ptr<aio::FaultInjector> faults) {
  aio::AioConfig aio;
  aio.block_size = static_cast<std::size_t>(a.block_size);
  aio.queue_depth = static_cast<std::size_t>(a.queue_depth);
  aio.intra_op_parallelism = static_cast<std::size_t>(a.intra_op_parallelism);
  aio.single_submit = a.single_submit;
  aio.overlap_events = a.overlap_events;
  aio.request_timeout_s = a.request_timeout_s;
  aio.faults = std::move(faults);
  return aio::Handle::create(aio);
}

Result<std::unique_ptr<OptimizerTier>> make_optimizer_tier(const TierContext& c, optim::Optimizer optimizer,
                                                           aio::Handle* handle) {
  const config::OffloadOptimizerSection& offload = c.ds.zero.offload_optimizer;
  switch (offload.device) {
    case config::OffloadDevice::kNone:
      if (state_on_device(c, optimizer)) return make_device_optimizer_tier(c.layout, std::move(optimizer), *c.device);
      return make_memory_optimizer_tier(c.layout, std::move(optimizer), {});
    case config::OffloadDevice::kCpu:
      return make_memory_optimizer_tier(c.layout, std::move(optimizer), {});
    case config::OffloadDevice::kNvme: {
      swap::OptimizerSwapConfig swap_config;
      swap_config.store = swap_store_config(offload.nvme_path, c.rank);
      swap_config.buffer_count = static_cast<std::size_t>(offload.buffer_count);
      swap_config.buffer_size = static_cast<std::size_t>(c.optimizer_buffer_size);
      swap_config.pipeline_read = offload.pipeline_read;
      swap_config.pipeline_write = offload.pipeline_write;
      swap_config.sub_group_size = c.layout.sub_group_size;
      swap_config.pin_memory = offload.pin_memory;
      // Gradients on NVMe beside the state they update (4 bytes per parameter off the RAM).
      swap_config.swap_gradients = true;
      swap_config.gradient_dtype = swap::DType::kF32;
      return make_nvme_optimizer_tier(swap_config, c.layout.params, std::move(optimizer), *handle, swap::OpenMode::kCreate);
    }
  }
  return Status::internal(fmt::format("offload_optimizer.device {} has no tier",
                                      config::offload_device_name(offload.device)));
}

Result<std::unique_ptr<ParamTier>> make_param_tier(const TierContext& c, OptimizerTier& optimizer,
                                                   aio::Handle* handle) {
  const config::OffloadParamSection& offload = c.ds.zero.offload_param;
  switch (offload.device) {
    case config::OffloadDevice::kNone:
      if (state_on_device(c, optimizer.optimizer())) return make_device_param_tier(c.layout, c.dtype, optimizer, *c.device);
      return make_memory_param_tier(c.layout, c.dtype, &optimizer);
    case config::OffloadDevice::kCpu:
      return make_memory_param_tier(c.layout, c.dtype, &optimizer);
    case config::OffloadDevice::kNvme: {
      swap::ParamSwapConfig swap_config;
      swap_config.store = swap_store_config(offload.nvme_path, c.rank);
      swap_config.buffer_count = static_cast<std::size_t>(offload.buffer_count);
      swap_config.buffer_size = static_cast<std::size_t>(offload.buffer_size);
      swap_config.max_in_cpu = static_cast<std::uint64_t>(offload.max_in_cpu);
      swap_config.pin_memory = offload.pin_memory;
      swap_config.dtype = c.dtype;
      // As the optimizer's pool (optimizer_swapper.cpp): a budget the partitions leave mostly
      // unused grows on demand; one they fill is allocated whole and registered.
      std::uint64_t largest = 0;
      for (const swap::ParamPartition& p : c.layout.params) largest = std::max(largest, p.numel);
      const std::uint64_t element = swap::dtype_size(swap_config.dtype);
      const std::uint64_t used =
          swap_config.buffer_count *
          swap::align_up(std::min<std::uint64_t>(largest, swap_config.buffer_size) * element, swap::kSwapAlignment);
      swap_config.grow_pool =
          2 * used <= swap_config.buffer_count * swap::align_up(swap_config.buffer_size * element, swap::kSwapAlignment);
      return make_nvme_param_tier(c.layout, swap_config, *handle);
    }
  }
  return Status::internal(fmt::format("offload_param.device {} has no tier", config::offload_device_name(offload.device)));
}

}  // namespace

swap::StoreConfig swap_store_config(const std::string& nvme_path, int rank) {
  swap::StoreConfig store;
  store.nvme_paths = {nvme_path};
  store.rank = rank;
  // Swap files are scratch space, not checkpoints: a crash resumes from a checkpoint, so steps
  // need not fdatasync (failure safety against I/O errors stays: the optimizer's two slots).
  store.durable = false;
  // Nothing reopens them (every run starts its stores anew): they go when the run ends,
  // failed or not, instead of filling the disk.
  store.remove_at_close = true;
  return store;
}

std::vector<DiskUse> swap_disk_uses(const TierContext& c, std::size_t optimizer_states, int local_ranks) {
  // A manifest and a lock file per store: a few KiB; this rounds them up generously.
  constexpr std::uint64_t kStoreOverhead = std::uint64_t{1} << 20;
  const auto per_node = [&](std::uint64_t bytes) { return bytes * static_cast<std::uint64_t>(std::max(1, local_ranks)); };
  std::vector<DiskUse> uses;
  const config::ZeroSection& zero = c.ds.zero;
  if (zero.offload_optimizer.device == config::OffloadDevice::kNvme) {
    swap::StoreConfig sc = swap_store_config(zero.offload_optimizer.nvme_path, c.rank);
    sc.kind = swap::StoreKind::kOptimizer;
    // The master weights and each state, in two slots (optimizer_swapper.h, failure safety), and
    // the gradients (kind "gradients").
    std::uint64_t bytes = kStoreOverhead;
    for (const swap::SubGroup& sg : c.layout.subgroups) {
      bytes += 2 * (1 + optimizer_states) * swap::tensor_footprint(sc, swap::DType::kF32, sg.numel);
      bytes += swap::tensor_footprint(sc, swap::DType::kF32, sg.numel);
    }
    swap::StoreConfig grads = sc;
    grads.kind = swap::StoreKind::kGradients;
    uses.push_back(DiskUse{zero.offload_optimizer.nvme_path, "offload_optimizer swap files", per_node(bytes),
                           per_node(swap::store_disk_bytes(sc) + swap::store_disk_bytes(grads))});
  }
  if (zero.offload_param.device == config::OffloadDevice::kNvme) {
    swap::StoreConfig sc = swap_store_config(zero.offload_param.nvme_path, c.rank);
    sc.kind = swap::StoreKind::kParameters;
    std::uint64_t bytes = kStoreOverhead;
    for (const swap::ParamPartition& p : c.layout.params) bytes += swap::tensor_footprint(sc, c.dtype, p.numel);
    uses.push_back(DiskUse{zero.offload_param.nvme_path, "offload_param swap files", per_node(bytes),
                           per_node(swap::store_disk_bytes(sc))});
  }
  return uses;
}

bool state_on_device(const TierContext& c, const optim::Optimizer& optimizer) {
  return c.device != nullptr && c.device->ops() != nullptr && c.world_size == 1 &&
         c.ds.zero.offload_param.device == config::OffloadDevice::kNone &&
         c.ds.zero.offload_optimizer.device == config::OffloadDevice::kNone && c.device->ops()->steps(optimizer);
}

Result<Tiers> make_tiers(const TierContext& context, optim::Optimizer optimizer) {
  Tiers t;
  if (uses_nvme(context.ds.zero)) {
    if (!context.ds.aio.present) {
      const config::AioSection& a = context.ds.aio;
      log(LogLevel::kNotice,
          fmt::format("ds.json has no \"aio\" block: NVMe transfers use the reference's defaults (block_size {}, "
                      "queue_depth {}, intra_op_parallelism {}); `aio_bench --quick --dir <nvme_path>` prints a "
                      "block measured on the drive to paste in (docs/user-guide.md, section 1)",
                      a.block_size, a.queue_depth, a.intra_op_parallelism));
    }
    ZINF_ASSIGN_OR_RETURN(t.handle, make_handle(context.ds.aio, context.aio_faults));
  }
  ZINF_ASSIGN_OR_RETURN(t.optimizer, make_optimizer_tier(context, std::move(optimizer), t.handle.get()));
  aio::Handle* param_handle = t.handle.get();
  if (context.ds.zero.offload_param.device == config::OffloadDevice::kNvme &&
      context.ds.zero.offload_optimizer.device == config::OffloadDevice::kNvme) {
    ZINF_ASSIGN_OR_RETURN(t.param_handle, make_handle(context.ds.aio, context.aio_faults));
    param_handle = t.param_handle.get();
  }
  ZINF_ASSIGN_OR_RETURN(t.params, make_param_tier(context, *t.optimizer, param_handle));
  if (context.device != nullptr) {
    DeviceGatherOptions gather_options;
    gather_options.consumer = context.consumer;
    gather_options.collectives = context.collectives;
    gather_options.values = context.gather_values;
    ZINF_ASSIGN_OR_RETURN(t.gather, make_device_gather_target(*context.device, gather_options));
  } else {
    t.gather = make_host_gather_target();
  }
  note_use_gds_not_served(context.ds, context.device);
  if (swap::OptimizerSwapper* swapper = t.optimizer->swapper()) {
    ZINF_ASSIGN_OR_RETURN(t.grads, make_swapped_grad_store(context.layout, *swapper));
  } else if (state_on_device(context, t.optimizer->optimizer())) {
    ZINF_ASSIGN_OR_RETURN(t.grads, make_device_grad_store(context.layout, *context.device));
  } else {
    ZINF_ASSIGN_OR_RETURN(t.grads, make_memory_grad_store(context.layout));
  }
  return t;
}

}  // namespace zinf::zero3
