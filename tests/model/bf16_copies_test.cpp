// The bf16 copies the bf16 products read: the producers' (attention, SwiGLU, the norms' backward)
// against the scalar rounding of the fp32 values they wrote, bit for bit; the models' per-pass
// weight copies (Bf16Weights); and whole GPT / Llama passes with bf16 products in which the
// backend checks every copy it is handed.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "model/attention_core.h"
#include "model/bf16.h"
#include "model/bf16_matmul.h"
#include "model/bf16_weights.h"
#include "model/fused_kernels.h"
#include "model/kernels.h"
#include "model/llama_kernels.h"
#include "model_test_util.h"

namespace zinf::model {
namespace {

// The scalar reference: bits of fp32 -> bf16, round to nearest even, NaN kept quiet (written out
// here rather than calling detail::to_bf16, so a change there shows).
uint16_t reference_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}

std::vector<float> normal_values(uint64_t seed, size_t n, double scale = 1.0) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = static_cast<float>(scale * testing::test_normal(seed, i));
  return v;
}

// copy[i] == reference_bf16(values[i]) for every i.
void expect_copy_of(const char* what, const float* values, const uint16_t* copy, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    if (copy[i] != reference_bf16(values[i]) && bad++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: copy " << copy[i] << ", rounding of " << values[i] << " is "
                    << reference_bf16(values[i]);
    }
  }
  EXPECT_EQ(bad, 0u) << what;
}

// A buffer's bits, for "the copy does not change the fp32 output".
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

TEST(Bf16CopiesTest, RoundBlockMatchesTheScalarRoundingAndKeepsToItsColumns) {
  const int rows = 7, cols = 37;
  const size_t ld = 41;
  std::vector<float> src = normal_values(1, rows * ld, 3.0);
  // Ties (even and odd lsb), infinities, NaN, signed zero, subnormals, the largest finite.
  const float specials[] = {std::bit_cast<float>(0x3f808000u), std::bit_cast<float>(0x3f818000u),
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), std::bit_cast<float>(0x7f800001u), -0.0f,
                            std::numeric_limits<float>::denorm_min(), std::bit_cast<float>(0x0000ffffu),
                            std::numeric_limits<float>::max(), std::bit_cast<float>(0x7f7f8000u)};
  for (size_t i = 0; i < std::size(specials); i++) src[3 * i] = specials[i];
  std::vector<uint16_t> dst(rows * ld, 0xabcd);
  kernels::round_block_to_bf16(dst.data(), src.data(), rows, cols, ld);
  for (int r = 0; r < rows; r++) {
    expect_copy_of("round_block_to_bf16", src.data() + r * ld, dst.data() + r * ld, cols);
    for (size_t c = cols; c < ld; c++) EXPECT_EQ(dst[r * ld + c], 0xabcd) << "wrote outside its columns";
  }
  std::vector<uint16_t> whole(rows * ld);
  kernels::round_to_bf16(whole.data(), src.data(), rows, static_cast<int>(ld));
  expect_copy_of("round_to_bf16", src.data(), whole.data(), whole.size());
}

TEST(Bf16CopiesTest, AttentionWritesTheCopyOfItsOutputAndGradient) {
  // T = 100: a partial last query block; hs 16 and 64 (a block of 64 rows).
  for (const auto& [B, T, C, NH] : {std::array{2, 100, 64, 4}, std::array{1, 70, 128, 2}}) {
    const size_t BT = static_cast<size_t>(B) * T;
    const std::vector<float> qkv = normal_values(2, BT * 3 * C), dout = normal_values(3, BT * C);
    std::vector<float> scratch(kernels::attention_scratch_floats());
    std::vector<float> out(BT * C), lse(static_cast<size_t>(B) * NH * T), out2(out.size()), lse2(lse.size());
    std::vector<uint16_t> out_bf16(BT * C, 0);
    kernels::attention_forward(out.data(), lse.data(), qkv.data(), scratch.data(), B, T, C, NH);
    kernels::attention_forward(out2.data(), lse2.data(), qkv.data(), scratch.data(), B, T, C, NH, out_bf16.data());
    EXPECT_TRUE(same_bits(out, out2));
    EXPECT_TRUE(same_bits(lse, lse2));
    expect_copy_of("attention out", out2.data(), out_bf16.data(), out2.size());

    std::vector<float> dqkv(BT * 3 * C), dqkv2(dqkv.size());
    std::vector<uint16_t> dqkv_bf16(dqkv.size(), 0);
    kernels::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), scratch.data(), B, T,
                                C, NH);
    kernels::attention_backward(dqkv2.data(), dout.data(), qkv.data(), out.data(), lse.data(), scratch.data(), B, T,
                                C, NH, dqkv_bf16.data());
    EXPECT_TRUE(same_bits(dqkv, dqkv2));
    expect_copy_of("attention dqkv", dqkv2.data(), dqkv_bf16.data(), dqkv2.size());
  }
}

