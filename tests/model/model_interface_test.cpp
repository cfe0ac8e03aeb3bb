// The Model interface: layout validation, GptModel::create, the recorded configuration and the
// built-in registry, modules of any width, and the example's user-defined model (TokenMlp),
// whose analytic gradients are checked against finite differences of its own loss.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "model_test_util.h"
#include "token_mlp.h"
#include "zinf/model/gpt.h"
#include "zinf/model/model.h"
#include "zinf/model/module_calls.h"
#include "zinf/model/registry.h"

namespace zinf::model {
namespace {

ParamSpec spec(std::string name, std::vector<int64_t> shape, int index, int module) {
  ParamSpec p;
  p.name = std::move(name);
  p.numel = 1;
  for (int64_t d : shape) p.numel *= static_cast<size_t>(d);
  p.shape = std::move(shape);
  p.index = index;
  p.module = module;
  return p;
}

struct Layout {
  std::vector<ParamSpec> params = {spec("a", {2, 3}, 0, 0), spec("b", {4}, 1, 1)};
  std::vector<ModuleSpec> modules = {{"m0", {0}, true}, {"m1", {1, 0}, true}};
};

std::string layout_error(const Layout& l) { return validate_layout(l.params, l.modules).message(); }

TEST(ModelLayoutTest, AValidLayoutPasses) {
  Layout l;
  EXPECT_TRUE(validate_layout(l.params, l.modules).is_ok());  // m1 also uses a (tied), owned by m0
}

TEST(ModelLayoutTest, EveryBrokenRuleIsNamed) {
  {
    Layout l;
    l.params[1].name = "a";
    EXPECT_NE(layout_error(l).find("parameter 1 ('a'): the name is used twice"), std::string::npos) << layout_error(l);
  }
  {
    Layout l;
    l.params[1].index = 0;
    EXPECT_NE(layout_error(l).find("has index 0, expected its position 1"), std::string::npos) << layout_error(l);
  }
  {
    Layout l;
    l.params[0].numel = 5;
    EXPECT_NE(layout_error(l).find("numel 5 is not the product of its shape"), std::string::npos) << layout_error(l);
  }
  {
    Layout l;
    l.params[0].shape = {2, 0};
    EXPECT_NE(layout_error(l).find("shape dimension 0"), std::string::npos) << layout_error(l);
  }
  {
    Layout l;
    l.params[1].module = 7;
    EXPECT_NE(layout_error(l).find("owning module 7 is not one of the 2 modules"), std::string::npos);
  }
  {
    Layout l;
    l.modules[1].params = {1, 1};
    EXPECT_NE(layout_error(l).find("module 1 ('m1') lists parameter 1 twice"), std::string::npos) << layout_error(l);
  }
  {
    Layout l;
    l.modules[0].params = {9};
    EXPECT_NE(layout_error(l).find("lists parameter 9, not one of the 2"), std::string::npos) << layout_error(l);
  }
  {
    Layout l;
    l.modules[0].params = {};  // a is owned by m0 but only m1 lists it
    EXPECT_NE(layout_error(l).find("parameter 0 ('a') names module 0 as its owner, which does not list it"),
              std::string::npos)
        << layout_error(l);
  }
  {
    Layout l;
    l.params.clear();
    l.modules.clear();
    EXPECT_NE(layout_error(l).find("no parameters"), std::string::npos);
  }
}

TEST(GptModelTest, CreateRejectsAnInvalidConfigurationByName) {
  GptConfig c = testing::micro_config();
  c.n_head = 3;  // 16 is not divisible by 3
  auto m = GptModel::create(c);
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("n_embd (16) must be divisible by n_head (3)"), std::string::npos);
  c = testing::micro_config();
  c.vocab_size = 0;
  EXPECT_NE(GptModel::create(c).status().message().find("vocab_size (0)"), std::string::npos);
}

TEST(GptModelTest, LayoutFollowsTheContractAndDescribesItself) {
  GptModel m = testing::make_gpt(testing::micro_config(true));
  EXPECT_TRUE(validate_layout(m).is_ok());
  EXPECT_EQ(m.type(), "gpt");
  EXPECT_EQ(m.describe(), "gpt: 2 layers, hidden 16, 2 heads, seq 12, vocab 48, activation checkpointing");
  EXPECT_EQ(m.vocab_size(), 48);
  EXPECT_EQ(m.max_seq(), 12);
  EXPECT_EQ(m.num_params(), gpt_num_params(m.config()));
}

TEST(GptModelTest, ConfigJsonRoundTripsAndLeavesRunTimeChoicesOut) {
  GptConfig c = testing::micro_config(/*checkpointing=*/true);
  const std::string text = gpt_config_json(c);
  EXPECT_EQ(text, R"({"max_seq":12,"n_embd":16,"n_head":2,"n_layer":2,"type":"gpt","vocab_size":48})");
  auto back = gpt_config_from_json(text, "test");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  c.activation_checkpointing = false;
  EXPECT_EQ(back.value(), c);
  // Checkpoints from before the Model interface have no "type".
  EXPECT_TRUE(gpt_config_from_json(R"({"max_seq":12,"n_embd":16,"n_head":2,"n_layer":2,"vocab_size":48})", "old")
                  .is_ok());
}

TEST(GptModelTest, ConfigJsonErrorsNameTheKey) {
  auto msg = [](const char* text) { return gpt_config_from_json(text, "engine.json").status().message(); };
  EXPECT_NE(msg(R"({"max_seq":12,"n_embd":16,"n_head":2,"vocab_size":48})").find("\"n_layer\" must be an integer, found nothing"),
            std::string::npos);
  EXPECT_NE(msg(R"({"max_seq":12,"n_embd":16,"n_head":2,"n_layer":"2","vocab_size":48})").find("found \"2\""),
            std::string::npos);
  EXPECT_NE(msg(R"({"max_seq":12,"n_embd":16,"n_head":2,"n_layer":4294967298,"vocab_size":48})").find("n_layer"),
            std::string::npos);
  EXPECT_NE(msg(R"({"type":"llama"})").find("model type \"llama\" is not \"gpt\""), std::string::npos);
  EXPECT_NE(msg("[1, 2").find("engine.json: the model configuration is not a JSON object"), std::string::npos);
  EXPECT_NE(msg(R"({"max_seq":12,"n_embd":16,"n_head":3,"n_layer":2,"vocab_size":48})").find("engine.json"),
            std::string::npos);
}

TEST(RegistryTest, BuildsAGptFromItsRecordedConfigAndNamesUnknownTypes) {
  GptModel gpt = testing::make_gpt(testing::micro_config());
  auto made = make_builtin_model(gpt.config_json(), "ckpt/engine.json");
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  EXPECT_EQ((*made)->config_json(), gpt.config_json());
  ASSERT_EQ((*made)->params().size(), gpt.params().size());
  for (size_t i = 0; i < gpt.params().size(); ++i) EXPECT_EQ((*made)->params()[i].shape, gpt.params()[i].shape);
  auto unknown = make_builtin_model(R"({"type":"token_mlp","vocab":256})", "ckpt/engine.json");
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_EQ(unknown.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(unknown.status().message().find("ckpt/engine.json: model type \"token_mlp\" is not one zinf builds (built-in: gpt, llama)"),
            std::string::npos)
      << unknown.status().message();
}

// Records what the model asks for; every parameter k of a module gets a distinct buffer.
class WideAccess final : public ParamAccess {
 public:
  explicit WideAccess(size_t n) : values_(n), grads_(n) {
    for (size_t k = 0; k < n; ++k) values_[k] = static_cast<float>(k);
  }
  Status acquire(int, Phase, std::span<const float*> v) override {
    for (size_t k = 0; k < v.size(); ++k) v[k] = &values_[k];
    log += "a";
    return Status::ok();
  }
  Status release(int, Phase) override {
    log += "r";
    return Status::ok();
  }
  Status grad_buffers(int, std::span<float*> g) override {
    for (size_t k = 0; k < g.size(); ++k) g[k] = &grads_[k];
    log += "g";
    return Status::ok();
  }
  Status grads_ready(int) override {
    log += "d";
    return Status::ok();
  }
  std::vector<float> values_, grads_;
  std::string log;
};

TEST(ModuleCallsTest, ModulesOfAnyWidthGetEveryPointer) {
  for (size_t n : {1u, 4u, 8u, 9u, 40u}) {
    ModuleSpec wide{"wide", {}, true};
    for (size_t k = 0; k < n; ++k) wide.params.push_back(static_cast<int>(k));
    const std::vector<ModuleSpec> modules = {wide};
    WideAccess access(n);
    float sum = 0;
    ASSERT_TRUE(run_module_forward(access, modules, 0, Phase::kForward, [&](const float* const* v) {
                  for (size_t k = 0; k < n; ++k) sum += *v[k];
                }).is_ok());
    EXPECT_EQ(sum, static_cast<float>(n * (n - 1) / 2));
    ASSERT_TRUE(run_module_backward(access, modules, 0, [&](const float* const* v, float* const* g) {
                  for (size_t k = 0; k < n; ++k) *g[k] = *v[k] + 1;
                }).is_ok());
    for (size_t k = 0; k < n; ++k) EXPECT_EQ(access.grads_[k], static_cast<float>(k + 1));
    EXPECT_EQ(access.log, "aragrd");
  }
}

// The example's user-defined model: analytic gradients against central differences of its loss.
TEST(TokenMlpTest, GradientsMatchFiniteDifferences) {
  example::TokenMlpConfig c{.vocab = 11, .embed = 5, .hidden = 7, .layers = 2, .max_seq = 8};
  auto made = example::TokenMlp::create(c);
  ASSERT_TRUE(made.is_ok());
  example::TokenMlp& m = **made;
  ASSERT_TRUE(validate_layout(m).is_ok()) << validate_layout(m).to_string();
  auto lp = LocalParams::create(m.params(), m.modules());
  ASSERT_TRUE(lp.is_ok());
  lp->init(3);
  for (float& b : lp->flat_params()) b += 0.05f;  // biases off zero: every ReLU path sees a gradient
  const int B = 2, T = 4;
  const std::vector<int32_t> in = testing::random_tokens(1, B * T, c.vocab), tg = testing::random_tokens(2, B * T, c.vocab);
  auto loss = m.forward_backward(in, tg, B, T, *lp, 1.0f);
  ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
  const std::vector<float> analytic(lp->flat_grads().begin(), lp->flat_grads().end());
  std::span<float> p = lp->flat_params();
  int checked = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const float keep = p[i], h = 1e-2f;
    p[i] = keep + h;
    const double up = m.forward_loss(in, tg, B, T, *lp).value();
    p[i] = keep - h;
    const double down = m.forward_loss(in, tg, B, T, *lp).value();
    p[i] = keep;
    const double numeric = (up - down) / (2.0 * h);
    EXPECT_NEAR(analytic[i], numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << "element " << i;
    ++checked;
  }
  EXPECT_EQ(checked, 241);  // 11x5 + 7x5 + 7 + 7x7 + 7 + 11x7 + 11
  // The same pass with a loss scale adds scale x the gradient.
  lp->zero_grads();
  ASSERT_TRUE(m.forward_backward(in, tg, B, T, *lp, 4.0f).is_ok());
  for (size_t i = 0; i < analytic.size(); ++i) EXPECT_NEAR(lp->flat_grads()[i], 4.0f * analytic[i], 1e-5f);
  // Bad batches are errors naming the value.
  const std::vector<int32_t> bad(static_cast<size_t>(B * T), c.vocab);
  EXPECT_NE(m.forward_loss(bad, tg, B, T, *lp).status().message().find("inputs[0] = 11 is outside [0, 11)"),
            std::string::npos);
}

}  // namespace
}  // namespace zinf::model
