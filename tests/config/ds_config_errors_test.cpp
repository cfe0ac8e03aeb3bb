// Tests for every config error: the message names the file, line:column, the full key and the fix.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include <gtest/gtest.h>

#include "test_util.h"
#include "zinf/config/ds_config.h"

namespace zinf::config {
namespace {

using testing::error_of;
using testing::TempDir;

// A config that fails, the exact start of its message, and more text the message must contain.
struct ErrorCase {
  const char* name;
  const char* json;
  const char* prefix;
  const char* contains = "";
};

class ConfigErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(ConfigErrorTest, MessageNamesFileKeyAndProblem) {
  const ErrorCase& c = GetParam();
  std::string message = error_of(c.json);
  EXPECT_EQ(message.rfind(c.prefix, 0), 0u) << "message: " << message;
  EXPECT_NE(message.find(c.contains), std::string::npos) << "message: " << message;
}

// Keep each JSON on one line so that the column in `prefix` is easy to check by eye.
INSTANTIATE_TEST_SUITE_P(
    All, ConfigErrorTest,
    ::testing::Values(
        // unknown keys at every level, with suggestions
        ErrorCase{"UnknownTopLevel", R"({"train_batch_size": 1, "gradient_cliping": 1.0})",
                  "ds_config.json:1:25: gradient_cliping: unknown key; did you mean 'gradient_clipping'?"},
        ErrorCase{"UnknownZeroKey", R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "stage3_max_live_parameter": 1e9}})",
                  "ds_config.json:1:59: zero_optimization.stage3_max_live_parameter: unknown key; did you mean 'stage3_max_live_parameters'?"},
        ErrorCase{"UnknownOffloadKey", R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memroy": true}}})",
                  "ds_config.json:1:94: zero_optimization.offload_param.pin_memroy: unknown key; did you mean 'pin_memory'?"},
        ErrorCase{"MisspelledBlock", R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "offload_params": {"device": "cpu"}}})",
                  "ds_config.json:1:59: zero_optimization.offload_params: unknown key; did you mean 'offload_param'?"},
        // by meaning before letters: the key's words inside a known key
        ErrorCase{"WarmupStepsMeansNumSteps", R"({"train_batch_size": 1, "scheduler": {"type": "WarmupLR", "params": {"warmup_steps": 10}}})",
                  "ds_config.json:1:70: scheduler.params.warmup_steps: unknown key; did you mean 'warmup_num_steps'?"},
        ErrorCase{"MaxLiveParamsMeansMaxLiveParameters", R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "max_live_params": 1e9}})",
                  "ds_config.json:1:59: zero_optimization.max_live_params: unknown key; did you mean 'max_live_parameters'?"},
        ErrorCase{"UnknownAioKey", R"({"train_batch_size": 1, "aio": {"queue_dept": 8}})",
                  "ds_config.json:1:33: aio.queue_dept: unknown key; did you mean 'queue_depth'?"},
        ErrorCase{"AioTimeoutNotPositive", R"({"train_batch_size": 1, "aio": {"request_timeout_s": 0}})",
                  "ds_config.json:1:33: aio.request_timeout_s: expected a number > 0"},
        ErrorCase{"AioTimeoutNotANumber", R"({"train_batch_size": 1, "aio": {"request_timeout_s": "2m"}})",
                  "ds_config.json:1:33: aio.request_timeout_s:"},
        ErrorCase{"NvmeTuneThreadName", R"({"train_batch_size": 1, "aio": {"num_threads": 8}})",
                  "ds_config.json:1:33: aio.num_threads: unknown key; ds_nvme_tune prints 'num_threads'",
                  "did you mean 'intra_op_parallelism'?"},
        ErrorCase{"UnknownFp16Key", R"({"train_batch_size": 1, "fp16": {"enabled": true, "loss_scale_windows": 100}})",
                  "ds_config.json:1:51: fp16.loss_scale_windows: unknown key; did you mean 'loss_scale_window'?"},
        ErrorCase{"UnknownOptimizerParam", R"({"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {"betas1": 0.9}}})",
                  "ds_config.json:1:67: optimizer.params.betas1: unknown key; did you mean 'betas'?"},
        ErrorCase{"ParamOfAnotherOptimizer", R"({"train_batch_size": 1, "optimizer": {"type": "Lion", "params": {"eps": 1e-8}}})",
                  "ds_config.json:1:66: optimizer.params.eps: unknown key"},
        ErrorCase{"UnknownSchedulerParam", R"({"train_batch_size": 1, "scheduler": {"type": "WarmupLR", "params": {"warmup_steps": 10}}})",
                  "ds_config.json:1:70: scheduler.params.warmup_steps: unknown key"},
        ErrorCase{"NoSuggestionForFarKeys", R"({"train_batch_size": 1, "my_custom_setting": 3})",
                  "ds_config.json:1:25: my_custom_setting: unknown key (not a key DeepSpeed or zinf knows at the top level)"},
        // wrong types
        ErrorCase{"StringForInteger", R"({"train_batch_size": "32"})",
                  "ds_config.json:1:2: train_batch_size: expected an integer from 1 to 2147483647, got the string \"32\""},
        ErrorCase{"StringForBoolean", R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "overlap_comm": "true"}})",
                  "ds_config.json:1:59: zero_optimization.overlap_comm: expected a boolean (true/false), got the string \"true\""},
        ErrorCase{"NumberForBoolean", R"({"train_batch_size": 1, "wall_clock_breakdown": 0})",
                  "ds_config.json:1:25: wall_clock_breakdown: expected a boolean (true/false), got 0"},
        ErrorCase{"ArrayForObject", R"({"train_batch_size": 1, "zero_optimization": [3]})",
                  "ds_config.json:1:25: zero_optimization: expected an object {...}, got an array"},
        ErrorCase{"FractionForInteger", R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "sub_group_size": 2.5e0}})",
                  "ds_config.json:1:59: zero_optimization.sub_group_size: expected a non-negative integer, got 2.5 (not a whole number)"},
        ErrorCase{"TopLevelNotAnObject", R"([1, 2])", "ds_config.json: the top level must be an object {...}, got an array"},
        // out-of-range values
        ErrorCase{"StageTooHigh", R"({"train_batch_size": 1, "zero_optimization": {"stage": 4}})",
                  "ds_config.json:1:47: zero_optimization.stage: expected an integer from 0 to 3, got 4"},
        ErrorCase{"NegativeBufferCount", R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "buffer_count": -1}}})",
                  "ds_config.json:1:94: zero_optimization.offload_param.buffer_count: expected a positive integer, got -1"},
        ErrorCase{"RatioAboveOne", R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 1.5}}})",
                  "ds_config.json:1:98: zero_optimization.offload_optimizer.ratio: expected a number from 0 to 1, got 1.5"},
        ErrorCase{"NegativeClipping", R"({"train_batch_size": 1, "gradient_clipping": -1})",
                  "ds_config.json:1:25: gradient_clipping: expected a number >= 0, got -1"},
        ErrorCase{"ZeroBlockSize", R"({"train_batch_size": 1, "aio": {"block_size": 0}})",
                  "ds_config.json:1:33: aio.block_size: expected an integer from 4096 to 1073741824, got 0"},
        ErrorCase{"BlockSizeNotAPageMultiple", R"({"train_batch_size": 1, "aio": {"block_size": 6000}})",
                  "ds_config.json:1:33: aio.block_size: expected a multiple of 4096 (whole pages, for O_DIRECT), got 6000"},
        ErrorCase{"QueueDepthTooDeep", R"({"train_batch_size": 1, "aio": {"queue_depth": 4096}})",
                  "ds_config.json:1:33: aio.queue_depth: expected an integer from 1 to 1024, got 4096"},
        ErrorCase{"HugeInteger", R"({"train_batch_size": 1e30})",
                  "ds_config.json:1:2: train_batch_size: expected an integer from 1 to 2147483647, got 1e+30 (out of range)"},
        // Batch sizes are counted in int by the trainer: 2^32 + 1 must not pass as a micro-batch of 1.
        ErrorCase{"MicroBatchOverInt", R"({"train_micro_batch_size_per_gpu": 4294967297})",
                  "ds_config.json:1:2: train_micro_batch_size_per_gpu: expected an integer from 1 to 2147483647, got "
                  "4294967297"},
        ErrorCase{"DerivedBatchOverInt",
                  R"({"train_micro_batch_size_per_gpu": 65536, "gradient_accumulation_steps": 65536})",
                  "ds_config.json: train_batch_size: 4294967296 (train_micro_batch_size_per_gpu * "
                  "gradient_accumulation_steps * world size) is over 2147483647, the largest batch zinf can count"},
        ErrorCase{"BadDevice", R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "offload_param": {"device": "CPU"}}})",
                  "ds_config.json:1:77: zero_optimization.offload_param.device: expected one of \"none\", \"cpu\", \"nvme\", got \"CPU\"; did you mean \"cpu\"?"},
        ErrorCase{"BadBetas", R"({"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"betas": [0.9]}}})",
                  "ds_config.json:1:66: optimizer.params.betas: expected a list of 2 numbers", "got 1 elements"},
        ErrorCase{"BetaOfOne", R"({"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"betas": [0.9, 1.0]}}})",
                  "ds_config.json:1:66: optimizer.params.betas: expected a list of 2 numbers", "got 1 at position 1"},
        ErrorCase{"CommDataType", R"({"train_batch_size": 1, "communication_data_type": "fp8"})",
                  "ds_config.json:1:25: communication_data_type: expected one of \"fp32\", \"fp16\", \"bf16\", got \"fp8\""},
        // offload rules
        ErrorCase{"NvmeWithoutPath", R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})",
                  "ds_config.json: zero_optimization.offload_param.nvme_path: required when device is \"nvme\""},
        ErrorCase{"NvmePathMissing", R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/nonexistent/zinf/nvme"}}})",
                  "ds_config.json:1:99: zero_optimization.offload_optimizer.nvme_path: \"/nonexistent/zinf/nvme\" does not exist"},
        ErrorCase{"NvmePathIsAFile", R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/proc/self/status"}}})",
                  "ds_config.json:1:95: zero_optimization.offload_param.nvme_path: \"/proc/self/status\" is not a directory"},
        ErrorCase{"OffloadParamBelowStage3", R"({"train_batch_size": 1, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})",
                  "ds_config.json:1:59: zero_optimization.offload_param: parameter offload needs ZeRO stage 3, but zero_optimization.stage is 2"},
        ErrorCase{"OffloadParamWithDefaultStage", R"({"train_batch_size": 1, "zero_optimization": {"offload_param": {"device": "cpu"}}})",
                  "ds_config.json:1:47: zero_optimization.offload_param: parameter offload needs ZeRO stage 3, but zero_optimization.stage is 0"},
        ErrorCase{"NvmeOptimizerBelowStage3", R"({"train_batch_size": 1, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}}})",
                  "ds_config.json:1:59: zero_optimization.offload_optimizer: optimizer offload to NVMe needs ZeRO stage 3"},
        ErrorCase{"PartialOffloadBelowStage3", R"({"train_batch_size": 1, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})",
                  "ds_config.json:1:98: zero_optimization.offload_optimizer.ratio: partial optimizer offload (ratio < 1) needs ZeRO stage 3"},
        // precision
        ErrorCase{"Fp16AndBf16", R"({"train_batch_size": 1, "fp16": {"enabled": true}, "bf16": {"enabled": true}})",
                  "ds_config.json:1:61: bf16.enabled: fp16 and bf16 are both enabled; enable at most one"},
        // batch rules
        ErrorCase{"InconsistentBatch", R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})",
                  "ds_config.json:1:2: train_batch_size: 32 != train_micro_batch_size_per_gpu 4 * gradient_accumulation_steps 2 * world size 1"},
        ErrorCase{"IndivisibleBatch", R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4})",
                  "ds_config.json:1:2: train_batch_size: 30 is not a multiple of train_micro_batch_size_per_gpu 4 * world size 1"},
        ErrorCase{"NoBatch", R"({"gradient_accumulation_steps": 4})",
                  "ds_config.json: no batch size: set train_batch_size or train_micro_batch_size_per_gpu (or pass --micro-batch)"},
        // "auto" that nothing resolves
        ErrorCase{"AutoLrWithoutCommandLine", R"({"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})",
                  "ds_config.json:1:67: optimizer.params.lr: is \"auto\", which takes its value from the command line; pass --lr"},
        ErrorCase{"AutoBatchWithoutCommandLine", R"({"train_micro_batch_size_per_gpu": "auto"})",
                  "ds_config.json:1:2: train_micro_batch_size_per_gpu: is \"auto\", which takes its value from the command line; pass --micro-batch"},
        ErrorCase{"AutoBucketWithoutModel", R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}})",
                  "ds_config.json:1:59: zero_optimization.reduce_bucket_size: is \"auto\", which is hidden_size * hidden_size from the model; pass --hidden (or --model)"},
        ErrorCase{"AutoPrecisionWithoutCommandLine", R"({"train_batch_size": 1, "fp16": {"enabled": "auto"}})",
                  "ds_config.json:1:34: fp16.enabled: is \"auto\", which follows the command-line precision; pass --precision fp32|fp16|bf16"},
        ErrorCase{"AutoClippingWithoutCommandLine", R"({"train_batch_size": 1, "gradient_clipping": "auto"})",
                  "ds_config.json:1:25: gradient_clipping: is \"auto\", which takes its value from the command line; pass --clip"},
        ErrorCase{"AutoOptimizerType", R"({"train_batch_size": 1, "optimizer": {"type": "auto"}})",
                  "ds_config.json:1:39: optimizer.type: cannot be \"auto\"; name the optimizer"},
        ErrorCase{"AutoRequiredParam", R"({"train_batch_size": 1, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": "auto", "cycle_max_lr": 1}}})",
                  "ds_config.json:1:70: scheduler.params.cycle_min_lr: is \"auto\", but nothing gives its value for OneCycle"},
        // old and new names together
        ErrorCase{"CpuOffloadAndOffloadOptimizer", R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "cpu_offload": true, "offload_optimizer": {"device": "cpu"}}})",
                  "ds_config.json:1:59: zero_optimization.cpu_offload: deprecated name of offload_optimizer, and offload_optimizer is given too"},
        ErrorCase{"CpuOffloadParamAndOffloadParam", R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "cpu_offload_param": true}})",
                  "ds_config.json:1:95: zero_optimization.cpu_offload_param: deprecated name of offload_param"},
        ErrorCase{"ThreadCountAndIntraOp", R"({"train_batch_size": 1, "aio": {"thread_count": 2, "intra_op_parallelism": 2}})",
                  "ds_config.json:1:33: aio.thread_count: deprecated name of intra_op_parallelism, which is given too"},
        ErrorCase{"GatherFp16AndGather16", R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": true, "stage3_gather_fp16_weights_on_model_save": true}})",
                  "ds_config.json:1:110: zero_optimization.stage3_gather_fp16_weights_on_model_save: deprecated name of stage3_gather_16bit_weights_on_model_save"},
        ErrorCase{"AliasAndName", R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "max_live_parameters": 1, "stage3_max_live_parameters": 2}})",
                  "ds_config.json:1:85: zero_optimization.stage3_max_live_parameters: 'max_live_parameters' and its alias 'stage3_max_live_parameters' are both given"},
        ErrorCase{"Bfloat16AndBf16", R"({"train_batch_size": 1, "bf16": {"enabled": true}, "bfloat16": {"enabled": true}})",
                  "ds_config.json:1:52: bfloat16: old name of bf16, which is given too"},
        ErrorCase{"AioTwice", R"({"train_batch_size": 1, "aio": {}, "zero_optimization": {"stage": 3, "aio": {}}})",
                  "ds_config.json:1:70: zero_optimization.aio: an aio block is given here and at the top level"},
        // optimizer and scheduler types and params
        ErrorCase{"MisspelledOptimizer", R"({"train_batch_size": 1, "optimizer": {"type": "Adma"}})",
                  "ds_config.json:1:39: optimizer.type: unknown optimizer \"Adma\"; did you mean \"Adam\"?"},
        ErrorCase{"ReferenceOnlyOptimizer", R"({"train_batch_size": 1, "optimizer": {"type": "Lamb"}})",
                  "ds_config.json:1:39: optimizer.type: zinf does not implement the optimizer \"Lamb\"; zinf implements Adam, AdamW, Adagrad, Lion"},
        ErrorCase{"TorchOptimizer", R"({"train_batch_size": 1, "optimizer": {"type": "RMSprop"}})",
                  "ds_config.json:1:39: optimizer.type: unknown optimizer \"RMSprop\" (the reference would look it up in torch"},
        ErrorCase{"OptimizerWithoutType", R"({"train_batch_size": 1, "optimizer": {"params": {"lr": 1}}})",
                  "ds_config.json: optimizer.type: required: the optimizer name"},
        ErrorCase{"Amsgrad", R"({"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"amsgrad": true}}})",
                  "ds_config.json:1:66: optimizer.params.amsgrad: zinf does not implement amsgrad for Adam; remove it or set it to false"},
        ErrorCase{"AdamWWithoutDecoupling", R"({"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})",
                  "ds_config.json:1:67: optimizer.params.adam_w_mode: is false, but the type \"AdamW\" always decouples weight decay"},
        ErrorCase{"TotalStepsRequired", R"({"train_batch_size": 1, "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}})",
                  "ds_config.json: scheduler.params.total_num_steps: required for WarmupDecayLR; give it here or pass --total-steps"},
        ErrorCase{"UnknownScheduler", R"({"train_batch_size": 1, "scheduler": {"type": "WarmupDecay"}})",
                  "ds_config.json:1:39: scheduler.type: unknown scheduler \"WarmupDecay\"; did you mean \"WarmupDecayLR\"?"},
        ErrorCase{"BadWarmupType", R"({"train_batch_size": 1, "scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}})",
                  "ds_config.json:1:70: scheduler.params.warmup_type: expected one of \"log\", \"linear\", got \"cosine\""},
        ErrorCase{"OneCycleMaxBelowMin", R"({"train_batch_size": 1, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1, "cycle_max_lr": 0.5}}})",
                  "ds_config.json:1:89: scheduler.params.cycle_max_lr: is below cycle_min_lr"},
        // JSON syntax
        ErrorCase{"DuplicateKey", R"({"train_batch_size": 1, "train_batch_size": 2})",
                  "ds_config.json:1:25: train_batch_size: duplicate key"},
        ErrorCase{"SyntaxError", R"({"train_batch_size": 1,, "x": 2})",
                  "ds_config.json:1:24: syntax error while parsing object key"}),
    [](const ::testing::TestParamInfo<ErrorCase>& info) { return std::string(info.param.name); });

