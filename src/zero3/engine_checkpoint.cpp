// The engine's side of checkpoints: what it hands checkpoint.cpp (CheckpointState), and how a
// load's saved counters and loss scaler come back into it.
#include "zero3/checkpoint_state.h"
#include "zero3/engine_impl.h"

namespace zinf::zero3 {

CheckpointState Engine::Impl::checkpoint_state() {
  Impl& m = *this;
  return CheckpointState{m.comm,
                         *m.model,
                         m.dtype,
                         m.plan,
                         m.layout,
                         m.options.ds.checkpoint.use_node_local_storage,
                         *m.optimizer,
                         m.counters,
                         [&m](const EngineCounters& saved) -> Status {
                           optim::LossScaler::State s;
                           s.scale = saved.loss_scale;
                           s.iteration = saved.scaler_iteration;
                           s.last_overflow_iteration = saved.scaler_last_overflow;
                           s.hysteresis_left = saved.scaler_hysteresis_left;
                           m.counters.steps = saved.steps;
                           m.counters.updates = saved.updates;
                           m.counters.schedule_k = saved.schedule_k;
                           ZINF_RETURN_IF_ERROR(m.scaler->restore(s));
                           m.sync_scaler_counters();
                           ZINF_RETURN_IF_ERROR(m.publish_params());
                           m.coordinator->invalidate_gathered();
                           return Status::ok();
                         }};
}

Status Engine::save_checkpoint(const std::string& dir, const std::string& tag, const std::string& client_state) {
  return detail::save_checkpoint(impl_->checkpoint_state(), dir, tag, client_state);
}

Result<std::string> Engine::load_checkpoint(const std::string& dir, const std::string& tag) {
  return detail::load_checkpoint(impl_->checkpoint_state(), dir, tag);
}

}  // namespace zinf::zero3