TEST(Bf16CopiesTest, GroupedQueryAttentionAndRopeWriteTheirCopies) {
  const kernels::GqaShape s{2, 90, 4, 2, 32};
  const size_t BT = static_cast<size_t>(s.B) * s.T, Q = static_cast<size_t>(s.NH) * s.hs,
               KV = static_cast<size_t>(s.NKV) * s.hs;
  const std::vector<float> q = normal_values(4, BT * Q), k = normal_values(5, BT * KV), v = normal_values(6, BT * KV);
  std::vector<float> scratch(kernels::gqa_attention_scratch_floats());
  std::vector<float> out(BT * Q), out2(out.size()), lse(static_cast<size_t>(s.B) * s.NH * s.T), lse2(lse.size());
  std::vector<uint16_t> out_bf16(out.size(), 0);
  kernels::gqa_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), scratch.data(), s);
  kernels::gqa_attention_forward(out2.data(), lse2.data(), q.data(), k.data(), v.data(), scratch.data(), s,
                                 out_bf16.data());
  EXPECT_TRUE(same_bits(out, out2));
  expect_copy_of("gqa out", out2.data(), out_bf16.data(), out2.size());

  const std::vector<float> dout = normal_values(25, BT * Q);
  std::vector<float> dq(BT * Q), dk(BT * KV), dv(BT * KV), dq2(dq.size()), dk2(dk.size()), dv2(dv.size());
  std::vector<uint16_t> dv_bf16(dv.size(), 0);
  kernels::gqa_attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                                  out.data(), lse.data(), scratch.data(), s);
  kernels::gqa_attention_backward(dq2.data(), dk2.data(), dv2.data(), dout.data(), q.data(), k.data(), v.data(),
                                  out.data(), lse.data(), scratch.data(), s, dv_bf16.data());
  EXPECT_TRUE(same_bits(dq, dq2) && same_bits(dk, dk2) && same_bits(dv, dv2));
  expect_copy_of("gqa dv", dv2.data(), dv_bf16.data(), dv2.size());

  std::vector<float> cos(static_cast<size_t>(s.T) * s.hs / 2), sin(cos.size());
  kernels::rope_tables(cos.data(), sin.data(), s.T, s.hs, 100.0);
  std::vector<uint16_t> dq_bf16(dq.size(), 0);
  kernels::rope_backward(dq.data(), cos.data(), sin.data(), s.B, s.T, s.NH, s.hs);
  kernels::rope_backward(dq2.data(), cos.data(), sin.data(), s.B, s.T, s.NH, s.hs, dq_bf16.data());
  EXPECT_TRUE(same_bits(dq, dq2));
  expect_copy_of("rope dq", dq2.data(), dq_bf16.data(), dq2.size());
}

TEST(Bf16CopiesTest, SwigluWritesTheCopyOfItsOutput) {
  const size_t n = 3 * 8192 + 77;  // several chunks and a partial one
  const std::vector<float> gate = normal_values(7, n, 2.0), up = normal_values(8, n);
  std::vector<float> out(n), out2(n);
  std::vector<uint16_t> copy(n, 0);
  kernels::swiglu_forward(out.data(), gate.data(), up.data(), n);
  kernels::swiglu_forward(out2.data(), gate.data(), up.data(), n, copy.data());
  EXPECT_TRUE(same_bits(out, out2));
  expect_copy_of("swiglu out", out2.data(), copy.data(), n);
}

