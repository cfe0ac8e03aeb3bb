// Internal: what checkpoint save and load see of an engine, and the one way a load changes it.
// The engine hands this over (engine_checkpoint.cpp); checkpoint.cpp knows nothing else of it.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>

#include "zero3/tiers.h"
#include "zinf/model/model.h"
#include "zinf/status.h"
#include "zinf/swap/partition_layout.h"
#include "zinf/swap/types.h"
#include "zinf/zero3/comm.h"
#include "zinf/zero3/engine.h"
#include "zinf/zero3/partition.h"

namespace zinf::zero3 {

// Valid while the engine that made it lives; one save or load at a time, called on every rank.
struct CheckpointState {
  Communicator& comm;
  const model::Model& model;
  swap::DType precision;  // the compute precision a load must match
  const PartitionPlan& plan;
  const swap::PartitionLayout& layout;
  bool node_local_storage = false;  // checkpoint.use_node_local_storage: each node's first rank writes
  // The fp32 arrays a rank file holds (the master weights and the optimizer's states, per
  // sub-group): a save reads them, a load replaces them.
  OptimizerTier& optimizer;
  const EngineCounters& counters;
  // After a load replaced every array: takes the saved counters and loss scaler and brings the
  // parameters the model computes with up to date. The only other change a load makes.
  std::function<Status(const EngineCounters& saved)> restore;
};

namespace detail {

// Engine::save_checkpoint and Engine::load_checkpoint (zinf/zero3/engine.h, checkpoint.h).
Status save_checkpoint(const CheckpointState& state, const std::string& dir, const std::string& tag,
                       const std::string& client_state);
Result<std::string> load_checkpoint(const CheckpointState& state, const std::string& dir,
                                    const std::string& requested_tag);

}  // namespace detail
}  // namespace zinf::zero3
