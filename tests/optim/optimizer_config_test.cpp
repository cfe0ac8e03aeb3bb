// The optimizer block: reference names and defaults, and errors that name the key.
#include <gtest/gtest.h>

#include <string>

#include "zinf/optim/optimizer.h"

namespace zinf::optim {
namespace {

std::string error_of(std::string_view type, const ParamMap& params) {
  Result<OptimizerConfig> c = OptimizerConfig::parse(type, params);
  return c.is_ok() ? "" : c.status().message();
}

TEST(OptimizerConfig, AdamDefaultsAreTheReferences) {
  Result<OptimizerConfig> c = OptimizerConfig::parse("Adam", {});
  ASSERT_TRUE(c.is_ok());
  ASSERT_EQ(c->kind(), OptimizerKind::kAdam);
  const AdamParams& hp = std::get<AdamParams>(c->params);
  EXPECT_EQ(hp.lr, 1e-3);
  EXPECT_EQ(hp.beta1, 0.9);
  EXPECT_EQ(hp.beta2, 0.999);
  EXPECT_EQ(hp.eps, 1e-8);
  EXPECT_EQ(hp.weight_decay, 0.0);
  EXPECT_TRUE(hp.bias_correction);
  EXPECT_TRUE(hp.adam_w_mode);  // "Adam" means AdamW unless adam_w_mode is false
  EXPECT_EQ(c->name(), "AdamW");
}

TEST(OptimizerConfig, AdamParamsAndL2Mode) {
  Result<OptimizerConfig> c = OptimizerConfig::parse(
      "adam", {{"lr", 3e-4}, {"betas", std::vector<double>{0.8, 0.95}}, {"eps", 1e-6}, {"weight_decay", 0.01},
               {"adam_w_mode", false}, {"bias_correction", false}, {"amsgrad", false}, {"torch_adam", false}});
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  const AdamParams& hp = std::get<AdamParams>(c->params);
  EXPECT_EQ(hp.lr, 3e-4);
  EXPECT_EQ(hp.beta1, 0.8);
  EXPECT_EQ(hp.beta2, 0.95);
  EXPECT_EQ(hp.eps, 1e-6);
  EXPECT_EQ(hp.weight_decay, 0.01);
  EXPECT_FALSE(hp.adam_w_mode);
  EXPECT_FALSE(hp.bias_correction);
  EXPECT_EQ(c->name(), "Adam");
  EXPECT_EQ(c->lr(), 3e-4);
}

TEST(OptimizerConfig, AdamWIsAlwaysDecoupled) {
  Result<OptimizerConfig> c = OptimizerConfig::parse("AdamW", {{"adam_w_mode", false}});
  ASSERT_TRUE(c.is_ok());
  EXPECT_TRUE(std::get<AdamParams>(c->params).adam_w_mode);
}

TEST(OptimizerConfig, AdagradAndLionDefaults) {
  Result<OptimizerConfig> a = OptimizerConfig::parse("Adagrad", {});
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(std::get<AdagradParams>(a->params).lr, 1e-2);
  EXPECT_EQ(std::get<AdagradParams>(a->params).eps, 1e-10);
  Result<OptimizerConfig> l = OptimizerConfig::parse("Lion", {{"betas", std::vector<double>{0.9, 0.99}}});
  ASSERT_TRUE(l.is_ok());
  EXPECT_EQ(std::get<LionParams>(l->params).lr, 1e-3);
  EXPECT_EQ(std::get<LionParams>(l->params).beta2, 0.99);
}

TEST(OptimizerConfig, RejectsWithTheKeyNamed) {
  EXPECT_EQ(error_of("Adam", {{"amsgrad", true}}), "optimizer.params.amsgrad: amsgrad is not supported");
  EXPECT_EQ(error_of("Adagrad", {{"amsgrad", true}}), "optimizer.params.amsgrad: amsgrad is not supported");
  const std::string unknown = error_of("Adam", {{"momentum", 0.9}});
  EXPECT_NE(unknown.find("optimizer.params.momentum: unknown parameter for Adam"), std::string::npos) << unknown;
  EXPECT_NE(error_of("Lion", {{"eps", 1e-8}}).find("optimizer.params.eps"), std::string::npos);  // Lion has no eps
  EXPECT_NE(error_of("Adam", {{"betas", std::vector<double>{0.9}}}).find("optimizer.params.betas"), std::string::npos);
  EXPECT_NE(error_of("Adam", {{"betas", std::vector<double>{0.9, 1.0}}}).find("optimizer.params.betas"),
            std::string::npos);
  EXPECT_NE(error_of("Adam", {{"lr", -1.0}}).find("optimizer.params.lr"), std::string::npos);
  EXPECT_NE(error_of("Adam", {{"lr", true}}).find("expected a number"), std::string::npos);
  EXPECT_NE(error_of("Adam", {{"fp32_optimizer_states", false}}).find("fp32_optimizer_states"), std::string::npos);
  EXPECT_NE(error_of("OneBitAdam", {}).find("optimizer.type"), std::string::npos);
}

}  // namespace
}  // namespace zinf::optim
