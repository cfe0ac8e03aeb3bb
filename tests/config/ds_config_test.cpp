// Tests for reading valid ds_config files: defaults, aliases, deprecated names, "auto", batch rules.
#include <cmath>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "zinf/config/ds_config.h"
#include "zinf/optim/optimizer.h"

namespace zinf::config {
namespace {

using testing::parse;
using testing::TempDir;
using testing::trainer_context;

bool has_warning(const DsConfig& c, std::string_view needle) {
  for (const std::string& w : c.warnings) {
    if (w.find(needle) != std::string::npos) return true;
  }
  return false;
}

const AutoResolution* resolution(const DsConfig& c, std::string_view key) {
  for (const AutoResolution& a : c.auto_resolved) {
    if (a.key == key) return &a;
  }
  return nullptr;
}

TEST(DsConfigTest, MinimalConfigHasTheReferenceDefaults) {
  AutoContext ctx;
  ctx.world_size = 2;
  auto r = parse(R"({"train_batch_size": 8})", ctx);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const DsConfig& c = *r;
  EXPECT_EQ(c.source, "ds_config.json");
  EXPECT_EQ(c.batch.train_batch_size, 8);
  EXPECT_EQ(c.batch.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.gradient_clipping, 0.0);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_FALSE(c.optimizer.has_value());
  EXPECT_FALSE(c.scheduler.has_value());
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_EQ(c.fp16.min_loss_scale, 1.0);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero.sub_group_size, 1000000000);
  EXPECT_EQ(c.zero.prefetch_bucket_size, 50000000);
  EXPECT_EQ(c.zero.param_persistence_threshold, 100000);
  EXPECT_EQ(c.zero.model_persistence_threshold, std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(c.zero.max_live_parameters, 1000000000);
  EXPECT_EQ(c.zero.max_reuse_distance, 1000000000);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::kNone);
  EXPECT_EQ(c.zero.offload_param.buffer_count, 5);
  EXPECT_EQ(c.zero.offload_param.buffer_size, 100000000);
  EXPECT_EQ(c.zero.offload_param.max_in_cpu, 1000000000);
  EXPECT_EQ(c.zero.offload_optimizer.buffer_count, 4);
  EXPECT_EQ(c.zero.offload_optimizer.ratio, 1.0);
  EXPECT_EQ(c.aio.block_size, 1048576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);
  EXPECT_FALSE(c.aio.single_submit);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_FALSE(c.aio.use_gds);
  EXPECT_EQ(c.aio.request_timeout_s, 120.0);
  EXPECT_FALSE(c.communication_data_type.has_value());
  EXPECT_FALSE(c.zero_allow_untested_optimizer);
  EXPECT_TRUE(c.zero_force_ds_cpu_optimizer);
  EXPECT_FALSE(c.activation_checkpointing.present);
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_TRUE(c.auto_resolved.empty());
}

TEST(DsConfigTest, OverlapCommDefaultsToTrueAtStage3Only) {
  auto s3 = parse(R"({"train_batch_size": 1, "zero_optimization": {"stage": 3}})");
  ASSERT_TRUE(s3.is_ok());
  EXPECT_TRUE(s3->zero.overlap_comm);
  auto s2 = parse(R"({"train_batch_size": 1, "zero_optimization": {"stage": 2}})");
  ASSERT_TRUE(s2.is_ok());
  EXPECT_FALSE(s2->zero.overlap_comm);
  auto off = parse(R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "overlap_comm": false}})");
  ASSERT_TRUE(off.is_ok());
  EXPECT_FALSE(off->zero.overlap_comm);
}

