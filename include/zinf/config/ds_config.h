// Public API of the config layer: reads a DeepSpeed ds_config.json into plain, fully resolved structs.
//
// Contract:
// - Every key the reference (DeepSpeed) knows is either read into these structs or accepted and
//   named in one warning ("known to DeepSpeed, not implemented by zinf"). Any other key is an
//   error with a "did you mean" suggestion. Comments (// and /* */) and trailing commas are
//   accepted; every other JSON error names line and column.
// - "auto" values are resolved here, from the model (hidden size) and the command line
//   (AutoContext), or fall back to the reference default where DeepSpeed has no source for them
//   either. What was resolved and how is listed in DsConfig::auto_resolved.
// - Errors are Status messages that start with the file name, the line and column where known,
//   and the full dotted key: "ds_config.json:14:9: zero_optimization.offload_param.buffer_count:
//   expected a positive integer, got -1".
// - The structs hold values in the reference's own units (elements, bytes, steps) and its
//   defaults. Higher layers convert them (e.g. AioSection -> zinf::aio::AioConfig); this layer
//   includes no header of theirs.
// Thread safety: the functions are reentrant; a DsConfig is a plain value.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "zinf/status.h"

namespace zinf::config {

enum class OffloadDevice { kNone, kCpu, kNvme };
std::string_view offload_device_name(OffloadDevice device);  // "none", "cpu", "nvme"

enum class Precision { kFp32, kFp16, kBf16 };
std::string_view precision_name(Precision precision);  // "fp32", "fp16", "bf16"

// Names of the command-line options that fill "auto" values; error messages tell the user to
// pass them, so the zinf CLI should use exactly these spellings.
namespace cli_option {
inline constexpr std::string_view kHiddenSize = "--hidden";  // or a --model preset
inline constexpr std::string_view kWorldSize = "--world-size";
inline constexpr std::string_view kMicroBatch = "--micro-batch";
inline constexpr std::string_view kGradAccum = "--grad-accum";
inline constexpr std::string_view kTrainBatch = "--train-batch";
inline constexpr std::string_view kLr = "--lr";
inline constexpr std::string_view kBetas = "--betas";
inline constexpr std::string_view kEps = "--eps";
inline constexpr std::string_view kWeightDecay = "--weight-decay";
inline constexpr std::string_view kWarmupSteps = "--warmup-steps";
inline constexpr std::string_view kTotalSteps = "--total-steps";
inline constexpr std::string_view kSteps = "--steps";  // zinf train's run length
inline constexpr std::string_view kClip = "--clip";
inline constexpr std::string_view kPrecision = "--precision";
}  // namespace cli_option

// What the model and the command line say. An unset optional means "not given": an "auto" that
// needs it is an error naming the option to pass. A value given here and a different explicit
// value in the file is an error too (as in the Hugging Face integration); a key the file leaves
// out takes the value given here.
// The Hugging Face Trainer's TrainingArguments defaults: what an "auto" that no command-line
// option fills resolves to when AutoContext::trainer_defaults is on (zinf's CLI, unless
// --strict-auto), as the HF integration would fill it from a Trainer left at its defaults.
struct TrainerDefaults {
  static constexpr double kLr = 5e-5;               // learning_rate (optimizer lr, warmup_max_lr)
  static constexpr double kBeta1 = 0.9;             // adam_beta1
  static constexpr double kBeta2 = 0.999;           // adam_beta2
  static constexpr double kEps = 1e-8;              // adam_epsilon
  static constexpr double kWeightDecay = 0.0;       // weight_decay
  static constexpr std::int64_t kMicroBatch = 8;    // per_device_train_batch_size
  static constexpr std::int64_t kGradAccum = 1;     // gradient_accumulation_steps
  static constexpr double kGradientClipping = 1.0;  // max_grad_norm
  static constexpr std::int64_t kWarmupSteps = 0;   // warmup_steps
  // fp16 / bf16: off (the Trainer's fp16=False, bf16=False); total_num_steps: --steps.
};

struct AutoContext {
  // "auto" with no command-line value: false, an error naming the option to pass (as the
  // reference without the HF integration); true, the TrainerDefaults value, noted.
  bool trainer_defaults = false;
  std::int64_t world_size = 1;                   // data-parallel ranks (--world-size)
  std::optional<std::int64_t> hidden_size;       // model hidden size h (--hidden or --model)
  std::optional<std::int64_t> micro_batch;       // train_micro_batch_size_per_gpu (--micro-batch)
  std::optional<std::int64_t> grad_accum;        // gradient_accumulation_steps (--grad-accum)
  std::optional<std::int64_t> train_batch;       // train_batch_size (--train-batch)
  std::optional<double> lr;                      // optimizer lr, scheduler warmup_max_lr (--lr)
  std::optional<std::array<double, 2>> betas;    // optimizer betas (--betas B1,B2)
  std::optional<double> eps;                     // optimizer eps (--eps)
  std::optional<double> weight_decay;            // optimizer weight_decay (--weight-decay)
  std::optional<std::int64_t> warmup_steps;      // scheduler warmup_num_steps (--warmup-steps)
  std::optional<std::int64_t> total_steps;       // scheduler total_num_steps (--total-steps)
  // The run's length (zinf train --steps): only a total_num_steps of "auto" takes it, and only
  // when total_steps is unset. An explicit total_num_steps is the schedule's length whatever
  // the run's length is (a run may stop before the schedule ends, or go past it).
  std::optional<std::int64_t> run_steps;
  std::optional<double> gradient_clipping;       // gradient_clipping (--clip)
  std::optional<Precision> precision;            // fp16.enabled / bf16.enabled (--precision)
};

struct BatchSection {
  std::int64_t train_batch_size = 0;                // = micro * accumulation * world size
  std::int64_t train_micro_batch_size_per_gpu = 0;  // samples per rank per forward/backward
  std::int64_t gradient_accumulation_steps = 0;     // micro-steps per optimizer step
};

// An optimizer or scheduler parameter value: integers stay integers, betas is a list.
using ParamValue = std::variant<std::int64_t, double, bool, std::string, std::vector<double>>;
struct Param {
  std::string name;
  ParamValue value;
};
// Ordered parameter list with every effective value (defaults filled in, "auto" resolved).
struct ParamList {
  std::vector<Param> items;
  const ParamValue* find(std::string_view name) const;  // nullptr when absent
  // Numeric value (an integer widens to double); nullopt when absent or not a number.
  std::optional<double> number(std::string_view name) const;
  std::optional<std::int64_t> integer(std::string_view name) const;
  std::optional<bool> boolean(std::string_view name) const;
  std::optional<std::string> string(std::string_view name) const;
  std::optional<std::vector<double>> numbers(std::string_view name) const;
};

// optimizer {type, params}. type is canonical: "Adam", "AdamW", "Adagrad" or "Lion".
// Adam/AdamW params: lr, betas, eps, weight_decay, bias_correction, adam_w_mode
//   ("Adam" with adam_w_mode true, the default, is AdamW; "AdamW" always is).
// Adagrad params: lr, eps, weight_decay.  Lion params: lr, betas, weight_decay.
struct OptimizerSection {
  std::string type;
  ParamList params;
};

// scheduler {type, params}. type is canonical: "WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
// "OneCycle" or "LRRangeTest"; params hold every parameter of that schedule (reference names).
// OneCycle's cycle_second_step_size and cycle_second_stair_count are absent when not given.
struct SchedulerSection {
  std::string type;
  ParamList params;
};

struct Fp16Section {
  bool enabled = false;
  double loss_scale = 0.0;  // 0 = dynamic scaling; > 0 = static scale
  std::int64_t initial_scale_power = 16;
  std::int64_t loss_scale_window = 1000;
  std::int64_t hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
};

struct Bf16Section {
  bool enabled = false;
};

struct OffloadParamSection {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;  // an existing, writable folder when device is nvme
  bool pin_memory = false;
  std::int64_t buffer_count = 5;           // staging buffers
  std::int64_t buffer_size = 100000000;    // elements per staging buffer
  std::int64_t max_in_cpu = 1000000000;    // elements kept in CPU memory with nvme
};

struct OffloadOptimizerSection {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;
  bool pin_memory = false;
  std::int64_t buffer_count = 4;
  bool pipeline_read = false;
  bool pipeline_write = false;
  bool fast_init = false;
  double ratio = 1.0;  // fraction of the step done on CPU (< 1 needs stage 3)
};

// zero_optimization. The stage3_-prefixed names are aliases of the unprefixed fields.
struct ZeroSection {
  int stage = 0;
  bool overlap_comm = false;  // default: true for stage 3, false otherwise
  bool contiguous_gradients = true;
  std::int64_t reduce_bucket_size = 500000000;          // elements
  std::int64_t sub_group_size = 1000000000;             // elements
  std::int64_t prefetch_bucket_size = 50000000;         // elements
  std::int64_t param_persistence_threshold = 100000;    // elements
  std::int64_t model_persistence_threshold = std::numeric_limits<std::int64_t>::max();  // unlimited
  std::int64_t max_live_parameters = 1000000000;        // elements
  std::int64_t max_reuse_distance = 1000000000;         // elements
  bool gather_16bit_weights_on_model_save = false;
  OffloadParamSection offload_param;
  OffloadOptimizerSection offload_optimizer;
};

struct AioSection {
  std::int64_t block_size = 1048576;  // bytes
  std::int64_t queue_depth = 8;
  std::int64_t intra_op_parallelism = 1;
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;
  // zinf only (DeepSpeed has no such key): seconds one I/O request may take before it is
  // failed (zinf::aio::AioConfig::request_timeout_s). > 0.
  double request_timeout_s = 120.0;
  // Whether the file had an "aio" block (top level, or misplaced under zero_optimization): an
  // NVMe run without one says that it runs on the reference's defaults.
  bool present = false;
};

struct CheckpointSection {
  bool use_node_local_storage = false;
};

// zinf only: the top-level "zinf" block (DeepSpeed reads the keys it knows and ignores this one).
struct ZinfSection {
  // Host memory one rank's process may hold, in bytes (0: no budget): the engine sizes its pinned
  // pools, gathered parameters and buckets from it and refuses a budget the run cannot fit
  // (docs/config.md, "host_memory_budget"). Written as bytes or a size such as "6GiB" or "512M".
  std::uint64_t host_memory_budget = 0;
};

// The reference's activation_checkpointing block: validated and kept. A present block turns on
// zinf's own scheme (whole transformer blocks recomputed in backward); its options are ignored,
// which a warning says.
struct ActivationCheckpointingSection {
  bool present = false;  // the file had the block
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  std::optional<std::int64_t> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
};

// One "auto" and what it became: {"zero_optimization.reduce_bucket_size", "16777216",
// "hidden_size * hidden_size"}.
struct AutoResolution {
  std::string key;
  std::string value;
  std::string source;
};

struct DsConfig {
  std::string source;            // the file name used in messages
  std::int64_t world_size = 1;   // the world size the batch sizes were derived for
  BatchSection batch;
  double gradient_clipping = 0.0;  // max global norm; 0 = off
  std::int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  std::optional<OptimizerSection> optimizer;  // absent: the engine's default optimizer
  std::optional<SchedulerSection> scheduler;  // absent: constant learning rate
  Fp16Section fp16;
  Bf16Section bf16;
  ZeroSection zero;
  AioSection aio;
  std::optional<std::string> communication_data_type;  // "fp32", "fp16" or "bf16"; unset = by precision
  CheckpointSection checkpoint;
  bool zero_allow_untested_optimizer = false;
  bool zero_force_ds_cpu_optimizer = true;
  ActivationCheckpointingSection activation_checkpointing;
  ZinfSection zinf;

  // One line each, already prefixed with the source name: deprecated names read under their
  // new name, keys DeepSpeed knows that zinf ignores, other notes.
  std::vector<std::string> warnings;
  std::vector<AutoResolution> auto_resolved;
};

// Parses `text` (the contents of a ds_config.json); `source_name` prefixes every message.
Result<DsConfig> parse_ds_config(std::string_view text, std::string_view source_name,
                                 const AutoContext& ctx);
// "6GiB", "512M", "16G", "1.5T", "1073741824" -> bytes (K, M, G, T are powers of 1024; "i" and
// "B" after the unit are optional; any case). Errors say what was expected.
Result<std::uint64_t> parse_byte_size(std::string_view text);

// Reads and parses the file at `path`; messages use `path` as the source name.
Result<DsConfig> load_ds_config(const std::string& path, const AutoContext& ctx);

// The fully resolved config as pretty-printed JSON (2-space indent), every effective value,
// no "auto": itself a valid ds_config.json that parses back to the same values.
std::string resolved_config_json(const DsConfig& config);

// For start-up: logs the warnings (kWarning), the auto resolutions (kInfo) and the resolved
// config (kInfo) through zinf::log.
void log_resolved_config(const DsConfig& config);

}  // namespace zinf::config
