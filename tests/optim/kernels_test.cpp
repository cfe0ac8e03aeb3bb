// Every vector path (and every thread count) gives the scalar reference's results bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "test_util.h"
#include "zinf/optim/optimizer.h"
#include "zinf/thread_pool.h"

namespace zinf::optim {
namespace {

using testing::Buffer;

enum class Algo { kAdam, kAdamL2, kAdamW, kAdamNoBiasCorrection, kAdagrad, kAdagradDecay, kLion, kLionDecay };
constexpr Algo kAlgos[] = {Algo::kAdam,    Algo::kAdamL2,       Algo::kAdamW, Algo::kAdamNoBiasCorrection,
                           Algo::kAdagrad, Algo::kAdagradDecay, Algo::kLion,  Algo::kLionDecay};
constexpr DType kDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
const std::optional<DType> kCopies[] = {std::nullopt, DType::kBF16, DType::kF16};

// Initial contents of one step's arrays.
struct Problem {
  Algo algo = Algo::kAdam;
  DType grad_dtype = DType::kF32;
  std::optional<DType> copy;
  std::size_t n = 0;
  std::vector<float> param, state1, state2;
  std::vector<unsigned char> grad;
};

struct Outcome {
  std::vector<unsigned char> param, state1, state2, copy;
  bool operator==(const Outcome&) const = default;
};

Problem make_problem(Algo algo, DType grad_dtype, std::optional<DType> copy, std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  Problem p{algo, grad_dtype, copy, n, std::vector<float>(n), std::vector<float>(n), std::vector<float>(n),
            std::vector<unsigned char>(n * dtype_size(grad_dtype))};
  testing::fill(p.param.data(), DType::kF32, n, rng, 1.0f);
  testing::fill(p.state1.data(), DType::kF32, n, rng, 0.01f);
  testing::fill(p.state2.data(), DType::kF32, n, rng, 1e-4f, /*non_negative=*/true);
  testing::fill(p.grad.data(), grad_dtype, n, rng, 0.1f);
  return p;
}

std::vector<unsigned char> bytes_of(const void* p, std::size_t n) {
  const auto* c = static_cast<const unsigned char*>(p);
  return std::vector<unsigned char>(c, c + n);
}

// Runs one step of p.algo on copies of the problem placed `offset` elements past alignment
// (each array a little differently), with the given execution options.
Outcome run(const Problem& pr, const ExecOptions& exec, std::size_t offset, double grad_scale = 1.0) {
  const std::size_t n = pr.n;
  Buffer param(n, 4, offset), s1(n, 4, (offset + 1) % 16), s2(n, 4, (offset + 2) % 16);
  Buffer grad(n, dtype_size(pr.grad_dtype), (offset + 3) % 16), copy(n, 2, (offset + 5) % 16);
  if (n > 0) {
    std::memcpy(param.data(), pr.param.data(), 4 * n);
    std::memcpy(s1.data(), pr.state1.data(), 4 * n);
    std::memcpy(s2.data(), pr.state2.data(), 4 * n);
    std::memcpy(grad.data(), pr.grad.data(), pr.grad.size());
  }
  const std::span<float> ps(param.f32(), n), m(s1.f32(), n), v(s2.f32(), n);
  const GradView g{grad.data(), pr.grad_dtype, n, grad_scale};
  const HalfCopy c{pr.copy ? copy.data() : nullptr, pr.copy.value_or(DType::kBF16)};
  Status st;
  switch (pr.algo) {
    case Algo::kAdam:
    case Algo::kAdamL2:
    case Algo::kAdamW:
    case Algo::kAdamNoBiasCorrection: {
      AdamParams hp{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
      hp.weight_decay = pr.algo == Algo::kAdamL2 || pr.algo == Algo::kAdamW ? 0.01 : 0.0;
      hp.adam_w_mode = pr.algo != Algo::kAdamL2;
      hp.bias_correction = pr.algo != Algo::kAdamNoBiasCorrection;
      st = adam_step(hp, 7, ps, m, v, g, c, exec);
      break;
    }
    case Algo::kAdagrad:
    case Algo::kAdagradDecay:
      st = adagrad_step({.lr = 1e-2, .eps = 1e-10, .weight_decay = pr.algo == Algo::kAdagradDecay ? 0.1 : 0.0}, ps,
                        v, g, c, exec);
      break;
    case Algo::kLion:
    case Algo::kLionDecay:
      st = lion_step({.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = pr.algo == Algo::kLionDecay ? 0.5 : 0.0},
                     ps, m, g, c, exec);
      break;
  }
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return Outcome{bytes_of(param.data(), 4 * n), bytes_of(s1.data(), 4 * n), bytes_of(s2.data(), 4 * n),
                 pr.copy ? bytes_of(copy.data(), 2 * n) : std::vector<unsigned char>{}};
}

class KernelPaths : public ::testing::TestWithParam<KernelIsa> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam())) GTEST_SKIP() << isa_name(GetParam()) << " is not available here";
  }
  ThreadPool one_{1};
  ThreadPool three_{3};
};

Problem prefix(const Problem& p, std::size_t n) {
  Problem q = p;
  q.n = n;
  q.param.resize(n);
  q.state1.resize(n);
  q.state2.resize(n);
  q.grad.resize(n * dtype_size(p.grad_dtype));
  return q;
}