TEST(DsConfigTest, ReadsEveryZeroAndOffloadKey) {
  TempDir dir;
  std::string text = testing::replace_all(R"({
    "train_batch_size": 4,
    "zero_optimization": {
      "stage": 3, "overlap_comm": false, "contiguous_gradients": false,
      "reduce_bucket_size": 123, "sub_group_size": 456,
      "prefetch_bucket_size": 7, "param_persistence_threshold": 8,
      "model_persistence_threshold": 9, "max_live_parameters": 10, "max_reuse_distance": 11,
      "gather_16bit_weights_on_model_save": true,
      "offload_param": {"device": "nvme", "nvme_path": "DIR", "pin_memory": true,
                        "buffer_count": 6, "buffer_size": 1e7, "max_in_cpu": 0},
      "offload_optimizer": {"device": "nvme", "nvme_path": "DIR", "pin_memory": true,
                            "buffer_count": 8, "pipeline_read": true, "pipeline_write": true,
                            "fast_init": true, "ratio": 0.25}
    },
    "aio": {"block_size": 262144, "queue_depth": 32, "intra_op_parallelism": 4,
            "single_submit": true, "overlap_events": false, "use_gds": true, "request_timeout_s": 2.5}
  })", "DIR", dir.path());
  auto r = parse(text);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const ZeroSection& z = r->zero;
  EXPECT_EQ(z.stage, 3);
  EXPECT_FALSE(z.overlap_comm);
  EXPECT_FALSE(z.contiguous_gradients);
  EXPECT_EQ(z.reduce_bucket_size, 123);
  EXPECT_EQ(z.sub_group_size, 456);
  EXPECT_EQ(z.prefetch_bucket_size, 7);
  EXPECT_EQ(z.param_persistence_threshold, 8);
  EXPECT_EQ(z.model_persistence_threshold, 9);
  EXPECT_EQ(z.max_live_parameters, 10);
  EXPECT_EQ(z.max_reuse_distance, 11);
  EXPECT_TRUE(z.gather_16bit_weights_on_model_save);
  EXPECT_EQ(z.offload_param.device, OffloadDevice::kNvme);
  EXPECT_EQ(z.offload_param.nvme_path, dir.path());
  EXPECT_TRUE(z.offload_param.pin_memory);
  EXPECT_EQ(z.offload_param.buffer_count, 6);
  EXPECT_EQ(z.offload_param.buffer_size, 10000000);
  EXPECT_EQ(z.offload_param.max_in_cpu, 0);
  EXPECT_EQ(z.offload_optimizer.device, OffloadDevice::kNvme);
  EXPECT_EQ(z.offload_optimizer.buffer_count, 8);
  EXPECT_TRUE(z.offload_optimizer.pipeline_read);
  EXPECT_TRUE(z.offload_optimizer.pipeline_write);
  EXPECT_TRUE(z.offload_optimizer.fast_init);
  EXPECT_EQ(z.offload_optimizer.ratio, 0.25);
  EXPECT_EQ(r->aio.block_size, 262144);
  EXPECT_EQ(r->aio.queue_depth, 32);
  EXPECT_EQ(r->aio.intra_op_parallelism, 4);
  EXPECT_TRUE(r->aio.single_submit);
  EXPECT_FALSE(r->aio.overlap_events);
  EXPECT_TRUE(r->aio.use_gds);
  EXPECT_EQ(r->aio.request_timeout_s, 2.5);
  EXPECT_TRUE(r->warnings.empty());
}

TEST(DsConfigTest, Stage3PrefixedNamesAreAliases) {
  auto prefixed = parse(R"({"train_batch_size": 1, "zero_optimization": {"stage": 3,
      "stage3_prefetch_bucket_size": 1, "stage3_param_persistence_threshold": 2,
      "stage3_model_persistence_threshold": 3, "stage3_max_live_parameters": 4,
      "stage3_max_reuse_distance": 5, "stage3_gather_16bit_weights_on_model_save": true}})");
  ASSERT_TRUE(prefixed.is_ok()) << prefixed.status().message();
  EXPECT_EQ(prefixed->zero.prefetch_bucket_size, 1);
  EXPECT_EQ(prefixed->zero.param_persistence_threshold, 2);
  EXPECT_EQ(prefixed->zero.model_persistence_threshold, 3);
  EXPECT_EQ(prefixed->zero.max_live_parameters, 4);
  EXPECT_EQ(prefixed->zero.max_reuse_distance, 5);
  EXPECT_TRUE(prefixed->zero.gather_16bit_weights_on_model_save);
  EXPECT_TRUE(prefixed->warnings.empty());
}

TEST(DsConfigTest, WholeNumbersInScientificNotationAreIntegers) {
  auto r = parse(R"({"train_batch_size": 1.6e1, "zero_optimization": {"stage": 3,
      "sub_group_size": 1e14, "stage3_max_live_parameters": 1.000000e+09,
      "reduce_bucket_size": 5E8}})");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->batch.train_batch_size, 16);
  EXPECT_EQ(r->zero.sub_group_size, 100000000000000);
  EXPECT_EQ(r->zero.max_live_parameters, 1000000000);
  EXPECT_EQ(r->zero.reduce_bucket_size, 500000000);
}

TEST(DsConfigTest, NullMeansTheDefault) {
  auto r = parse(R"({"train_batch_size": 1, "communication_data_type": null, "steps_per_print": null,
      "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "nvme_path": null}}})");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_FALSE(r->communication_data_type.has_value());
  EXPECT_EQ(r->steps_per_print, 10);
  EXPECT_EQ(r->zero.offload_param.device, OffloadDevice::kCpu);
  EXPECT_TRUE(r->zero.offload_param.nvme_path.empty());
}

