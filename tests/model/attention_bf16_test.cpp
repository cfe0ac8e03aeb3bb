// The attention core with bf16 block products (AttentionProducts::kBf16, block_gemm_bf16): GPT
// and grouped-query attention against the fp32 scalar references within bf16 tolerances, bits
// independent of the thread count, and the models choosing bf16 products exactly when their
// linear layers run bf16 ones on an AVX512-BF16 CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "model/attention_core.h"
#include "model/block_gemm.h"
#include "model/kernels.h"
#include "model/llama_kernels.h"
#include "model_test_util.h"
#include "zinf/model/matmul.h"

namespace zinf::model::kernels {
namespace {

constexpr AttentionProducts kBf16 = AttentionProducts::kBf16;

std::vector<float> randn(uint64_t seed, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = static_cast<float>(testing::test_normal(seed, i));
  return v;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); i++) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// Tolerances relative to the largest reference value. Each product rounds its inputs to bf16
// (2^-9 relative each) and the errors add over the hs- or T-long sums and through the softmax;
// stated about 3x above the largest seen on these inputs (forward, backward).
constexpr double kForwardTol = 1.5e-2;
constexpr double kBackwardTol = 2.5e-2;
// And far above the fp32 kernels' own distance from the references (1e-5, 2e-5 in
// kernels_test.cpp): bf16 products must show at least this much, or they did not run.
constexpr double kVisiblyBf16 = 2e-4;

constexpr int kTs[] = {1, 7, 64, 65, 130};
constexpr std::tuple<int, int, int> kGptShapes[] = {{2, 24, 3}, {1, 64, 1}, {1, 256, 2}};  // B, C, NH: hs 8, 64, 128

TEST(AttentionBf16Test, GptNearFp32ReferencesAcrossBlockBoundaries) {
  double worst_fwd = 0, worst_bwd = 0;
  for (int T : kTs) {
    for (auto [B, C, NH] : kGptShapes) {
      SCOPED_TRACE(::testing::Message() << "T=" << T << " B=" << B << " C=" << C << " NH=" << NH);
      const size_t n = static_cast<size_t>(B) * T * C;
      const std::vector<float> qkv = randn(101 + T, 3 * n), dout = randn(102 + T, n);
      std::vector<float> out(n), out32(n), ref(n), lse(static_cast<size_t>(B) * NH * T), lse32(lse.size());
      std::vector<float> scratch(attention_scratch_floats());
      attention_forward(out.data(), lse.data(), qkv.data(), scratch.data(), B, T, C, NH, nullptr, kBf16);
      attention_forward(out32.data(), lse32.data(), qkv.data(), scratch.data(), B, T, C, NH);
      attention_forward_reference(ref.data(), qkv.data(), B, T, C, NH);
      const double fwd = max_diff(out, ref) / max_abs(ref);
      EXPECT_LE(fwd, kForwardTol);
      EXPECT_GE(max_diff(out, out32) / max_abs(ref), kVisiblyBf16);
      worst_fwd = std::max(worst_fwd, fwd);

      std::vector<float> dqkv(3 * n, NAN), dref(3 * n, NAN);  // overwritten, never read
      attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), scratch.data(), B, T, C, NH,
                         nullptr, kBf16);
      attention_backward_reference(dref.data(), dout.data(), qkv.data(), B, T, C, NH);
      std::vector<float> dv_ref;
      for (size_t row = 0; row < static_cast<size_t>(B) * T; row++) {
        dv_ref.insert(dv_ref.end(), dref.begin() + row * 3 * C + 2 * C, dref.begin() + (row + 1) * 3 * C);
      }
      const double bwd = max_diff(dqkv, dref) / max_abs(dv_ref);
      EXPECT_LE(bwd, kBackwardTol);
      worst_bwd = std::max(worst_bwd, bwd);
    }
  }
  std::printf("gpt attention, bf16 products: worst forward %.2e, backward %.2e (relative to the largest value)\n",
              worst_fwd, worst_bwd);
}

