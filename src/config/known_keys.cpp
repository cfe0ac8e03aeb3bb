// Tables of DeepSpeed config keys that zinf accepts with a warning but does not implement.
#include "config/known_keys.h"

namespace zinf::config::detail {

namespace {

constexpr std::string_view kTopLevel[] = {
    // precision and gradient handling zinf does not offer
    "amp", "torch_autocast", "prescale_gradients", "gradient_predivide_factor",
    "gradient_allreduce_op", "sparse_gradients", "disable_allgather", "data_types",
    "seq_parallel_comm_data_type", "managed_gradient_accumulation",
    // logging, monitoring and profiling
    "dump_state", "memory_breakdown", "tensorboard", "wandb", "csv_monitor", "comet",
    "monitor_config", "comms_logger", "comms_config", "flops_profiler", "timers", "log_level",
    // training techniques and parallelism modes
    "sparse_attention", "pipeline", "progressive_layer_drop", "eigenvalue", "quantize_training",
    "compression_training", "data_efficiency", "curriculum_learning", "elasticity",
    "autotuning", "hybrid_engine", "compile", "weight_quantization", "tensor_parallel",
    "expert_parallel", "sequence_parallel_size", "use_data_before_expert_parallelism",
    // runtime housekeeping and checkpoint engines
    "vocabulary_size", "graph_harvesting", "dataloader_drop_last", "disable_python_gc", "nebula",
    "datastates_ckpt", "casync_ckpt",
    // read only with the deprecated boolean form of zero_optimization
    "allgather_size",
};

constexpr std::string_view kZero[] = {
    "reduce_scatter", "allgather_partitions", "allgather_bucket_size",
    "use_multi_rank_bucket_allreduce", "load_from_fp32_weights", "elastic_checkpoint",
    "zenflow", "module_granularity_threshold", "stage3_module_granularity_threshold",
    "use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params",
    "allgather_sequential", "stage3_allgather_sequential", "partition_stream_chunk_size",
    "stage3_partition_stream_chunk_size", "ignore_unused_parameters", "legacy_stage1",
    "round_robin_gradients", "zero_hpz_partition_size", "zero_quantized_weights",
    "zero_quantized_nontrainable_weights", "zero_quantized_gradients", "zeropp_loco_param",
    "mics_shard_size", "mics_hierarchical_params_gather", "memory_efficient_linear",
    "pipeline_loading_checkpoint", "override_module_apply", "log_trace_cache_warnings",
    "enable_sanity_checks", "save_muon_momentum_buffer_in_memory", "leaf_module",
    "compute_grad_norm", "parameter_alignment",
};

constexpr std::string_view kOffloadOptimizer[] = {
    "super_offload", "convert_grad_on_cpu", "cpuadam_cores_perc",
};

constexpr std::string_view kAio[] = {"io_backend"};

constexpr std::string_view kFp16[] = {"auto_cast", "fused_mode", "fp16_master_weights_and_grads"};

constexpr std::string_view kBf16[] = {
    "immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads",
    "bf16_optimizer_states",
};

constexpr std::string_view kCheckpoint[] = {
    "tag_validation", "load_universal", "parallel_write", "checkpoint_serialization", "writer",
};

constexpr std::string_view kOptimizer[] = {"legacy_fusion"};

}  // namespace

std::span<const std::string_view> ignored_top_level_keys() { return kTopLevel; }
std::span<const std::string_view> ignored_zero_keys() { return kZero; }
std::span<const std::string_view> ignored_offload_optimizer_keys() { return kOffloadOptimizer; }
std::span<const std::string_view> ignored_aio_keys() { return kAio; }
std::span<const std::string_view> ignored_fp16_keys() { return kFp16; }
std::span<const std::string_view> ignored_bf16_keys() { return kBf16; }
std::span<const std::string_view> ignored_checkpoint_keys() { return kCheckpoint; }
std::span<const std::string_view> ignored_optimizer_keys() { return kOptimizer; }

}  // namespace zinf::config::detail