TEST(DsConfigTest, DeprecatedCpuOffloadNamesMapWithANote) {
  auto r = parse(R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "cpu_offload": true,
      "cpu_offload_param": true, "cpu_offload_use_pin_memory": true}})");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_EQ(r->zero.offload_param.device, OffloadDevice::kCpu);
  EXPECT_TRUE(r->zero.offload_param.pin_memory);
  EXPECT_TRUE(r->zero.offload_optimizer.pin_memory);
  EXPECT_TRUE(has_warning(*r, "zero_optimization.cpu_offload: is deprecated"));
  EXPECT_TRUE(has_warning(*r, "zero_optimization.cpu_offload_param: is deprecated"));
  EXPECT_TRUE(has_warning(*r, "zero_optimization.cpu_offload_use_pin_memory: is deprecated"));
  auto off = parse(R"({"train_batch_size": 1, "zero_optimization": {"stage": 2, "cpu_offload": false}})");
  ASSERT_TRUE(off.is_ok());
  EXPECT_EQ(off->zero.offload_optimizer.device, OffloadDevice::kNone);
}

TEST(DsConfigTest, DeprecatedGatherFp16AndThreadCountAndBfloat16) {
  auto r = parse(R"({"train_batch_size": 1,
      "zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true},
      "aio": {"thread_count": 3}, "bfloat16": {"enabled": true}})");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_TRUE(r->zero.gather_16bit_weights_on_model_save);
  EXPECT_EQ(r->aio.intra_op_parallelism, 3);
  EXPECT_TRUE(r->bf16.enabled);
  EXPECT_TRUE(has_warning(*r, "stage3_gather_fp16_weights_on_model_save: is deprecated"));
  EXPECT_TRUE(has_warning(*r, "aio.thread_count: is deprecated; read as intra_op_parallelism"));
  EXPECT_TRUE(has_warning(*r, "bfloat16: is the old name of bf16"));
}

TEST(DsConfigTest, BooleanZeroOptimizationIsTheOldStage1Switch) {
  auto r = parse(R"({"train_batch_size": 1, "zero_optimization": true, "allgather_size": 5e8})");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->zero.stage, 1);
  EXPECT_TRUE(has_warning(*r, "zero_optimization: the boolean form is deprecated"));
}

TEST(DsConfigTest, KnownButUnimplementedKeysAreNamedInOneWarning) {
  auto r = parse(R"({"train_batch_size": 1, "tensorboard": {"enabled": true}, "prescale_gradients": true,
      "fp16": {"enabled": true, "auto_cast": false},
      "zero_optimization": {"stage": 3, "round_robin_gradients": true, "allgather_bucket_size": 5e8,
        "offload_optimizer": {"device": "cpu", "super_offload": false}},
      "aio": {"io_backend": "async_io"}, "checkpoint": {"tag_validation": "Warn"},
      "optimizer": {"type": "Adam", "legacy_fusion": false, "params": {"torch_adam": false}}})");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  ASSERT_EQ(r->warnings.size(), 1u);
  const std::string& w = r->warnings[0];
  EXPECT_EQ(w.rfind("ds_config.json: ignoring keys that DeepSpeed knows but zinf does not implement: ", 0), 0u) << w;
  for (std::string_view key :
       {"tensorboard", "prescale_gradients", "fp16.auto_cast", "zero_optimization.round_robin_gradients",
        "zero_optimization.allgather_bucket_size", "zero_optimization.offload_optimizer.super_offload",
        "aio.io_backend", "checkpoint.tag_validation", "optimizer.legacy_fusion",
        "optimizer.params.torch_adam"}) {
    EXPECT_NE(w.find(key), std::string::npos) << key;
  }
}

TEST(DsConfigTest, AioNestedInZeroOptimizationIsReadWithAWarning) {
  auto r = parse(R"({"train_batch_size": 1, "zero_optimization": {"stage": 3,
      "aio": {"block_size": 262144, "queue_depth": 32}}})");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->aio.block_size, 262144);
  EXPECT_EQ(r->aio.queue_depth, 32);
  EXPECT_TRUE(has_warning(*r, "zero_optimization.aio: belongs at the top level"));
  EXPECT_TRUE(r->aio.present);
}

TEST(DsConfigTest, AioPresentOnlyWhenTheFileHasTheBlock) {
  auto with = parse(R"({"train_batch_size": 1, "aio": {}})");
  ASSERT_TRUE(with.is_ok()) << with.status().message();
  EXPECT_TRUE(with->aio.present);
  auto without = parse(R"({"train_batch_size": 1})");
  ASSERT_TRUE(without.is_ok()) << without.status().message();
  EXPECT_FALSE(without->aio.present);
  EXPECT_EQ(without->aio.queue_depth, 8);  // the reference's default
}