TEST(ConfigErrorTest, MismatchWithTheCommandLineNamesBothValues) {
  AutoContext ctx;
  ctx.lr = 1e-4;
  std::string m = error_of(R"({"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"lr": 3e-5}}})", ctx);
  EXPECT_EQ(m, "ds_config.json:1:66: optimizer.params.lr: the file says 3e-05 but --lr says 0.0001; make "
               "them agree or set the key to \"auto\"");
  AutoContext batch;
  batch.micro_batch = 2;
  std::string b = error_of(R"({"train_micro_batch_size_per_gpu": 4})", batch);
  EXPECT_EQ(b.rfind("ds_config.json:1:2: train_micro_batch_size_per_gpu: the file says 4 but "
                    "--micro-batch says 2",
                    0),
            0u)
      << b;
}

TEST(ConfigErrorTest, PrecisionMismatchWithTheCommandLine) {
  AutoContext ctx;
  ctx.precision = Precision::kBf16;
  EXPECT_EQ(error_of(R"({"train_batch_size": 1, "fp16": {"enabled": true}})", ctx),
            "ds_config.json:1:34: fp16.enabled: is true, but the command line says --precision bf16; "
            "make them agree or set the key to \"auto\"");
}

TEST(ConfigErrorTest, AutoTrainBatchAloneNeedsAMicroBatch) {
  EXPECT_EQ(error_of(R"({"train_batch_size": "auto"})"),
            "ds_config.json:1:2: train_batch_size: is \"auto\", which takes its value from the "
            "command line; pass --micro-batch or --train-batch");
}