TEST(Bf16CopiesTest, NormBackwardsWriteTheCopyOfTheFinishedInputGradient) {
  const int N = 75, C = 48;  // 75 rows: a partial chunk of summed_rmsnorm_backward's 32
  const size_t NC = static_cast<size_t>(N) * C;
  const std::vector<float> dout = normal_values(9, NC), dout1 = normal_values(10, NC), inp = normal_values(11, NC);
  const std::vector<float> weight = normal_values(12, C), bias = normal_values(13, C);
  const std::vector<float> dinp0 = normal_values(14, NC);  // += into an earlier gradient
  std::vector<float> mean(N), rstd(N);
  for (int n = 0; n < N; n++) {
    mean[n] = 0.1f * static_cast<float>(testing::test_normal(15, n));
    rstd[n] = 1.0f + 0.2f * std::fabs(static_cast<float>(testing::test_normal(16, n)));
  }
  std::vector<uint16_t> copy(NC);
  auto check = [&](const char* what, auto run) {
    std::vector<float> a = dinp0, b = dinp0, dw(C), db(C), dw2(C), db2(C);
    std::fill(copy.begin(), copy.end(), uint16_t{0});
    run(a.data(), dw.data(), db.data(), nullptr);
    run(b.data(), dw2.data(), db2.data(), copy.data());
    EXPECT_TRUE(same_bits(a, b)) << what;
    EXPECT_TRUE(same_bits(dw, dw2)) << what;
    expect_copy_of(what, b.data(), copy.data(), NC);
  };
  check("layernorm_backward", [&](float* dinp, float* dw, float* db, uint16_t* c) {
    kernels::layernorm_backward(dinp, dw, db, dout.data(), inp.data(), weight.data(), mean.data(), rstd.data(), N, C,
                                c);
  });
  check("rmsnorm_backward", [&](float* dinp, float* dw, float*, uint16_t* c) {
    kernels::rmsnorm_backward(dinp, dw, dout.data(), inp.data(), weight.data(), rstd.data(), N, C, c);
  });
  check("summed_rmsnorm_backward", [&](float* dinp, float* dw, float*, uint16_t* c) {
    kernels::summed_rmsnorm_backward(dinp, dw, dout.data(), dout1.data(), nullptr, inp.data(), weight.data(),
                                     rstd.data(), N, C, c);
  });
}

TEST(Bf16CopiesTest, WeightCopiesAreRoundedOncePerPassAndDroppedBetweenPasses) {
  std::vector<ParamSpec> params(3);
  for (int i = 0; i < 3; i++) {
    params[i].index = i;
    params[i].numel = 6 * 10;
  }
  std::vector<float> w = normal_values(17, 60);
  detail::Bf16Weights off;
  off.configure(params, false);
  EXPECT_EQ(off.get(1, w.data(), 6, 10).bf16, nullptr);

  detail::Bf16Weights cache;
  cache.configure(params, true);
  cache.begin_pass();
  const MatmulInput first = cache.get(1, w.data(), 6, 10);
  ASSERT_NE(first.bf16, nullptr);
  EXPECT_EQ(first.f32, w.data());
  expect_copy_of("weight copy", w.data(), first.bf16, w.size());
  // A second gather of the same parameter in the pass (another pointer, the same values): no
  // second rounding, the same copy.
  const std::vector<float> regathered = w;
  const MatmulInput again = cache.get(1, regathered.data(), 6, 10);
  EXPECT_EQ(again.bf16, first.bf16);
  EXPECT_EQ(again.f32, regathered.data());
  EXPECT_EQ(cache.roundings(), 1u);
  // The next pass sees new values (an optimizer step in between).
  for (float& x : w) x = x * 1.5f + 0.25f;
  cache.begin_pass();
  const MatmulInput next = cache.get(1, w.data(), 6, 10);
  EXPECT_EQ(cache.roundings(), 2u);
  expect_copy_of("weight copy after begin_pass", w.data(), next.bf16, w.size());
  EXPECT_EQ(detail::Bf16Weights::bytes_for(params, std::vector<int>{0, 2}), 2 * 60 * sizeof(uint16_t));
}