TEST(DsConfigTest, AutoBucketSizesComeFromTheHiddenSize) {
  AutoContext ctx;
  ctx.hidden_size = 1024;
  auto r = parse(R"({"train_batch_size": 1, "zero_optimization": {"stage": 3,
      "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
      "stage3_param_persistence_threshold": "auto"}})", ctx);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->zero.reduce_bucket_size, 1024 * 1024);
  EXPECT_EQ(r->zero.prefetch_bucket_size, 943718);  // floor(0.9 * 1024 * 1024)
  EXPECT_EQ(r->zero.param_persistence_threshold, 10240);
  const AutoResolution* a = resolution(*r, "zero_optimization.reduce_bucket_size");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->value, "1048576");
  EXPECT_EQ(a->source, "hidden_size * hidden_size");
  EXPECT_NE(resolution(*r, "zero_optimization.stage3_prefetch_bucket_size"), nullptr);
  EXPECT_NE(resolution(*r, "zero_optimization.stage3_param_persistence_threshold"), nullptr);
}

TEST(DsConfigTest, AutoWithoutASourceIsTheReferenceDefault) {
  // Below stage 3 the Hugging Face integration leaves these "auto" for DeepSpeed, which drops
  // them to its defaults; knobs like max_live_parameters have no source at any stage.
  auto r = parse(R"({"train_batch_size": 1, "zero_optimization": {"stage": 2,
      "reduce_bucket_size": "auto", "stage3_max_live_parameters": "auto"}})");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->zero.reduce_bucket_size, 500000000);
  EXPECT_EQ(r->zero.max_live_parameters, 1000000000);
  const AutoResolution* a = resolution(*r, "zero_optimization.stage3_max_live_parameters");
  ASSERT_NE(a, nullptr);
  EXPECT_NE(a->source.find("reference default"), std::string::npos);
}

TEST(DsConfigTest, HuggingFaceZero3AutoConfigResolvesFromTheCommandLine) {
  AutoContext ctx = trainer_context();
  auto r = load_ds_config(testing::data_path("hf_zero3_auto.json"), ctx);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->batch.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(r->batch.gradient_accumulation_steps, 1);
  EXPECT_EQ(r->batch.train_batch_size, 16);  // 8 * 1 * world size 2
  EXPECT_EQ(r->gradient_clipping, 1.0);
  EXPECT_TRUE(r->fp16.enabled);
  EXPECT_FALSE(r->bf16.enabled);
  ASSERT_TRUE(r->optimizer.has_value());
  EXPECT_EQ(r->optimizer->type, "AdamW");
  EXPECT_EQ(r->optimizer->params.number("lr"), 5e-5);
  EXPECT_EQ(r->optimizer->params.numbers("betas"), (std::vector<double>{0.9, 0.999}));
  EXPECT_EQ(r->optimizer->params.number("eps"), 1e-8);
  EXPECT_EQ(r->optimizer->params.number("weight_decay"), 0.0);
  EXPECT_EQ(r->optimizer->params.boolean("adam_w_mode"), true);
  ASSERT_TRUE(r->scheduler.has_value());
  EXPECT_EQ(r->scheduler->type, "WarmupLR");
  EXPECT_EQ(r->scheduler->params.number("warmup_min_lr"), 0.0);
  EXPECT_EQ(r->scheduler->params.number("warmup_max_lr"), 5e-5);
  EXPECT_EQ(r->scheduler->params.integer("warmup_num_steps"), 0);
  EXPECT_EQ(r->zero.reduce_bucket_size, 1048576);
  EXPECT_EQ(r->zero.offload_param.device, OffloadDevice::kCpu);
  EXPECT_TRUE(r->zero.offload_param.pin_memory);
  const AutoResolution* lr = resolution(*r, "optimizer.params.lr");
  ASSERT_NE(lr, nullptr);
  EXPECT_EQ(lr->source, "--lr");
  EXPECT_NE(resolution(*r, "train_batch_size"), nullptr);
  EXPECT_NE(resolution(*r, "fp16.enabled"), nullptr);
}

TEST(DsConfigTest, PrecisionFollowsTheCommandLine) {
  AutoContext ctx;
  ctx.precision = Precision::kBf16;
  // The Hugging Face ZeRO-3 example has only "fp16": {"enabled": "auto"}; --bf16 must still
  // turn bf16 on.
  auto r = parse(R"({"train_batch_size": 1, "fp16": {"enabled": "auto", "loss_scale": 0}})", ctx);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_FALSE(r->fp16.enabled);
  EXPECT_TRUE(r->bf16.enabled);
  ctx.precision = Precision::kFp32;
  auto fp32 = parse(R"({"train_batch_size": 1, "bf16": {"enabled": false}})", ctx);
  ASSERT_TRUE(fp32.is_ok()) << fp32.status().message();
  EXPECT_FALSE(fp32->fp16.enabled);
  EXPECT_FALSE(fp32->bf16.enabled);
}

