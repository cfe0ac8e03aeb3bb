// The resolved config as JSON (every effective value, no "auto") and its start-up log lines.
#include <fmt/format.h>

#include "config/json_text.h"
#include "zinf/config/ds_config.h"
#include "zinf/log.h"

namespace zinf::config {

namespace {

using detail::Json;

Json params_json(const ParamList& params) {
  Json out = Json::object();
  for (const Param& p : params.items) {
    std::visit([&](const auto& v) { out[p.name] = v; }, p.value);
  }
  return out;
}

Json offload_param_json(const OffloadParamSection& p) {
  Json out = Json::object();
  out["device"] = offload_device_name(p.device);
  if (!p.nvme_path.empty()) out["nvme_path"] = p.nvme_path;
  out["pin_memory"] = p.pin_memory;
  out["buffer_count"] = p.buffer_count;
  out["buffer_size"] = p.buffer_size;
  out["max_in_cpu"] = p.max_in_cpu;
  return out;
}

Json offload_optimizer_json(const OffloadOptimizerSection& o) {
  Json out = Json::object();
  out["device"] = offload_device_name(o.device);
  if (!o.nvme_path.empty()) out["nvme_path"] = o.nvme_path;
  out["pin_memory"] = o.pin_memory;
  out["buffer_count"] = o.buffer_count;
  out["pipeline_read"] = o.pipeline_read;
  out["pipeline_write"] = o.pipeline_write;
  out["fast_init"] = o.fast_init;
  out["ratio"] = o.ratio;
  return out;
}

Json zero_json(const ZeroSection& z) {
  Json out = Json::object();
  out["stage"] = z.stage;
  out["overlap_comm"] = z.overlap_comm;
  out["contiguous_gradients"] = z.contiguous_gradients;
  out["reduce_bucket_size"] = z.reduce_bucket_size;
  out["sub_group_size"] = z.sub_group_size;
  out["stage3_prefetch_bucket_size"] = z.prefetch_bucket_size;
  out["stage3_param_persistence_threshold"] = z.param_persistence_threshold;
  out["stage3_model_persistence_threshold"] = z.model_persistence_threshold;
  out["stage3_max_live_parameters"] = z.max_live_parameters;
  out["stage3_max_reuse_distance"] = z.max_reuse_distance;
  out["stage3_gather_16bit_weights_on_model_save"] = z.gather_16bit_weights_on_model_save;
  out["offload_param"] = offload_param_json(z.offload_param);
  out["offload_optimizer"] = offload_optimizer_json(z.offload_optimizer);
  return out;
}

void add_precision(const DsConfig& c, Json* out) {
  (*out)["fp16"] = Json{{"enabled", c.fp16.enabled},
                        {"loss_scale", c.fp16.loss_scale},
                        {"initial_scale_power", c.fp16.initial_scale_power},
                        {"loss_scale_window", c.fp16.loss_scale_window},
                        {"hysteresis", c.fp16.hysteresis},
                        {"consecutive_hysteresis", c.fp16.consecutive_hysteresis},
                        {"min_loss_scale", c.fp16.min_loss_scale}};
  (*out)["bf16"] = Json{{"enabled", c.bf16.enabled}};
}

}  // namespace

std::string resolved_config_json(const DsConfig& c) {
  Json out = Json::object();
  out["train_batch_size"] = c.batch.train_batch_size;
  out["train_micro_batch_size_per_gpu"] = c.batch.train_micro_batch_size_per_gpu;
  out["gradient_accumulation_steps"] = c.batch.gradient_accumulation_steps;
  out["gradient_clipping"] = c.gradient_clipping;
  out["steps_per_print"] = c.steps_per_print;
  out["wall_clock_breakdown"] = c.wall_clock_breakdown;
  if (c.optimizer) {
    out["optimizer"] = Json{{"type", c.optimizer->type}, {"params", params_json(c.optimizer->params)}};
  }
  if (c.scheduler) {
    out["scheduler"] = Json{{"type", c.scheduler->type}, {"params", params_json(c.scheduler->params)}};
  }
  add_precision(c, &out);
  out["zero_optimization"] = zero_json(c.zero);
  out["aio"] = Json{{"block_size", c.aio.block_size},
                    {"queue_depth", c.aio.queue_depth},
                    {"intra_op_parallelism", c.aio.intra_op_parallelism},
                    {"single_submit", c.aio.single_submit},
                    {"overlap_events", c.aio.overlap_events},
                    {"use_gds", c.aio.use_gds},
                    {"request_timeout_s", c.aio.request_timeout_s}};
  out["communication_data_type"] =
      c.communication_data_type ? Json(*c.communication_data_type) : Json(nullptr);
  out["checkpoint"] = Json{{"use_node_local_storage", c.checkpoint.use_node_local_storage}};
  out["zero_allow_untested_optimizer"] = c.zero_allow_untested_optimizer;
  out["zero_force_ds_cpu_optimizer"] = c.zero_force_ds_cpu_optimizer;
  if (c.activation_checkpointing.present) {
    const ActivationCheckpointingSection& ac = c.activation_checkpointing;
    out["activation_checkpointing"] =
        Json{{"partition_activations", ac.partition_activations},
             {"cpu_checkpointing", ac.cpu_checkpointing},
             {"contiguous_memory_optimization", ac.contiguous_memory_optimization},
             {"number_checkpoints",
              ac.number_checkpoints ? Json(*ac.number_checkpoints) : Json(nullptr)},
             {"synchronize_checkpoint_boundary", ac.synchronize_checkpoint_boundary},
             {"profile", ac.profile}};
  }
  if (c.zinf.host_memory_budget > 0) out["zinf"] = Json{{"host_memory_budget", c.zinf.host_memory_budget}};
  return out.dump(2);
}

void log_resolved_config(const DsConfig& c) {
  for (const std::string& w : c.warnings) log(LogLevel::kWarning, w);
  for (const AutoResolution& a : c.auto_resolved) {
    log(LogLevel::kInfo, fmt::format("{}: {} = {} (auto: {})", c.source, a.key, a.value, a.source));
  }
  log(LogLevel::kInfo, fmt::format("{}: resolved config (world size {}):\n{}", c.source,
                                   c.world_size, resolved_config_json(c)));
}

}  // namespace zinf::config
