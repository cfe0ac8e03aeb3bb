// block_gemm (the attention core's block products) against its scalar reference: the same bits
// for every transposition, odd sizes, both accumulate modes and strided operands; and against a
// double-precision product within a stated tolerance, so the reference itself is checked. The
// same for block_gemm_bf16 (AVX512-BF16) and its step-by-step reference, on inputs that make
// denormals, overflow-free huge products and exact cancellations.
#include "model/block_gemm.h"

#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "model/bf16.h"

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

// ---- block_gemm_bf16

// Values of mixed kinds: O(1) floats (bf16 rounding matters), tiny ones whose products land
// around FLT_MIN (denormal and flushed results), float denormals (DAZ after rounding), small
// exact values that cancel exactly (signed zeros), and large ones.
std::vector<float> mixed(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  const float exact[] = {1.0f, -1.0f, 0.5f, -0.5f, 3.0f, -3.0f, 0.0f, -0.0f};
  std::vector<float> v(n);
  for (float& x : v) {
    const unsigned kind = rng() % 8;
    if (kind < 3) {
      x = u(rng);
    } else if (kind < 5) {
      x = std::ldexp(u(rng), -60 - static_cast<int>(rng() % 10));
    } else if (kind == 5) {
      x = std::bit_cast<float>(static_cast<uint32_t>(rng() & 0x807fffffu));  // a float denormal
    } else if (kind == 6) {
      x = exact[rng() % 8];
    } else {
      x = std::ldexp(u(rng), 55);
    }
  }
  return v;
}

// One bf16 case with padded leading dimensions: kernel == reference bitwise (C's padding kept).
void check_bf16(const Case& c, bool accumulate, float alpha, unsigned seed) {
  const int pad = 5;
  const int a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const int lda = a_cols + pad, ldb = b_cols + pad, ldc = c.N + pad;
  const std::vector<float> A = mixed(static_cast<size_t>(a_rows) * lda, seed);
  const std::vector<float> B = mixed(static_cast<size_t>(b_rows) * ldb, seed + 1);
  const std::vector<float> C0 = filled(static_cast<size_t>(c.M) * ldc, seed + 2);
  std::vector<float> fast = C0, ref = C0;
  d::block_gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, alpha, A.data(), lda, B.data(), ldb, accumulate, fast.data(), ldc);
  d::block_gemm_bf16_reference(c.ta, c.tb, c.M, c.N, c.K, alpha, A.data(), lda, B.data(), ldb, accumulate,
                               ref.data(), ldc);
  for (size_t at = 0; at < fast.size(); at++) {
    ASSERT_EQ(std::bit_cast<uint32_t>(fast[at]), std::bit_cast<uint32_t>(ref[at]))
        << "ta " << c.ta << " tb " << c.tb << " M " << c.M << " N " << c.N << " K " << c.K << " acc " << accumulate
        << " at (" << at / ldc << ", " << at % ldc << "): " << fast[at] << " vs " << ref[at];
    if (static_cast<int>(at % ldc) >= c.N) {
      ASSERT_EQ(std::bit_cast<uint32_t>(ref[at]), std::bit_cast<uint32_t>(C0[at]));
    }
  }
}

// The transpositions the attention core uses: scores Q K^T, P V and dS K, P^T dO and dS^T Q.
constexpr bool kAttnTrans[3][2] = {{false, true}, {false, false}, {true, false}};