TEST(DsConfigTest, KeysTheFileLeavesOutTakeTheCommandLine) {
  AutoContext ctx;
  ctx.micro_batch = 2;
  ctx.lr = 1e-4;
  ctx.gradient_clipping = 0.5;
  auto r = parse(R"({"optimizer": {"type": "AdamW", "params": {"weight_decay": 0.01}}})", ctx);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->batch.train_micro_batch_size_per_gpu, 2);
  EXPECT_EQ(r->batch.train_batch_size, 2);
  EXPECT_EQ(r->optimizer->params.number("lr"), 1e-4);
  EXPECT_EQ(r->gradient_clipping, 0.5);
  EXPECT_TRUE(r->auto_resolved.empty());
}

TEST(DsConfigTest, ExplicitValuesEqualToTheCommandLineAreFine) {
  AutoContext ctx;
  ctx.micro_batch = 4;
  ctx.lr = 3e-5;
  auto r = parse(R"({"train_micro_batch_size_per_gpu": 4,
                     "optimizer": {"type": "Adam", "params": {"lr": 3e-5}}})", ctx);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
}

struct BatchCase {
  const char* json;
  std::int64_t world;
  std::int64_t train, micro, accum;
};

class BatchDerivationTest : public ::testing::TestWithParam<BatchCase> {};

TEST_P(BatchDerivationTest, AnyTwoDetermineTheThird) {
  const BatchCase& c = GetParam();
  AutoContext ctx;
  ctx.world_size = c.world;
  auto r = parse(c.json, ctx);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->batch.train_batch_size, c.train);
  EXPECT_EQ(r->batch.train_micro_batch_size_per_gpu, c.micro);
  EXPECT_EQ(r->batch.gradient_accumulation_steps, c.accum);
  EXPECT_EQ(r->world_size, c.world);
}

INSTANTIATE_TEST_SUITE_P(
    Rules, BatchDerivationTest,
    ::testing::Values(
        BatchCase{R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})", 4, 32, 4, 2},
        BatchCase{R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})", 4, 32, 4, 2},
        BatchCase{R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})", 4, 32, 4, 2},
        BatchCase{R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})", 4, 32, 4, 2},
        BatchCase{R"({"train_batch_size": 32})", 4, 32, 8, 1},
        BatchCase{R"({"train_micro_batch_size_per_gpu": 3})", 2, 6, 3, 1},
        BatchCase{R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3})", 1, 12, 4, 3}));

TEST(DsConfigTest, OptimizerDefaultsAreFilledPerType) {
  auto adam = parse(R"({"train_batch_size": 1, "optimizer": {"type": "adam"}})");
  ASSERT_TRUE(adam.is_ok()) << adam.status().message();
  const ParamList& p = adam->optimizer->params;
  EXPECT_EQ(adam->optimizer->type, "Adam");
  EXPECT_EQ(p.number("lr"), 1e-3);
  EXPECT_EQ(p.numbers("betas"), (std::vector<double>{0.9, 0.999}));
  EXPECT_EQ(p.number("eps"), 1e-8);
  EXPECT_EQ(p.number("weight_decay"), 0.0);
  EXPECT_EQ(p.boolean("bias_correction"), true);
  EXPECT_EQ(p.boolean("adam_w_mode"), true);
  EXPECT_EQ(p.items.size(), 6u);

  auto lion = parse(R"({"train_batch_size": 1, "optimizer": {"type": "Lion", "params": {"lr": 3e-4}}})");
  ASSERT_TRUE(lion.is_ok()) << lion.status().message();
  EXPECT_EQ(lion->optimizer->params.number("lr"), 3e-4);
  EXPECT_EQ(lion->optimizer->params.numbers("betas"), (std::vector<double>{0.9, 0.999}));
  EXPECT_FALSE(lion->optimizer->params.number("eps").has_value());

  auto adagrad = parse(R"({"train_batch_size": 1, "optimizer": {"type": "Adagrad"}})");
  ASSERT_TRUE(adagrad.is_ok()) << adagrad.status().message();
  EXPECT_EQ(adagrad->optimizer->params.number("lr"), 1e-2);
  EXPECT_EQ(adagrad->optimizer->params.number("eps"), 1e-10);

  auto l2 = parse(R"({"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"adam_w_mode": false, "amsgrad": false}}})");
  ASSERT_TRUE(l2.is_ok()) << l2.status().message();
  EXPECT_EQ(l2->optimizer->params.boolean("adam_w_mode"), false);
}