TEST(ConfigErrorTest, BatchErrorUsesTheWorldSize) {
  AutoContext ctx;
  ctx.world_size = 8;
  std::string m = error_of(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})", ctx);
  EXPECT_EQ(m, "ds_config.json:1:2: train_batch_size: 32 != train_micro_batch_size_per_gpu 4 * "
               "gradient_accumulation_steps 2 * world size 8");
}

TEST(ConfigErrorTest, BadCommandLineValuesAreRejected) {
  AutoContext ctx;
  ctx.world_size = 0;
  EXPECT_EQ(error_of(R"({"train_batch_size": 1})", ctx), "--world-size: expected a positive integer, got 0");
  AutoContext h;
  h.hidden_size = -5;
  EXPECT_EQ(error_of(R"({"train_batch_size": 1})", h), "--hidden: expected a positive integer, got -5");
  AutoContext eps;
  eps.eps = 0.0;
  EXPECT_EQ(error_of(R"({"train_batch_size": 1})", eps), "--eps: expected a number > 0, got 0");
  AutoContext steps;
  steps.run_steps = 0;
  EXPECT_EQ(error_of(R"({"train_batch_size": 1})", steps), "--steps: expected a positive integer, got 0");
}

// A required total_num_steps that the file leaves out is not taken from the run's length
// (--steps): only "auto" is.
TEST(ConfigErrorTest, AbsentTotalNumStepsDoesNotFollowTheRunLength) {
  AutoContext run;
  run.run_steps = 20;
  EXPECT_EQ(error_of(R"({"train_batch_size": 1, "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}})", run),
            "ds_config.json: scheduler.params.total_num_steps: required for WarmupDecayLR; give it here or pass --total-steps");
}