TEST(BlockGemmBf16Test, KernelMatchesReferenceBitwise) {
  if (!d::block_gemm_bf16_supported()) GTEST_SKIP() << "this CPU lacks AVX512-BF16 (block_gemm_bf16 is the reference)";
  unsigned seed = 1;
  for (const auto& t : kAttnTrans) {
    // Every K from 1 to 64 (odd ones pad a zero pair half), and every M and N, on small partners.
    for (int x = 1; x <= 64; x++) {
      for (const Case& c : {Case{t[0], t[1], 3, 17, x}, Case{t[0], t[1], x, 5, 7}, Case{t[0], t[1], 7, x, 4}}) {
        check_bf16(c, seed % 2 == 0, seed % 3 == 0 ? 0.125f : 1.0f, seed);
        seed++;
        if (HasFatalFailure()) return;
      }
    }
    for (int M : {1, 6, 13, 33, 64}) {
      for (int N : {1, 16, 31, 48, 64}) {
        for (int K : {1, 2, 15, 32, 33, 63, 64}) {
          check_bf16({t[0], t[1], M, N, K}, seed % 2 == 0, seed % 3 == 0 ? 0.125f : 1.0f, seed);
          seed++;
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// The reference itself: VDPBF16PS's order, its flushes and x86's after-rounding tininess, on
// 1 x 1 products whose results are known.
TEST(BlockGemmBf16Test, ReferenceStepsAsTheInstruction) {
  // C (1, 1) = a (1, K) @ b (K, 1), K <= 4, on both paths (they must agree) and the reference's value.
  const auto dot = [](std::vector<float> a, std::vector<float> b) {
    float c = 7.0f, r = 7.0f;
    const int K = static_cast<int>(a.size());
    d::block_gemm_bf16_reference(false, false, 1, 1, K, 1.0f, a.data(), K, b.data(), 1, false, &r, 1);
    d::block_gemm_bf16(false, false, 1, 1, K, 1.0f, a.data(), K, b.data(), 1, false, &c, 1);
    EXPECT_EQ(std::bit_cast<uint32_t>(c), std::bit_cast<uint32_t>(r)) << c << " vs " << r;
    return r;
  };
  const auto dot2 = [&](float a0, float a1, float b0, float b1) { return dot({a0, a1}, {b0, b1}); };
  // Pairs in order, the high element (2p + 1) of each first: 2^60, + 1 (rounded away), - 2^60 = 0;
  // the low element first would give 1.
  const float big = std::ldexp(1.0f, 30);
  EXPECT_EQ(dot({big, 0.0f, -big, 1.0f}, {big, 0.0f, big, 1.0f}), 0.0f);
  // An exact product below FLT_MIN flushes to zero of its sign.
  const float t = std::ldexp(1.0f, -64);
  EXPECT_EQ(std::bit_cast<uint32_t>(dot2(t, 0.0f, -t, 0.0f)), std::bit_cast<uint32_t>(-0.0f));
  // A bf16 denormal input reads as zero; to_bf16 of the largest float denormal is FLT_MIN, a normal.
  EXPECT_EQ(dot2(std::bit_cast<float>(0x00400000u), 0.0f, 1.0f, 0.0f), 0.0f);
  EXPECT_EQ(dot2(std::bit_cast<float>(0x007fffffu), 0.0f, 1.0f, 0.0f), FLT_MIN);
  // FLT_MIN - 1.5 * 2^-151: gradual underflow rounds it to FLT_MIN, x86 (24 bits, unbounded
  // exponent) to below FLT_MIN, so tiny and flushed; 2^-152 less rounds to FLT_MIN both ways.
  const float h = std::ldexp(1.0f, -63);
  EXPECT_EQ(dot2(-1.5f * std::ldexp(1.0f, -100), h, std::ldexp(1.0f, -51), h), 0.0f);
  EXPECT_EQ(dot2(-std::ldexp(1.0f, -100), h, std::ldexp(1.0f, -52), h), FLT_MIN);
}

TEST(BlockGemmBf16Test, ReferenceMatchesDoubleOfRoundedInputs) {
  for (const auto& t : kAttnTrans) {
    const Case c{t[0], t[1], 19, 23, 37};
    const int lda = c.ta ? c.M : c.K, ldb = c.tb ? c.K : c.N;
    const std::vector<float> A = filled(static_cast<size_t>(c.ta ? c.K : c.M) * lda, 4);
    const std::vector<float> B = filled(static_cast<size_t>(c.tb ? c.N : c.K) * ldb, 5);
    std::vector<float> C(static_cast<size_t>(c.M) * c.N);
    d::block_gemm_bf16_reference(c.ta, c.tb, c.M, c.N, c.K, 0.5f, A.data(), lda, B.data(), ldb, false, C.data(), c.N);
    const auto r = [](float x) { return static_cast<double>(zinf::model::detail::from_bf16(zinf::model::detail::to_bf16(x))); };
    double worst_rounded = 0, worst_fp32 = 0;
    for (int i = 0; i < c.M; i++) {
      for (int j = 0; j < c.N; j++) {
        double sum = 0, sum32 = 0, mag = 0;
        for (int k = 0; k < c.K; k++) {
          const float a = c.ta ? A[static_cast<size_t>(k) * lda + i] : A[static_cast<size_t>(i) * lda + k];
          const float b = c.tb ? B[static_cast<size_t>(j) * ldb + k] : B[static_cast<size_t>(k) * ldb + j];
          sum += r(a) * r(b);
          sum32 += static_cast<double>(a) * b;
          mag += std::fabs(r(a) * r(b));
        }
        const double got = C[static_cast<size_t>(i) * c.N + j];
        // fp32 accumulation of exact products: K roundings of at most half an ulp of the sum so far.
        ASSERT_NEAR(got, 0.5 * sum, 0.5 * c.K * std::ldexp(mag, -24)) << i << ", " << j;
        worst_rounded = std::max(worst_rounded, std::fabs(got - 0.5 * sum));
        worst_fp32 = std::max(worst_fp32, std::fabs(got - 0.5 * sum32));
      }
    }
    // The bf16 rounding of the inputs is what separates it from the fp32 product.
    EXPECT_GT(worst_fp32, worst_rounded);
  }
}

TEST(BlockGemmBf16Test, EmptyAndZeroK) {
  std::vector<float> C = {1.0f, 2.0f};
  const float a = 3.0f;
  d::block_gemm_bf16(false, false, 0, 2, 1, 1.0f, &a, 1, &a, 1, false, C.data(), 2);
  EXPECT_EQ(C[0], 1.0f);
  d::block_gemm_bf16(false, false, 1, 2, 0, 1.0f, &a, 1, &a, 2, true, C.data(), 2);
  EXPECT_EQ(C[1], 2.0f);
  d::block_gemm_bf16(false, false, 1, 2, 0, 1.0f, &a, 1, &a, 2, false, C.data(), 2);
  EXPECT_EQ(C[1], 0.0f);
}

}  // namespace