// One schema: the reader's defaults are optim's structs, and both are the reference's values
// (DeepSpeedCPUAdam, torch Adagrad, DeepSpeedCPULion). Before they were shared, the reader
// gave Lion lr 1e-4 / betas (0.9, 0.99) while optim used 1e-3 / (0.9, 0.999).
TEST(DsConfigTest, OptimizerDefaultsAreTheReferencesAndOptimsOwn) {
  struct Case {
    const char* type;
    double lr, beta1, beta2, eps, weight_decay;  // eps < 0: the type has none; beta1 < 0: no betas
  };
  const optim::AdamParams adam;
  const optim::AdagradParams adagrad;
  const optim::LionParams lion;
  for (const Case& c : {Case{"Adam", 1e-3, 0.9, 0.999, 1e-8, 0.0}, Case{"AdamW", 1e-3, 0.9, 0.999, 1e-8, 0.0},
                        Case{"Adagrad", 1e-2, -1, -1, 1e-10, 0.0}, Case{"Lion", 1e-3, 0.9, 0.999, -1, 0.0}}) {
    auto cfg = parse(fmt::format(R"({{"train_batch_size": 1, "optimizer": {{"type": "{}"}}}})", c.type));
    ASSERT_TRUE(cfg.is_ok()) << cfg.status().message();
    const ParamList& p = cfg->optimizer->params;
    EXPECT_EQ(p.number("lr"), c.lr) << c.type;
    EXPECT_EQ(p.number("weight_decay"), c.weight_decay) << c.type;
    if (c.beta1 >= 0) {
      EXPECT_EQ(p.numbers("betas"), (std::vector<double>{c.beta1, c.beta2})) << c.type;
    }
    if (c.eps >= 0) {
      EXPECT_EQ(p.number("eps"), c.eps) << c.type;
    }
  }
  EXPECT_EQ(adam.lr, 1e-3);
  EXPECT_EQ(adam.beta2, 0.999);
  EXPECT_EQ(adam.eps, 1e-8);
  EXPECT_EQ(adagrad.lr, 1e-2);
  EXPECT_EQ(adagrad.eps, 1e-10);
  EXPECT_EQ(lion.lr, 1e-3);
  EXPECT_EQ(lion.beta1, 0.9);
  EXPECT_EQ(lion.beta2, 0.999);
  EXPECT_EQ(lion.weight_decay, 0.0);
}

TEST(DsConfigTest, SchedulerParamsAreFilledPerType) {
  auto decay = parse(R"({"train_batch_size": 1, "scheduler": {"type": "WarmupDecayLR",
      "params": {"total_num_steps": 100, "warmup_type": "linear"}}})");
  ASSERT_TRUE(decay.is_ok()) << decay.status().message();
  const ParamList& d = decay->scheduler->params;
  EXPECT_EQ(d.integer("total_num_steps"), 100);
  EXPECT_EQ(d.number("warmup_min_lr"), 0.0);
  EXPECT_EQ(d.number("warmup_max_lr"), 1e-3);
  EXPECT_EQ(d.integer("warmup_num_steps"), 1000);
  EXPECT_EQ(d.string("warmup_type"), "linear");
  EXPECT_EQ(d.integer("last_batch_iteration"), -1);

  auto cycle = parse(R"({"train_batch_size": 1, "scheduler": {"type": "OneCycle",
      "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 100}}})");
  ASSERT_TRUE(cycle.is_ok()) << cycle.status().message();
  const ParamList& c = cycle->scheduler->params;
  EXPECT_EQ(c.integer("cycle_first_step_size"), 100);
  EXPECT_EQ(c.find("cycle_second_step_size"), nullptr);  // defaults to the first at run time
  EXPECT_EQ(c.boolean("cycle_momentum"), true);
  EXPECT_EQ(c.number("cycle_min_mom"), 0.8);
  EXPECT_EQ(c.number("cycle_max_mom"), 0.9);

  auto range = parse(R"({"train_batch_size": 1, "scheduler": {"type": "LRRangeTest"}})");
  ASSERT_TRUE(range.is_ok()) << range.status().message();
  EXPECT_EQ(range->scheduler->params.number("lr_range_test_min_lr"), 1e-3);
  EXPECT_EQ(range->scheduler->params.integer("lr_range_test_step_size"), 2000);
  EXPECT_EQ(range->scheduler->params.boolean("lr_range_test_staircase"), false);

  AutoContext ctx;
  ctx.total_steps = 500;
  auto cosine = parse(R"({"train_batch_size": 1, "scheduler": {"type": "WarmupCosineLR",
      "params": {"total_num_steps": "auto", "warmup_num_steps": 10}}})", ctx);
  ASSERT_TRUE(cosine.is_ok()) << cosine.status().message();
  EXPECT_EQ(cosine->scheduler->params.integer("total_num_steps"), 500);
  EXPECT_EQ(cosine->scheduler->params.number("cos_min_ratio"), 1e-4);
}

