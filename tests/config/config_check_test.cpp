// Tests for `zinf config check`: exit status 0 with the resolved config, 2 with the error.
#include "zinf/config/config_check.h"

#include <cctype>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace zinf::config {
namespace {

using testing::data_path;
using testing::TempDir;

struct CheckOutput {
  int status;
  std::string out;
  std::string err;
};

CheckOutput check(const std::string& path, const AutoContext& ctx) {
  std::ostringstream out, err;
  int status = run_config_check(path, ctx, out, err);
  return {status, out.str(), err.str()};
}

// A documentation config and the command line it is meant for: Hugging Face "auto" configs
// take the Trainer's arguments; explicit ones need only the model (and a batch size when the
// file has none, as the Trainer passes --per_device_train_batch_size).
struct DocCase {
  const char* name;
  bool trainer_args;
  bool micro_batch;
};

class DocumentationConfigTest : public ::testing::TestWithParam<DocCase> {};

TEST_P(DocumentationConfigTest, PassesConfigCheck) {
  const DocCase& c = GetParam();
  AutoContext ctx = c.trainer_args ? testing::trainer_context() : testing::model_context();
  if (c.micro_batch) ctx.micro_batch = 1;
  CheckOutput r = check(data_path(c.name), ctx);
  ASSERT_EQ(r.status, kConfigCheckOk) << r.err;
  nlohmann::json resolved = nlohmann::json::parse(r.out);  // strict JSON on stdout
  EXPECT_TRUE(resolved.contains("zero_optimization"));
  EXPECT_EQ(r.err.find("error:"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DocumentationConfigTest,
                         ::testing::Values(DocCase{"hf_zero3_auto.json", true, false},
                                           DocCase{"hf_zero2_auto.json", true, false},
                                           DocCase{"hf_zero3_legacy.json", false, true},
                                           DocCase{"ds_zero3_offload.json", false, false},
                                           DocCase{"ds_config_json_page.json", false, false},
                                           DocCase{"commented.jsonc", false, false}),
                         [](const ::testing::TestParamInfo<DocCase>& info) {
                           std::string n = info.param.name;
                           for (char& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

// NVMe examples name /local_nvme; on this machine the test points them at a real folder.
TEST(ConfigCheckTest, NvmeDocumentationConfigsPassWithARealFolder) {
  TempDir dir;
  for (const char* name : {"hf_zero_infinity_nvme.json", "ds_zero_infinity_nvme.json"}) {
    SCOPED_TRACE(name);
    std::string text = testing::replace_all(testing::read_text(data_path(name)), "/local_nvme", dir.path());
    std::string path = dir.write(name, text);
    bool hf = std::string_view(name).rfind("hf_", 0) == 0;
    CheckOutput r = check(path, hf ? testing::trainer_context() : testing::model_context());
    ASSERT_EQ(r.status, kConfigCheckOk) << r.err;
    nlohmann::json resolved = nlohmann::json::parse(r.out);
    EXPECT_EQ(resolved["zero_optimization"]["offload_param"]["device"], "nvme");
    EXPECT_EQ(resolved["zero_optimization"]["offload_param"]["nvme_path"], dir.path());
  }
}

TEST(ConfigCheckTest, NvmeExampleWithoutItsFolderExitsWith2) {
  CheckOutput r = check(data_path("ds_zero_infinity_nvme.json"), testing::model_context());
  EXPECT_EQ(r.status, kConfigCheckInvalid);
  EXPECT_TRUE(r.out.empty());
  EXPECT_EQ(r.err, "error: " + data_path("ds_zero_infinity_nvme.json") +
                       ":31:7: zero_optimization.offload_param.nvme_path: \"/local_nvme\" does not "
                       "exist\n");
}

TEST(ConfigCheckTest, PrintsWarningsAndAutoNotesToErr) {
  CheckOutput r = check(data_path("hf_zero3_auto.json"), testing::trainer_context());
  ASSERT_EQ(r.status, kConfigCheckOk) << r.err;
  EXPECT_NE(r.err.find("note: zero_optimization.reduce_bucket_size = 1048576 (auto: hidden_size * "
                       "hidden_size)\n"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("note: optimizer.params.lr = 5e-05 (auto: --lr)\n"), std::string::npos) << r.err;
  nlohmann::json resolved = nlohmann::json::parse(r.out);
  EXPECT_EQ(resolved["train_batch_size"], 16);
  EXPECT_EQ(resolved["optimizer"]["params"]["lr"], 5e-5);
  EXPECT_EQ(resolved["zero_optimization"]["stage3_param_persistence_threshold"], 10240);

  AutoContext legacy_ctx = testing::model_context();
  legacy_ctx.micro_batch = 1;
  CheckOutput legacy = check(data_path("hf_zero3_legacy.json"), legacy_ctx);
  ASSERT_EQ(legacy.status, kConfigCheckOk) << legacy.err;
  EXPECT_NE(legacy.err.find("warning: " + data_path("hf_zero3_legacy.json") +
                            ": zero_optimization.stage3_gather_fp16_weights_on_model_save: is "
                            "deprecated"),
            std::string::npos)
      << legacy.err;
}

TEST(ConfigCheckTest, AutoConfigWithoutModelOptionsExitsWith2) {
  CheckOutput r = check(data_path("hf_zero3_auto.json"), AutoContext{});
  EXPECT_EQ(r.status, kConfigCheckInvalid);
  EXPECT_EQ(r.err.rfind("error: " + data_path("hf_zero3_auto.json") + ":", 0), 0u) << r.err;
  // Every missing option is named at once, grouped, in the order the file needs them.
  EXPECT_NE(r.err.find(": 12 keys are \"auto\" and need values from the command line or the model; "
                       "pass --precision fp32|fp16|bf16 (for fp16.enabled); --lr (for "
                       "optimizer.params.lr, scheduler.params.warmup_max_lr); --betas"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("; --hidden (or --model) (for zero_optimization.reduce_bucket_size, "
                       "zero_optimization.stage3_prefetch_bucket_size, "
                       "zero_optimization.stage3_param_persistence_threshold); --clip (for "
                       "gradient_clipping); --micro-batch (for train_micro_batch_size_per_gpu)\n"),
            std::string::npos)
      << r.err;
}

TEST(ConfigCheckTest, ErrorsExitWith2) {
  TempDir dir;
  struct Bad {
    const char* text;
    const char* message;
  };
  for (const Bad& b : {
           Bad{"{\"train_batch_size\": 1, \"zero_optimization\": {\"stage\": 3, \"stage3_max_live_parameter\": 1}}",
               ":1:59: zero_optimization.stage3_max_live_parameter: unknown key; did you mean "
               "'stage3_max_live_parameters'?"},
           Bad{"{\"train_batch_size\": 1,\n \"fp16\": {\"enabled\": \"true\"}}",
               ":2:11: fp16.enabled: expected a boolean (true/false), got the string \"true\""},
           Bad{"{\"train_batch_size\": 7, \"gradient_accumulation_steps\": 2}",
               ":1:2: train_batch_size: 7 is not a multiple of gradient_accumulation_steps 2 * world size 1"},
           Bad{"{\"train_batch_size\": 1 \"x\": 2}", ":1:24: syntax error while parsing object"},
       }) {
    std::string path = dir.write("bad.json", b.text);
    CheckOutput r = check(path, AutoContext{});
    EXPECT_EQ(r.status, kConfigCheckInvalid) << b.text;
    EXPECT_TRUE(r.out.empty());
    EXPECT_EQ(r.err.rfind("error: " + path + b.message, 0), 0u) << r.err;
  }
  CheckOutput missing = check(dir.path() + "/absent.json", AutoContext{});
  EXPECT_EQ(missing.status, kConfigCheckInvalid);
  EXPECT_NE(missing.err.find("cannot open: No such file or directory"), std::string::npos);
}

}  // namespace
}  // namespace zinf::config