TEST(AttentionBf16Test, GqaNearFp32ReferencesAcrossBlockBoundaries) {
  double worst_fwd = 0, worst_bwd = 0;
  for (int T : kTs) {
    for (GqaShape s : {GqaShape{1, T, 4, 1, 16}, GqaShape{2, T, 6, 2, 12}, GqaShape{1, T, 2, 1, 128},
                       GqaShape{1, T, 4, 2, 64}}) {
      SCOPED_TRACE(::testing::Message() << "T=" << T << " NH=" << s.NH << " NKV=" << s.NKV << " hs=" << s.hs);
      const size_t nq = static_cast<size_t>(s.B) * s.T * s.NH * s.hs, nkv = nq / s.NH * s.NKV;
      const std::vector<float> q = randn(111 + T, nq), k = randn(112 + T, nkv), v = randn(113 + T, nkv);
      const std::vector<float> dout = randn(114 + T, nq);
      std::vector<float> out(nq), out32(nq), ref(nq), lse(static_cast<size_t>(s.B) * s.NH * s.T), lse32(lse.size());
      std::vector<float> scratch(gqa_attention_scratch_floats());
      gqa_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), scratch.data(), s, nullptr, kBf16);
      gqa_attention_forward(out32.data(), lse32.data(), q.data(), k.data(), v.data(), scratch.data(), s);
      gqa_attention_forward_reference(ref.data(), q.data(), k.data(), v.data(), s);
      const double fwd = max_diff(out, ref) / max_abs(ref);
      EXPECT_LE(fwd, kForwardTol);
      EXPECT_GE(max_diff(out, out32) / max_abs(ref), kVisiblyBf16);
      worst_fwd = std::max(worst_fwd, fwd);

      std::vector<float> dq(nq, NAN), dk(nkv, NAN), dv(nkv, NAN), dq_ref(nq), dk_ref(nkv), dv_ref(nkv);
      gqa_attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(),
                             lse.data(), scratch.data(), s, nullptr, kBf16);
      gqa_attention_backward_reference(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.data(), q.data(), k.data(),
                                       v.data(), s);
      const double scale = max_abs(dv_ref);
      const double bwd =
          std::max({max_diff(dq, dq_ref), max_diff(dk, dk_ref), max_diff(dv, dv_ref)}) / scale;
      EXPECT_LE(bwd, kBackwardTol);
      worst_bwd = std::max(worst_bwd, bwd);
    }
  }
  std::printf("gqa attention, bf16 products: worst forward %.2e, backward %.2e (relative to the largest value)\n",
              worst_fwd, worst_bwd);
}

// Same bits twice and on pools of 1, 2 and 3 threads, GPT and GQA, with bf16 products.
TEST(AttentionBf16Test, BitsIndependentOfRunAndThreadCount) {
  const int B = 2, T = 200, C = 128, NH = 2;
  const GqaShape s{2, 150, 4, 2, 32};
  ASSERT_TRUE(detail::attention_worth_threads(B, NH, T, C / NH));
  ASSERT_TRUE(detail::attention_worth_threads(s.B, s.NH, s.T, s.hs));
  const size_t n = static_cast<size_t>(B) * T * C;
  const size_t nq = static_cast<size_t>(s.B) * s.T * s.NH * s.hs, nkv = nq / s.NH * s.NKV;
  const std::vector<float> qkv = randn(121, 3 * n), dout = randn(122, n);
  const std::vector<float> q = randn(123, nq), k = randn(124, nkv), v = randn(125, nkv), gdout = randn(126, nq);
  std::vector<std::vector<float>> results;
  for (size_t threads : {1, 2, 2, 3}) {
    ThreadPool pool(threads, false);
    std::vector<float> scratch(pool.threads() * detail::kAttnLaneFloats);
    std::vector<float> out(n), lse(static_cast<size_t>(B) * NH * T), dqkv(3 * n);
    detail::attention_forward_on(pool, out.data(), lse.data(), qkv.data(), scratch.data(), B, T, C, NH, nullptr,
                                 kBf16);
    detail::attention_backward_on(pool, dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), scratch.data(),
                                  B, T, C, NH, nullptr, kBf16);
    std::vector<float> gout(nq), glse(static_cast<size_t>(s.B) * s.NH * s.T), dq(nq), dk(nkv), dv(nkv);
    detail::gqa_attention_forward_on(pool, gout.data(), glse.data(), q.data(), k.data(), v.data(), scratch.data(), s,
                                     nullptr, kBf16);
    detail::gqa_attention_backward_on(pool, dq.data(), dk.data(), dv.data(), gdout.data(), q.data(), k.data(),
                                      v.data(), gout.data(), glse.data(), scratch.data(), s, nullptr, kBf16);
    for (const auto* part : {&lse, &dqkv, &gout, &glse, &dq, &dk, &dv}) out.insert(out.end(), part->begin(), part->end());
    results.push_back(std::move(out));
  }
  for (size_t i = 1; i < results.size(); i++) {
    ASSERT_EQ(results[i].size(), results[0].size());
    EXPECT_EQ(std::memcmp(results[0].data(), results[i].data(), results[0].size() * sizeof(float)), 0) << "run " << i;
  }
}

// Sets set_attention_blas for a scope (fp32 OpenBLAS products whatever the model passes).
struct ScopedAttentionBlas {
  explicit ScopedAttentionBlas(bool on) : was(detail::attention_blas()) { detail::set_attention_blas(on); }
  ~ScopedAttentionBlas() { detail::set_attention_blas(was); }
  bool was;
};

