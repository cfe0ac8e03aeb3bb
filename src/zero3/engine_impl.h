// Internal: the engine's state, shared by engine.cpp and engine_checkpoint.cpp (which hands
// checkpoints the narrow CheckpointState of checkpoint_state.h).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "device/device.h"
#include "zero3/coordinator.h"
#include "zero3/early_step.h"
#include "zero3/model_partition.h"
#include "zero3/tiers.h"
#include "zinf/aio/handle.h"
#include "zinf/model/float_buffer.h"
#include "zinf/optim/loss_scaler.h"
#include "zinf/optim/lr_schedule.h"
#include "zinf/swap/optimizer_swapper.h"
#include "zinf/zero3/engine.h"
#include "zinf/zero3/partition.h"

namespace zinf::zero3 {

struct CheckpointState;
struct TierContext;

struct Engine::Impl {
  static Result<std::unique_ptr<Impl>> build(std::unique_ptr<model::Model> model, const EngineOptions& options,
                                             Communicator& comm);

  Status init();
  // EngineOptions::host_memory_budget: lowers options.ds's knobs to fit, before any work.
  Status fit_budget(std::size_t optimizer_states, TierContext& tiers);
  Status init_master_weights();
  Status publish_params();
  Result<StepReport> train_step(std::span<const MicroBatch> micro_batches);
  void sync_scaler_counters();
  // What a checkpoint save or load sees of this engine (engine_checkpoint.cpp).
  CheckpointState checkpoint_state();
  // Bytes of this rank's checkpoint file (checkpoint.cpp's layout).
  std::uint64_t rank_file_bytes(std::size_t optimizer_states) const;

  EngineOptions options;
  Communicator& comm;
  std::unique_ptr<model::Model> model;
  swap::DType dtype;
  PartitionPlan plan;
  swap::PartitionLayout layout;
  double base_lr = 0;
  std::unique_ptr<optim::LrSchedule> schedule;
  std::optional<optim::LossScaler> scaler;
  std::unique_ptr<device::Device> device;  // EngineDevice kHostDevice; outlives the gather target
  device::Device* device_view = nullptr;   // that one, or the model's own (kModelDevice); null: host
  std::unique_ptr<aio::Handle> handle;
  std::unique_ptr<aio::Handle> param_handle;  // Tiers::param_handle
  std::unique_ptr<OptimizerTier> optimizer;
  std::unique_ptr<ParamTier> params;  // after optimizer: may read its master weights in place
  std::unique_ptr<GatherTarget> gather;  // where the coordinator gathers; outlives it
  std::unique_ptr<GradStore> grads;  // fp32 gradient partitions (memory or the optimizer's swap)
  std::unique_ptr<Coordinator> coordinator;
  std::unique_ptr<EarlyStepper> early;  // EngineOptions::overlap_optimizer where the tiers allow
  EngineCounters counters;
  HostBudgetReport budget;
  int budget_B = 0, budget_T = 0;  // the micro-batch the budget sized activations for

 private:
  Impl(std::unique_ptr<model::Model> model, const EngineOptions& options, Communicator& comm);
};

}  // namespace zinf::zero3
