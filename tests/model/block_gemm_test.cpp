// block_gemm (the attention core's block products) against its scalar reference: the same bits
// for every transposition, odd sizes, both accumulate modes and strided operands; and against a
// double-precision product within a stated tolerance, so the reference itself is checked.
#include "model/block_gemm.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

namespace d = zinf::model::kernels::detail;

std::vector<float> filled(size_t n, unsigned seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) {
    v[i] = static_cast<float>(static_cast<int>(((i + seed) * 2654435761u) % 2001) - 1000) / 997.0f;
  }
  return v;
}

struct Case {
  bool ta, tb;
  int M, N, K;
};

// Runs one case with padded leading dimensions (pad 3) and checks fast == reference bitwise and
// both close to a double product.
void check(const Case& c, bool accumulate, float alpha, d::BlockGemmIsa isa = d::block_gemm_isa()) {
  const int pad = 3;
  const int a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const int lda = a_cols + pad, ldb = b_cols + pad, ldc = c.N + pad;
  const std::vector<float> A = filled(static_cast<size_t>(a_rows) * lda, 1);
  const std::vector<float> B = filled(static_cast<size_t>(b_rows) * ldb, 2);
  const std::vector<float> C0 = filled(static_cast<size_t>(c.M) * ldc, 3);
  std::vector<float> fast = C0, ref = C0;
  d::block_gemm_on(isa, c.ta, c.tb, c.M, c.N, c.K, alpha, A.data(), lda, B.data(), ldb, accumulate, fast.data(),
                   ldc);
  d::block_gemm_reference(c.ta, c.tb, c.M, c.N, c.K, alpha, A.data(), lda, B.data(), ldb, accumulate, ref.data(),
                          ldc);
  for (int i = 0; i < c.M; i++) {
    for (int j = 0; j < ldc; j++) {
      const size_t at = static_cast<size_t>(i) * ldc + j;
      ASSERT_EQ(std::bit_cast<uint32_t>(fast[at]), std::bit_cast<uint32_t>(ref[at]))
          << "ta " << c.ta << " tb " << c.tb << " M " << c.M << " N " << c.N << " K " << c.K << " at (" << i << ", "
          << j << ")";
      if (j >= c.N) continue;  // padding: fast == ref here, ref == C0 below
      double sum = 0.0;
      for (int k = 0; k < c.K; k++) {
        const double a = c.ta ? A[static_cast<size_t>(k) * lda + i] : A[static_cast<size_t>(i) * lda + k];
        const double b = c.tb ? B[static_cast<size_t>(j) * ldb + k] : B[static_cast<size_t>(k) * ldb + j];
        sum += a * b;
      }
      const double want = alpha * sum + (accumulate ? C0[at] : 0.0);
      ASSERT_NEAR(ref[at], want, 1e-5 * (1 + c.K) * (1 + std::fabs(want))) << "reference off at " << i << ", " << j;
    }
    for (int j = c.N; j < ldc; j++) {
      ASSERT_EQ(ref[static_cast<size_t>(i) * ldc + j], C0[static_cast<size_t>(i) * ldc + j]);
    }
  }
}

class BlockGemmIsaTest : public testing::TestWithParam<d::BlockGemmIsa> {};

TEST_P(BlockGemmIsaTest, MatchesReferenceBitwise) {
  const d::BlockGemmIsa isa = GetParam();
  if (!d::block_gemm_supports(isa)) GTEST_SKIP() << "this CPU lacks the kernel's instructions";
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (int M : {1, 7, 33, 63, 64}) {
        for (int N : {1, 7, 16, 33, 63, 64, 80}) {
          for (int K : {1, 16, 32, 33, 64, 80}) {
            for (bool acc : {false, true}) {
              check({ta, tb, M, N, K}, acc, 1.0f, isa);
              if (HasFatalFailure()) return;
            }
            check({ta, tb, M, N, K}, false, 0.125f, isa);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, BlockGemmIsaTest,
                         testing::Values(d::BlockGemmIsa::kAvx2Fma, d::BlockGemmIsa::kAvx512),
                         [](const testing::TestParamInfo<d::BlockGemmIsa>& i) {
                           return i.param == d::BlockGemmIsa::kAvx512 ? "avx512" : "avx2_fma";
                         });

TEST(BlockGemmTest, AttentionShapes) {
  // block_gemm runs the widest kernel the CPU has (or ZINF_BLOCK_GEMM_ISA's).
  std::printf("block_gemm here: %s\n", d::block_gemm_isa() == d::BlockGemmIsa::kAvx512    ? "AVX-512"
                                        : d::block_gemm_isa() == d::BlockGemmIsa::kAvx2Fma ? "AVX2 + FMA"
                                                                                            : "reference");
  // The six products of one (64, 64) block pair at hs 64, and at hs 128 with 32-row blocks.
  for (int hs : {64, 128}) {
    const int b = hs <= 64 ? 64 : 32;
    for (const Case& c : {Case{false, true, b, b, hs}, Case{false, false, b, hs, b}, Case{true, false, b, hs, b}}) {
      check(c, false, 0.125f);
      check(c, true, 1.0f);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(BlockGemmTest, EmptyIsNoOp) {
  std::vector<float> C = {1.0f, 2.0f};
  const float a = 3.0f;
  d::block_gemm(false, false, 0, 2, 1, 1.0f, &a, 1, &a, 1, false, C.data(), 2);
  d::block_gemm(false, true, 1, 0, 1, 1.0f, &a, 1, &a, 1, false, C.data(), 2);
  EXPECT_EQ(C[0], 1.0f);
  // K = 0: the product is zero, so C is zeroed or kept.
  d::block_gemm(false, false, 1, 2, 0, 1.0f, &a, 1, &a, 2, true, C.data(), 2);
  EXPECT_EQ(C[1], 2.0f);
  d::block_gemm(false, false, 1, 2, 0, 1.0f, &a, 1, &a, 2, false, C.data(), 2);
  EXPECT_EQ(C[1], 0.0f);
}

}  // namespace