// Under limit_bytes only the copies that fit are kept; the others come without a copy (their
// product rounds them), every pass, and nothing more is allocated.
TEST(Bf16CopiesTest, WeightCopiesStayWithinTheirLimit) {
  std::vector<ParamSpec> params(3);
  for (int i = 0; i < 3; i++) {
    params[i].index = i;
    params[i].numel = 6 * 10;
  }
  const std::vector<float> w = normal_values(18, 60);
  detail::Bf16Weights cache;
  cache.configure(params, true);
  cache.limit_bytes(60 * sizeof(uint16_t) + 1);  // room for one copy
  for (int pass = 0; pass < 2; ++pass) {
    cache.begin_pass();
    const MatmulInput kept = cache.get(2, w.data(), 6, 10);
    ASSERT_NE(kept.bf16, nullptr) << "pass " << pass;
    expect_copy_of("the copy within the limit", w.data(), kept.bf16, w.size());
    for (int p : {0, 1}) {
      const MatmulInput over = cache.get(p, w.data(), 6, 10);
      EXPECT_EQ(over.bf16, nullptr) << "parameter " << p << " is past the limit";
      EXPECT_EQ(over.f32, w.data());
    }
  }
  EXPECT_EQ(cache.roundings(), 2u) << "the kept copy, once a pass";
  detail::Bf16Weights none;
  none.configure(params, true);
  none.limit_bytes(0);
  none.begin_pass();
  EXPECT_EQ(none.get(0, w.data(), 6, 10).bf16, nullptr);
}

// Runs `pass` with the backend checking every copy it is handed; skips without bf16 products.
template <typename Pass>
void with_checked_copies(Pass pass) {
  const MatmulSupport s = matmul_support();
  if (!s.dnnl_built || !s.bf16_units) GTEST_SKIP() << "no bf16 products here (" << s.isa << ")";
  detail::set_check_bf16_copies(true);
  const uint64_t before = detail::bf16_copy_mismatches();
  pass();
  detail::set_check_bf16_copies(false);
  EXPECT_EQ(detail::bf16_copy_mismatches() - before, 0u) << "a product read a bf16 copy that is not the rounding "
                                                            "of the fp32 values beside it";
}

// Two steps' worth of passes on parameters P1, then P2 (the second set as after an optimizer
// step): loss and gradients with P2 must be those of a fresh model that saw only P2, bit for bit
// (a weight copy kept from P1 would change them), and every copy is the rounding of its values.
template <typename Model>
void expect_copies_right_across_steps(Model& used, Model& fresh, int B, int T, int vocab) {
  Result<LocalParams> lp = LocalParams::create(used.params(), used.modules());
  ASSERT_TRUE(lp.is_ok());
  const std::vector<int32_t> in = testing::random_tokens(21, static_cast<size_t>(B) * T, vocab);
  const std::vector<int32_t> tgt = testing::random_tokens(22, static_cast<size_t>(B) * T, vocab);
  with_checked_copies([&] {
    testing::randomize(*lp, used.params(), 23);
    lp->zero_grads();
    ASSERT_TRUE(used.forward_backward(in, tgt, B, T, *lp, 1.0f).is_ok());
    ASSERT_TRUE(used.forward_loss(in, tgt, B, T, *lp).is_ok());
    testing::randomize(*lp, used.params(), 24);
    lp->zero_grads();
    const float loss_used = testing::must(used.forward_backward(in, tgt, B, T, *lp, 1.0f));
    const std::vector<float> g_used(lp->flat_grads().begin(), lp->flat_grads().end());
    const float eval_used = testing::must(used.forward_loss(in, tgt, B, T, *lp));
    lp->zero_grads();
    const float loss_fresh = testing::must(fresh.forward_backward(in, tgt, B, T, *lp, 1.0f));
    EXPECT_EQ(std::bit_cast<uint32_t>(loss_used), std::bit_cast<uint32_t>(loss_fresh));
    EXPECT_EQ(std::bit_cast<uint32_t>(eval_used), std::bit_cast<uint32_t>(loss_fresh));
    EXPECT_EQ(std::memcmp(g_used.data(), lp->flat_grads().data(), g_used.size() * sizeof(float)), 0);
  });
}