// zinf train passes its --steps as run_steps: the schedule's length is the file's (or
// --total-steps), and only "auto" follows the run's length.
TEST(DsConfigTest, RunStepsFillOnlyAnAutoTotalNumSteps) {
  AutoContext run;
  run.run_steps = 20;
  auto fixed = parse(R"({"train_batch_size": 1, "scheduler": {"type": "WarmupDecayLR",
      "params": {"total_num_steps": 40, "warmup_num_steps": 5}}})", run);
  ASSERT_TRUE(fixed.is_ok()) << fixed.status().message();
  EXPECT_EQ(fixed->scheduler->params.integer("total_num_steps"), 40);
  EXPECT_EQ(resolution(*fixed, "scheduler.params.total_num_steps"), nullptr);

  auto follows = parse(R"({"train_batch_size": 1, "scheduler": {"type": "WarmupCosineLR",
      "params": {"total_num_steps": "auto", "warmup_num_steps": 5}}})", run);
  ASSERT_TRUE(follows.is_ok()) << follows.status().message();
  EXPECT_EQ(follows->scheduler->params.integer("total_num_steps"), 20);
  const AutoResolution* a = resolution(*follows, "scheduler.params.total_num_steps");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->value, "20");
  EXPECT_EQ(a->source, "--steps");

  AutoContext both = run;
  both.total_steps = 30;  // --total-steps wins over --steps for "auto"
  auto explicit_total = parse(R"({"train_batch_size": 1, "scheduler": {"type": "WarmupCosineLR",
      "params": {"total_num_steps": "auto", "warmup_num_steps": 5}}})", both);
  ASSERT_TRUE(explicit_total.is_ok()) << explicit_total.status().message();
  EXPECT_EQ(explicit_total->scheduler->params.integer("total_num_steps"), 30);
}

TEST(DsConfigTest, ActivationCheckpointingIsValidatedAndWarned) {
  auto r = parse(R"({"train_batch_size": 1, "activation_checkpointing": {"partition_activations": true,
      "number_checkpoints": 4, "cpu_checkpointing": true}})");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_TRUE(r->activation_checkpointing.present);
  EXPECT_TRUE(r->activation_checkpointing.partition_activations);
  EXPECT_TRUE(r->activation_checkpointing.cpu_checkpointing);
  EXPECT_EQ(r->activation_checkpointing.number_checkpoints, 4);
  EXPECT_TRUE(has_warning(*r, "activation_checkpointing: turns on zinf's own scheme"));
}

TEST(DsConfigTest, CommunicationDataTypeIsCaseInsensitive) {
  auto r = parse(R"({"train_batch_size": 1, "communication_data_type": "FP32"})");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->communication_data_type, "fp32");
}

TEST(DsConfigTest, CommentsAndTrailingCommasFixture) {
  AutoContext ctx;
  ctx.world_size = 2;
  auto r = load_ds_config(testing::data_path("commented.jsonc"), ctx);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->batch.train_batch_size, 16);
  EXPECT_EQ(r->batch.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(r->batch.gradient_accumulation_steps, 2);
  EXPECT_TRUE(r->bf16.enabled);
  EXPECT_EQ(r->optimizer->type, "AdamW");
  EXPECT_EQ(r->optimizer->params.numbers("betas"), (std::vector<double>{0.9, 0.95}));
  EXPECT_EQ(r->zero.offload_optimizer.nvme_path, "/mnt/a,}//b/*c*/");
  EXPECT_TRUE(has_warning(*r, "zero_optimization.offload_optimizer.nvme_path: is ignored"));
}

// The resolved JSON is a config itself: reading it back gives the same resolved JSON.
void expect_round_trip(const DsConfig& c) {
  std::string first = resolved_config_json(c);
  EXPECT_EQ(first.find("\"auto\""), std::string::npos);
  AutoContext ctx;
  ctx.world_size = c.world_size;
  auto again = parse_ds_config(first, "resolved.json", ctx);
  ASSERT_TRUE(again.is_ok()) << again.status().message() << "\n" << first;
  EXPECT_EQ(resolved_config_json(*again), first);
  EXPECT_TRUE(nlohmann::json::accept(first));  // strict JSON, no comments
}

TEST(DsConfigTest, ResolvedJsonRoundTrips) {
  for (const char* name : {"hf_zero3_auto.json", "hf_zero2_auto.json", "ds_config_json_page.json",
                           "commented.jsonc"}) {
    SCOPED_TRACE(name);
    bool hf = std::string_view(name).rfind("hf_", 0) == 0;
    auto r = load_ds_config(testing::data_path(name), hf ? trainer_context() : testing::model_context());
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    expect_round_trip(*r);
  }
  auto scheduler = parse(R"({"train_batch_size": 1, "scheduler": {"type": "OneCycle",
      "params": {"cycle_min_lr": 0, "cycle_max_lr": 1}},
      "activation_checkpointing": {"profile": true}})");
  ASSERT_TRUE(scheduler.is_ok()) << scheduler.status().message();
  expect_round_trip(*scheduler);
}

