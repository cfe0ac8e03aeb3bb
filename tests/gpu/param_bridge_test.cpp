// The GPU models' bookkeeping on the host (no device): the ledger driven by the CPU GptModel's and
// LlamaModel's real protocol calls (the same sequences GptGpu and LlamaGpu make, which their GPU
// tests check), and its checks of a broken protocol.
#include "gpu/param_bridge.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "model_test_util.h"
#include "zinf/model/gpt.h"
#include "zinf/model/llama.h"
#include "zinf/model/local_params.h"

namespace zinf::gpu {
namespace {

using model::Phase;

model::GptConfig tiny(bool checkpointing) {
  model::GptConfig c;
  c.vocab_size = 50;
  c.max_seq = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.activation_checkpointing = checkpointing;
  return c;
}

// Forwards to LocalParams and drives the ledger beside it, recording what the bridge would move.
class LedgerAccess final : public model::ParamAccess {
 public:
  LedgerAccess(model::LocalParams* inner, BridgeLedger* ledger) : inner_(inner), ledger_(ledger) {}
  Status acquire(int m, Phase ph, std::span<const float*> v) override {
    ZINF_RETURN_IF_ERROR(ledger_->acquire(m));
    return inner_->acquire(m, ph, v);
  }
  Status release(int m, Phase ph) override {
    ZINF_RETURN_IF_ERROR(ledger_->release(m));
    return inner_->release(m, ph);
  }
  Status grad_buffers(int m, std::span<float*> g) override {
    ZINF_ASSIGN_OR_RETURN(const std::vector<int> fresh, ledger_->open_grads(m));
    for (const int p : fresh) zeroed[p].push_back(m);
    return inner_->grad_buffers(m, g);
  }
  Status grads_ready(int m) override {
    ZINF_ASSIGN_OR_RETURN(const std::vector<int> done, ledger_->close_grads(m));
    for (const int p : done) downloaded[p].push_back(m);
    return inner_->grads_ready(m);
  }
  std::map<int, std::vector<int>> zeroed, downloaded;  // parameter -> the modules where it happened