TEST(Bf16CopiesTest, GptPassesReadRightCopiesAcrossStepsWithAndWithoutCheckpointing) {
  for (bool ckpt : {false, true}) {
    SCOPED_TRACE(ckpt ? "activation checkpointing" : "no checkpointing");
    GptConfig c = testing::micro_config(ckpt);
    c.n_layer = 3;
    GptModel used = testing::make_gpt(c), fresh = testing::make_gpt(c);
    if (!used.use_matmul(MatmulKind::kBf16).is_ok() || !fresh.use_matmul(MatmulKind::kBf16).is_ok()) {
      GTEST_SKIP() << "no bf16 products here";
    }
    expect_copies_right_across_steps(used, fresh, 3, 10, c.vocab_size);
  }
}

// A model whose weight copies are limited (the host-memory budget's knob) computes the same bits:
// the products round the weights without copies themselves. Its activation_bytes() counts only
// the copies it may keep.
TEST(Bf16CopiesTest, LimitedWeightCopiesGiveTheSameBits) {
  for (bool ckpt : {false, true}) {
    SCOPED_TRACE(ckpt ? "activation checkpointing" : "no checkpointing");
    GptConfig c = testing::micro_config(ckpt);
    c.n_layer = 3;
    GptModel all = testing::make_gpt(c), limited = testing::make_gpt(c), none = testing::make_gpt(c);
    for (GptModel* m : {&all, &limited, &none}) {
      if (!m->use_matmul(MatmulKind::kBf16).is_ok()) GTEST_SKIP() << "no bf16 products here";
    }
    const uint64_t copies = all.weight_copy_bytes();
    ASSERT_GT(copies, 0u);
    limited.limit_weight_copies(copies / 2);
    none.limit_weight_copies(0);
    EXPECT_EQ(limited.weight_copy_bytes(), copies / 2);
    EXPECT_EQ(none.weight_copy_bytes(), 0u);
    EXPECT_EQ(all.activation_bytes(3, 10) - none.activation_bytes(3, 10), copies);
    Result<LocalParams> lp = LocalParams::create(all.params(), all.modules());
    ASSERT_TRUE(lp.is_ok());
    testing::randomize(*lp, all.params(), 25);
    const std::vector<int32_t> in = testing::random_tokens(26, 30, c.vocab_size);
    const std::vector<int32_t> tgt = testing::random_tokens(27, 30, c.vocab_size);
    std::vector<std::vector<float>> grads;
    std::vector<uint32_t> losses;
    for (GptModel* m : {&all, &limited, &none}) {
      lp->zero_grads();
      losses.push_back(std::bit_cast<uint32_t>(testing::must(m->forward_backward(in, tgt, 3, 10, *lp, 1.0f))));
      grads.emplace_back(lp->flat_grads().begin(), lp->flat_grads().end());
    }
    EXPECT_EQ(losses[1], losses[0]);
    EXPECT_EQ(losses[2], losses[0]);
    EXPECT_EQ(grads[1], grads[0]);
    EXPECT_EQ(grads[2], grads[0]);
  }
}

TEST(Bf16CopiesTest, LlamaPassesReadRightCopiesAcrossStepsWithAndWithoutCheckpointing) {
  for (bool ckpt : {false, true}) {
    SCOPED_TRACE(ckpt ? "activation checkpointing, untied head, Qwen3 (q/k norms, biases)" : "no checkpointing, tied head");
    LlamaConfig c = testing::micro_llama_config(/*tied=*/!ckpt, ckpt);
    c.n_layer = 3;
    if (ckpt) {  // Qwen3's shape: the q/k norms' backward writes dq's and dk's copies, not RoPE's
      c.family = LlamaFamily::kQwen3;
      c.qk_norm = c.qkv_bias = c.o_bias = true;
    }
    LlamaModel used = testing::make_llama(c), fresh = testing::make_llama(c);
    if (!used.use_matmul(MatmulKind::kBf16).is_ok() || !fresh.use_matmul(MatmulKind::kBf16).is_ok()) {
      GTEST_SKIP() << "no bf16 products here";
    }
    expect_copies_right_across_steps(used, fresh, 2, 9, c.vocab_size);
  }
}

}  // namespace
}  // namespace zinf::model