TEST(DsConfigTest, ResolvedJsonUsesTheReferenceNames) {
  auto r = parse(R"({"train_batch_size": 2, "zero_optimization": {"stage": 3}})");
  ASSERT_TRUE(r.is_ok());
  nlohmann::json j = nlohmann::json::parse(resolved_config_json(*r));
  EXPECT_EQ(j["zero_optimization"]["stage3_prefetch_bucket_size"], 50000000);
  EXPECT_EQ(j["zero_optimization"]["offload_param"]["device"], "none");
  EXPECT_EQ(j["aio"]["intra_op_parallelism"], 1);
  EXPECT_EQ(j["train_micro_batch_size_per_gpu"], 2);
  EXPECT_TRUE(j["communication_data_type"].is_null());
}

}  // namespace
}  // namespace zinf::config

namespace zinf::config {
namespace {

// With trainer_defaults (zinf's CLI unless --strict-auto), an "auto" no option fills takes the
// Hugging Face Trainer's default and says so; without it (the library default, --strict-auto)
// the same file is an error naming the options to pass.
TEST(DsConfigTrainerDefaultsTest, UnfilledAutosTakeTheTrainersDefaults) {
  AutoContext ctx;
  ctx.hidden_size = 768;
  ctx.run_steps = 100;
  auto strict = load_ds_config(testing::data_path("hf_zero2_auto.json"), ctx);
  ASSERT_FALSE(strict.is_ok());
  EXPECT_NE(strict.status().message().find("--micro-batch"), std::string::npos) << strict.status().message();
  EXPECT_NE(strict.status().message().find("--lr"), std::string::npos) << strict.status().message();

  ctx.trainer_defaults = true;
  auto r = load_ds_config(testing::data_path("hf_zero2_auto.json"), ctx);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->batch.train_micro_batch_size_per_gpu, TrainerDefaults::kMicroBatch);
  EXPECT_EQ(r->batch.gradient_accumulation_steps, 1);
  EXPECT_EQ(r->batch.train_batch_size, 8);
  EXPECT_EQ(r->gradient_clipping, 1.0);
  EXPECT_FALSE(r->fp16.enabled);
  EXPECT_FALSE(r->bf16.enabled);
  const ParamList& o = r->optimizer->params;
  EXPECT_EQ(o.number("lr"), 5e-5);
  EXPECT_EQ(o.numbers("betas"), (std::vector<double>{0.9, 0.999}));
  EXPECT_EQ(o.number("eps"), 1e-8);
  EXPECT_EQ(o.number("weight_decay"), 0.0);
  const ParamList& s = r->scheduler->params;
  EXPECT_EQ(s.integer("warmup_num_steps"), 0);
  EXPECT_EQ(s.number("warmup_max_lr"), 5e-5);
  EXPECT_EQ(s.integer("total_num_steps"), 100);  // from --steps, not a Trainer default
  int trainer_notes = 0;
  for (const AutoResolution& a : r->auto_resolved) {
    trainer_notes += a.source.find("Hugging Face Trainer's default") != std::string::npos ? 1 : 0;
  }
  EXPECT_GE(trainer_notes, 10);

  // A command-line value still wins, and an explicit file value is still checked against it.
  ctx.lr = 2e-4;
  auto with_lr = load_ds_config(testing::data_path("hf_zero2_auto.json"), ctx);
  ASSERT_TRUE(with_lr.is_ok());
  EXPECT_EQ(with_lr->optimizer->params.number("lr"), 2e-4);
}

TEST(DsConfigTrainerDefaultsTest, AFileWithNoBatchKeyTakesTheTrainersBatch) {
  AutoContext ctx;
  ctx.trainer_defaults = true;
  auto r = parse_ds_config(R"({"zero_optimization": {"stage": 3}})", "legacy.json", ctx);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->batch.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(r->batch.train_batch_size, 8);
  ctx.trainer_defaults = false;
  EXPECT_FALSE(parse_ds_config(R"({"zero_optimization": {"stage": 3}})", "legacy.json", ctx).is_ok());
  // An explicit train_batch_size is not overridden: the micro-batch is derived from it.
  ctx.trainer_defaults = true;
  auto t = parse_ds_config(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": "auto"})", "t.json", ctx);
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  EXPECT_EQ(t->batch.train_batch_size, 32);
}

}  // namespace
}  // namespace zinf::config