// Every length 0..300 for every algorithm. Lengths up to 40 (every tail of a 8- or 16-wide
// vector, and more) run every grad dtype x copy dtype pair; longer ones rotate through the
// pairs (9 pairs, coprime with 16, so each pair still meets every tail length).
TEST_P(KernelPaths, EveryLengthUpTo300MatchesScalar) {
  const ExecOptions scalar{.pool = &one_, .isa = KernelIsa::kScalar};
  const ExecOptions single{.pool = &one_, .isa = GetParam()};
  // Tiny pieces, so that even short arrays are split over the three threads.
  const ExecOptions threaded{.pool = &three_, .isa = GetParam(), .min_elements_per_thread = 16};
  for (Algo algo : kAlgos) {
    for (std::size_t pair = 0; pair < 9; ++pair) {
      const DType gd = kDtypes[pair / 3];
      const std::optional<DType> copy = kCopies[pair % 3];
      const Problem whole = make_problem(algo, gd, copy, 300, static_cast<unsigned>(algo) * 16 + static_cast<unsigned>(pair));
      for (std::size_t n = 0; n <= 300; ++n) {
        if (n > 40 && n % 9 != pair) continue;
        const Problem pr = prefix(whole, n);
        const Outcome want = run(pr, scalar, n % 16);
        ASSERT_EQ(run(pr, single, (n + 7) % 16), want)
            << "algo " << static_cast<int>(algo) << " grad " << dtype_name(gd) << " pair " << pair << " n " << n;
        ASSERT_EQ(run(pr, threaded, (n + 3) % 16), want)
            << "threaded: algo " << static_cast<int>(algo) << " grad " << dtype_name(gd) << " pair " << pair << " n " << n;
      }
    }
  }
}

TEST_P(KernelPaths, LargeArraysMatchScalarWithAnyThreadCount) {
  const std::size_t n = 50'003;  // a tail on every path, and three pieces below
  const ExecOptions scalar{.pool = &one_, .isa = KernelIsa::kScalar};
  for (Algo algo : {Algo::kAdamW, Algo::kAdamL2, Algo::kAdagradDecay, Algo::kLionDecay}) {
    for (DType gd : kDtypes) {
      const Problem pr = make_problem(algo, gd, DType::kBF16, n, 99);
      const Outcome want = run(pr, scalar, 1);
      EXPECT_EQ(run(pr, {.pool = &one_, .isa = GetParam()}, 3), want) << static_cast<int>(algo);
      EXPECT_EQ(run(pr, {.pool = &three_, .isa = GetParam(), .min_elements_per_thread = 4096}, 2), want)
          << static_cast<int>(algo);
    }
  }
}

// Inputs that produce inf, NaN, signed zeros and 16-bit overflow. NaN payloads may differ
// between paths where two different NaNs meet, so a NaN only has to stay a NaN.
TEST_P(KernelPaths, SpecialValuesMatchScalar) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {0.0f, -0.0f, inf, -inf, nan, 1e-45f, -1e-40f, 3.4e38f, -3.4e38f, 70000.0f, 65519.0f,
                            1.0f, -1.0f, 6e-8f};
  const std::size_t k = std::size(specials);
  for (Algo algo : kAlgos) {
    for (const std::optional<DType>& copy : kCopies) {
      Problem pr = make_problem(algo, DType::kF32, copy, k * k, 5);
      for (std::size_t i = 0; i < k * k; ++i) {
        pr.param[i] = specials[i % k];
        const float g = specials[i / k];
        std::memcpy(pr.grad.data() + 4 * i, &g, 4);
      }
      const Outcome want = run(pr, {.pool = &one_, .isa = KernelIsa::kScalar}, 0);
      const Outcome got = run(pr, {.pool = &one_, .isa = GetParam()}, 1);
      for (std::size_t i = 0; i < k * k; ++i) {
        for (auto member : {&Outcome::param, &Outcome::state1, &Outcome::state2}) {
          float a, b;
          std::memcpy(&a, (want.*member).data() + 4 * i, 4);
          std::memcpy(&b, (got.*member).data() + 4 * i, 4);
          EXPECT_TRUE(std::memcmp(&a, &b, 4) == 0 || (std::isnan(a) && std::isnan(b)))
              << "algo " << static_cast<int>(algo) << " element " << i << ": " << a << " vs " << b;
        }
        if (copy) {
          std::uint16_t a, b;
          std::memcpy(&a, want.copy.data() + 2 * i, 2);
          std::memcpy(&b, got.copy.data() + 2 * i, 2);
          const bool nan_a = (a & 0x7FFF) > (*copy == DType::kBF16 ? 0x7F80 : 0x7C00);
          const bool nan_b = (b & 0x7FFF) > (*copy == DType::kBF16 ? 0x7F80 : 0x7C00);
          EXPECT_TRUE(a == b || (nan_a && nan_b)) << "copy element " << i << ": " << a << " vs " << b;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, KernelPaths, ::testing::Values(KernelIsa::kScalar, KernelIsa::kAvx2, KernelIsa::kAvx512),
                         [](const auto& info) { return std::string(isa_name(info.param)); });

// A power-of-two gradient scale is exact, so the fused unscale gives the unscaled result.
TEST(FusedGradScale, PowerOfTwoScaleEqualsUnscaledGradients) {
  ThreadPool pool(2);
  for (KernelIsa isa : {KernelIsa::kScalar, best_isa()}) {
    Problem plain = make_problem(Algo::kAdamW, DType::kF32, DType::kBF16, 1000, 3);
    Problem scaled = plain;
    for (std::size_t i = 0; i < plain.n; ++i) {
      float g;
      std::memcpy(&g, plain.grad.data() + 4 * i, 4);
      g *= 65536.0f;
      std::memcpy(scaled.grad.data() + 4 * i, &g, 4);
    }
    const ExecOptions exec{.pool = &pool, .isa = isa};
    EXPECT_EQ(run(scaled, exec, 0, 1.0 / 65536.0), run(plain, exec, 0)) << isa_name(isa);
  }
}

}  // namespace
}  // namespace zinf::optim