// Relative L2 distance of the gradients of one forward/backward with the model's own attention
// products from those with attention forced to fp32 OpenBLAS products. fp32 block_gemm and
// OpenBLAS differ only in summation order (a distance near 1e-7); bf16 products far more.
// Also checks that the model's attention passes, forward and backward, took `want` products.
template <typename Model>
double attention_products_distance(Model& model, MatmulKind kind, AttentionProducts want, int layers) {
  EXPECT_TRUE(model.use_matmul(kind).is_ok());
  Result<LocalParams> lp = LocalParams::create(model.params(), model.modules());
  EXPECT_TRUE(lp.is_ok());
  lp->init(5);
  const int B = 2, T = 70;  // two query blocks
  const std::vector<int32_t> in = testing::random_tokens(6, B * T, model.vocab_size());
  const std::vector<int32_t> tgt = testing::random_tokens(7, B * T, model.vocab_size());
  lp->zero_grads();
  const detail::AttentionPassCounts before = detail::attention_pass_counts();
  (void)testing::must(model.forward_backward(in, tgt, B, T, *lp, 1.0f));
  const detail::AttentionPassCounts after = detail::attention_pass_counts();
  for (int backward = 0; backward < 2; backward++) {
    for (AttentionProducts p : {AttentionProducts::kFp32, AttentionProducts::kBf16}) {
      const int i = p == AttentionProducts::kBf16;
      EXPECT_EQ(after.passes[backward][i] - before.passes[backward][i], p == want ? layers : 0)
          << (backward ? "backward" : "forward") << " passes with " << (i ? "bf16" : "fp32") << " products";
    }
  }
  const std::vector<float> own(lp->flat_grads().begin(), lp->flat_grads().end());
  lp->zero_grads();
  {
    ScopedAttentionBlas blas(true);
    (void)testing::must(model.forward_backward(in, tgt, B, T, *lp, 1.0f));
  }
  double diff2 = 0, norm2 = 0;
  for (size_t i = 0; i < own.size(); i++) {
    const double d = static_cast<double>(own[i]) - lp->flat_grads()[i];
    diff2 += d * d;
    norm2 += static_cast<double>(own[i]) * own[i];
  }
  return std::sqrt(diff2 / norm2);
}

bool bf16_matmul_here() {
  const MatmulSupport s = matmul_support();
  return s.dnnl_built && s.bf16_units;
}

TEST(AttentionBf16Test, ChoiceFollowsTheMatmulKindAndTheCpu) {
  EXPECT_EQ(attention_products_for(MatmulKind::kFp32), AttentionProducts::kFp32);
  EXPECT_EQ(attention_products_for(MatmulKind::kBf16),
            detail::block_gemm_bf16_supported() ? AttentionProducts::kBf16 : AttentionProducts::kFp32);
}

// The models pass the choice down: an fp32 GPT / Llama keeps fp32 attention products (its
// passes count as fp32, its gradients stay within summation-order distance of OpenBLAS
// attention), a bf16 one on an AVX512-BF16 CPU takes bf16 products (counted so, forward and
// backward, and its gradients visibly farther).
TEST(AttentionBf16Test, ModelsUseBf16ProductsExactlyWithBf16Matmul) {
  GptConfig gc;
  gc.vocab_size = 96;
  gc.max_seq = 80;
  gc.n_layer = 2;
  gc.n_head = 2;
  gc.n_embd = 128;  // hs 64, as GPT-2
  LlamaConfig lc = testing::micro_llama_config(false);
  lc.max_seq = 80;
  lc.n_embd = 128;
  lc.intermediate_size = 160;  // 4 query heads of 32 on 2 kv heads
  GptModel gpt = testing::make_gpt(gc);
  LlamaModel llama = testing::make_llama(lc);
  const AttentionProducts fp32 = AttentionProducts::kFp32;
  const double gpt32 = attention_products_distance(gpt, MatmulKind::kFp32, fp32, gc.n_layer);
  const double llama32 = attention_products_distance(llama, MatmulKind::kFp32, fp32, lc.n_layer);
  std::printf("fp32 matmul: gradient distance to OpenBLAS attention: gpt %.2e, llama %.2e\n", gpt32, llama32);
  EXPECT_LE(gpt32, 1e-5);
  EXPECT_LE(llama32, 1e-5);
  if (!bf16_matmul_here()) GTEST_SKIP() << "no bf16 matmul on this build or CPU";
  const AttentionProducts chosen = detail::block_gemm_bf16_supported() ? kBf16 : fp32;
  const double gpt16 = attention_products_distance(gpt, MatmulKind::kBf16, chosen, gc.n_layer);
  const double llama16 = attention_products_distance(llama, MatmulKind::kBf16, chosen, lc.n_layer);
  std::printf("bf16 matmul: gradient distance to OpenBLAS attention: gpt %.2e, llama %.2e\n", gpt16, llama16);
  if (detail::block_gemm_bf16_supported()) {
    EXPECT_GE(gpt16, 1e-4);
    EXPECT_GE(llama16, 1e-4);
  } else {
    EXPECT_LE(gpt16, 1e-5);
    EXPECT_LE(llama16, 1e-5);
  }
}

}  // namespace
}  // namespace zinf::model::kernels