TEST(ConfigErrorTest, MultiLineErrorPointsAtTheLine) {
  std::string m = error_of("{\n  \"train_batch_size\": 1,\n  \"zero_optimization\": {\n    \"stage\": 3,\n"
                           "    \"offload_param\": {\n      \"device\": \"cpu\",\n      \"buffer_count\": -1\n"
                           "    }\n  }\n}\n");
  EXPECT_EQ(m, "ds_config.json:7:7: zero_optimization.offload_param.buffer_count: expected a positive "
               "integer, got -1");
}

std::string nvme_path_config(const std::string& nvme_path) {
  return testing::replace_all(
      R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "DIR"}}})",
      "DIR", nvme_path);
}

std::string not_writable_error(const std::string& nvme_path) {
  return "zero_optimization.offload_param.nvme_path: \"" + nvme_path + "\" is not writable";
}

TEST(ConfigErrorTest, NvmePathNotWritable) {
  if (::geteuid() != 0) {
    TempDir dir;
    const std::string locked = dir.path() + "/locked";
    ASSERT_EQ(::mkdir(locked.c_str(), 0555), 0);
    const std::string m = error_of(nvme_path_config(locked));
    EXPECT_NE(m.find(not_writable_error(locked)), std::string::npos) << m;
    return;
  }
  // Root passes permission checks: check in a child that drops to nobody (uid 65534), in a
  // folder that user can reach wherever the checkout lives.
  std::string why;
  const std::unique_ptr<TempDir> dir = zinf::testing::temp_dir_nobody_can_reach(&why);
  if (!dir) GTEST_SKIP() << why;
  const std::string locked = dir->path() + "/locked";
  ASSERT_EQ(::mkdir(locked.c_str(), 0555), 0);
  ASSERT_EQ(::chmod(dir->path().c_str(), 0755), 0);
  const std::string config = nvme_path_config(locked);
  const std::string expected = not_writable_error(locked);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (!zinf::testing::drop_to_nobody().empty()) ::_exit(3);
    ::_exit(error_of(config).find(expected) != std::string::npos ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child (uid 65534) did not get the not-writable error (3: setuid failed)";
}

TEST(ConfigErrorTest, DocumentationConfigWithAMissingCommaNamesItsLine) {
  // The Hugging Face docs' ZeRO-2 example misses a comma after "contiguous_gradients": true.
  auto r = load_ds_config(testing::data_path("hf_zero2_missing_comma.json"), {});
  ASSERT_FALSE(r.is_ok());
  std::string expected_prefix = testing::data_path("hf_zero2_missing_comma.json") +
                                ":14:9: syntax error while parsing object - unexpected string literal";
  EXPECT_EQ(r.status().message().rfind(expected_prefix, 0), 0u) << r.status().message();
}

TEST(ConfigErrorTest, MissingFileIsAnError) {
  auto r = load_ds_config("/nonexistent/ds_config.json", {});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "/nonexistent/ds_config.json: cannot open: No such file or directory");
}

}  // namespace
}  // namespace zinf::config
