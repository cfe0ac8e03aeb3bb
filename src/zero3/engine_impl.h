// Internal: the engine's state, shared by engine.cpp and checkpoint.cpp.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "zero3/coordinator.h"
#include "zero3/tiers.h"
#include "zinf/aio/handle.h"
#include "zinf/model/float_buffer.h"
#include "zinf/optim/loss_scaler.h"
#include "zinf/optim/lr_schedule.h"
#include "zinf/swap/optimizer_swapper.h"
#include "zinf/zero3/engine.h"
#include "zinf/zero3/partition.h"

namespace zinf::zero3 {

struct Engine::Impl {
  static Result<std::unique_ptr<Impl>> build(const EngineOptions& options, Communicator& comm);

  Status init();
  Status init_master_weights();
  Status publish_params();
  Result<StepReport> train_step(std::span<const MicroBatch> micro_batches);
  void sync_scaler_counters();

  EngineOptions options;
  Communicator& comm;
  model::GptModel model;
  swap::DType dtype;
  PartitionPlan plan;
  swap::OptimizerLayout layout;
  double base_lr = 0;
  std::unique_ptr<optim::LrSchedule> schedule;
  std::optional<optim::LossScaler> scaler;
  std::unique_ptr<aio::Handle> handle;
  std::unique_ptr<OptimizerTier> optimizer;
  std::unique_ptr<ParamTier> params;
  std::vector<model::FloatBuffer> grad_acc;  // fp32 gradient partitions, per sub-group
  std::unique_ptr<Coordinator> coordinator;
  EngineCounters counters;

 private:
  Impl(const EngineOptions& options, Communicator& comm);
};

}  // namespace zinf::zero3