 private:
  model::LocalParams* inner_;
  BridgeLedger* ledger_;
};

TEST(PackLayout, AlignsEveryView) {
  const std::vector<std::size_t> numels = {1, 128, 129, 0, 3};
  const PackedLayout l = pack_layout(numels, 2, 256);
  EXPECT_EQ(l.offsets, (std::vector<std::size_t>{0, 256, 512, 1024, 1024}));
  EXPECT_EQ(l.bytes, 1280u);
  const PackedLayout f = pack_layout(numels, 4, 512);
  EXPECT_EQ(f.offsets, (std::vector<std::size_t>{0, 512, 1024, 2048, 2048}));
  EXPECT_EQ(f.bytes, 2560u);
}

TEST(BridgeLedger, FollowsTheGptProtocol) {
  for (bool checkpointing : {false, true}) {
    SCOPED_TRACE(checkpointing ? "activation checkpointing" : "no checkpointing");
    const model::GptConfig c = tiny(checkpointing);
    model::GptModel gpt = model::testing::make_gpt(c);
    model::LocalParams lp = model::testing::must(model::LocalParams::create(gpt.params(), gpt.modules()));
    BridgeLedger ledger = model::testing::must(BridgeLedger::create(gpt.params(), gpt.modules()));
    const std::vector<int32_t> in = model::testing::random_tokens(1, 2 * 8, c.vocab_size);
    const std::vector<int32_t> tg = model::testing::random_tokens(2, 2 * 8, c.vocab_size);
    for (int pass = 0; pass < 2; ++pass) {
      ledger.begin_pass();
      LedgerAccess access(&lp, &ledger);
      ASSERT_TRUE(gpt.forward_backward(in, tg, 2, 8, access, 1.0f).is_ok());
      ASSERT_TRUE(ledger.check_pass_end().is_ok()) << ledger.check_pass_end().to_string();
      const int wte = 0, lm_head = model::module_lm_head(c.n_layer), wte_wpe = model::module_wte_wpe();
      ASSERT_EQ(gpt.params()[wte].name, "wte.weight");
      // The tied wte: one zeroed buffer from lm_head (first in backward), downloaded once, at its owner.
      EXPECT_EQ(access.zeroed[wte], std::vector<int>{lm_head});
      EXPECT_EQ(access.downloaded[wte], std::vector<int>{wte_wpe});
      // Every parameter: zeroed once and downloaded once, at its owner.
      for (const model::ParamSpec& s : gpt.params()) {
        EXPECT_EQ(access.zeroed[s.index].size(), 1u) << s.name;
        EXPECT_EQ(access.downloaded[s.index], std::vector<int>{s.module}) << s.name;
        EXPECT_FALSE(ledger.grad_live(s.index)) << s.name;
      }
    }
    // Evaluation: values only.
    ledger.begin_pass();
    LedgerAccess eval(&lp, &ledger);
    ASSERT_TRUE(gpt.forward_loss(in, tg, 2, 8, eval).is_ok());
    EXPECT_TRUE(ledger.check_pass_end().is_ok());
    EXPECT_TRUE(eval.zeroed.empty());
  }
}

// Llama (tied and untied head, q/k/v biases, q/k norms, with and without checkpointing): every
// parameter zeroed once and downloaded once, at its owner; a tied embed_tokens.weight crosses once,
// with the head's and the embedding's contributions, downloaded at model.embed_tokens.
TEST(BridgeLedger, FollowsTheLlamaProtocol) {
  for (const bool checkpointing : {false, true}) {
    for (const int variant : {0, 1, 2}) {
      model::LlamaConfig c = model::testing::micro_llama_config(/*tied=*/variant != 1, checkpointing);
      if (variant == 1) {  // Qwen2: q/k/v biases
        c.family = model::LlamaFamily::kQwen2;
        c.qkv_bias = true;
      } else if (variant == 2) {  // Qwen3: q/k norms, head_dim apart from hidden
        c.family = model::LlamaFamily::kQwen3;
        c.qk_norm = true;
        c.head_dim = 8;
      }
      SCOPED_TRACE(fmt::format("{}, tied {}, checkpointing {}", model::llama_family_name(c.family),
                               c.tie_word_embeddings, checkpointing));
      model::LlamaModel llama = model::testing::make_llama(c);
      model::LocalParams lp = model::testing::must(model::LocalParams::create(llama.params(), llama.modules()));
      BridgeLedger ledger = model::testing::must(BridgeLedger::create(llama.params(), llama.modules()));
      const std::vector<int32_t> in = model::testing::random_tokens(1, 2 * 8, c.vocab_size);
      const std::vector<int32_t> tg = model::testing::random_tokens(2, 2 * 8, c.vocab_size);
      ledger.begin_pass();
      LedgerAccess access(&lp, &ledger);
      ASSERT_TRUE(llama.forward_backward(in, tg, 2, 8, access, 1.0f).is_ok());
      ASSERT_TRUE(ledger.check_pass_end().is_ok()) << ledger.check_pass_end().to_string();
      const int embed = 0, head = static_cast<int>(llama.modules().size()) - 1;
      ASSERT_EQ(llama.params()[0].name, "model.embed_tokens.weight");
      ASSERT_EQ(llama.modules()[static_cast<std::size_t>(head)].name, "lm_head");
      if (c.tie_word_embeddings) {
        EXPECT_EQ(access.zeroed[0], std::vector<int>{head});  // first in backward
        EXPECT_TRUE(ledger.owned(head).empty());
      }
      EXPECT_EQ(access.downloaded[0], std::vector<int>{embed});
      for (const model::ParamSpec& s : llama.params()) {
        EXPECT_EQ(access.zeroed[s.index].size(), 1u) << s.name;
        EXPECT_EQ(access.downloaded[s.index], std::vector<int>{s.module}) << s.name;
      }
    }
  }
}

TEST(BridgeLedger, LayoutsAndStaging) {
  model::GptModel gpt = model::testing::make_gpt(tiny(false));
  BridgeLedger ledger = model::testing::must(BridgeLedger::create(gpt.params(), gpt.modules()));
  const int lm_head = model::module_lm_head(2);
  EXPECT_TRUE(ledger.owned(lm_head).empty());  // lm_head lists wte but wte_wpe owns it
  EXPECT_EQ(ledger.owned_grad_layout(lm_head).bytes, 0u);
  const std::size_t wte_numel = gpt.params()[0].numel;  // 50 x 16
  EXPECT_GE(ledger.value_layout(lm_head).bytes, wte_numel * 2);
  EXPECT_GE(ledger.owned_grad_layout(model::module_wte_wpe()).bytes, (wte_numel + 8 * 16) * 4);
  std::size_t largest = 0;
  for (std::size_t m = 0; m < gpt.modules().size(); ++m) {
    largest = std::max({largest, ledger.value_layout(static_cast<int>(m)).bytes,
                        ledger.owned_grad_layout(static_cast<int>(m)).bytes});
  }
  EXPECT_EQ(ledger.staging_bytes(), largest);
}

TEST(BridgeLedger, RefusesABrokenProtocol) {
  model::GptModel gpt = model::testing::make_gpt(tiny(false));
  BridgeLedger ledger = model::testing::must(BridgeLedger::create(gpt.params(), gpt.modules()));
  const int attn = model::module_attn(0), lm_head = model::module_lm_head(2), wte_wpe = model::module_wte_wpe();

  ledger.begin_pass();
  ASSERT_TRUE(ledger.acquire(attn).is_ok());
  Status twice = ledger.acquire(attn);
  EXPECT_FALSE(twice.is_ok());
  EXPECT_NE(twice.message().find("h.0.attn"), std::string::npos) << twice.to_string();
  EXPECT_FALSE(ledger.check_pass_end().is_ok());  // still acquired
  ASSERT_TRUE(ledger.release(attn).is_ok());
  EXPECT_FALSE(ledger.release(attn).is_ok());
  EXPECT_FALSE(ledger.acquire(-1).is_ok());
  EXPECT_FALSE(ledger.acquire(static_cast<int>(gpt.modules().size())).is_ok());
  EXPECT_FALSE(ledger.close_grads(attn).is_ok());  // grads_ready without grad_buffers
  EXPECT_TRUE(ledger.check_pass_end().is_ok());

  // wte listed again after its owner was made ready: its gradient would never reach the host.
  ledger.begin_pass();
  ASSERT_TRUE(ledger.open_grads(wte_wpe).is_ok());
  ASSERT_TRUE(ledger.close_grads(wte_wpe).is_ok());
  const std::vector<int> fresh = model::testing::must(ledger.open_grads(lm_head));
  EXPECT_EQ(fresh, std::vector<int>{0});
  EXPECT_TRUE(model::testing::must(ledger.close_grads(lm_head)).empty());
  Status left = ledger.check_pass_end();
  EXPECT_FALSE(left.is_ok());
  EXPECT_NE(left.message().find("wte.weight"), std::string::npos) << left.to_string();

  // begin_pass forgets a pass that ended in an error.
  ledger.begin_pass();
  EXPECT_TRUE(ledger.check_pass_end().is_ok());
  EXPECT_FALSE(ledger.grad_live(0));
}

}  // namespace
}  // namespace zinf::gpu
