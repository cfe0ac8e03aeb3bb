// The optimizers against an independent double-precision computation written here from the
// formulas of reference-semantics.md section 5, over several steps with changing lr and beta1.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "test_util.h"
#include "zinf/optim/optimizer.h"
#include "zinf/thread_pool.h"

namespace zinf::optim {
namespace {

constexpr std::size_t kN = 517;
constexpr int kSteps = 6;

struct Data {
  std::vector<float> p, m, v;
  std::vector<std::vector<float>> grads;  // one per step
};

Data make_data(unsigned seed) {
  std::mt19937 rng(seed);
  Data d{std::vector<float>(kN), std::vector<float>(kN), std::vector<float>(kN), {}};
  testing::fill(d.p.data(), DType::kF32, kN, rng, 1.0f);
  for (int s = 0; s < kSteps; ++s) {
    d.grads.emplace_back(kN);
    testing::fill(d.grads.back().data(), DType::kF32, kN, rng, 0.5f);
  }
  return d;
}

// |got - want| within a few float ulps of the parameter plus 1e-5 of the distance the
// parameter travelled (the sum of |update| over the steps: fp32 rounds every step's update).
void expect_close(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& path,
                  const char* what) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = 4e-7 * std::fabs(want[i]) + 1e-5 * path[i] + 1e-12;
    ASSERT_NEAR(got[i], want[i], tol) << what << " element " << i;
  }
}

double lr_at(int s) { return 1e-3 * (1.0 + 0.25 * s); }
double beta1_at(int s) { return 0.85 + 0.01 * s; }  // as OneCycle momentum would

void check_adam(bool adam_w, double wd, bool bias_correction) {
  ThreadPool pool(2);
  Data d = make_data(11);
  std::vector<double> p(d.p.begin(), d.p.end()), m(kN, 0.0), v(kN, 0.0);
  std::vector<double> path(kN, 0.0);
  std::vector<float> fm(kN, 0.0f), fv(kN, 0.0f);
  const double beta2 = 0.999, eps = 1e-8;
  for (int s = 0; s < kSteps; ++s) {
    const int t = s + 1;
    const double lr = lr_at(s), beta1 = beta1_at(s);
    const double bc1 = bias_correction ? 1.0 - std::pow(beta1, t) : 1.0;
    const double bc2 = bias_correction ? 1.0 - std::pow(beta2, t) : 1.0;
    for (std::size_t i = 0; i < kN; ++i) {
      double g = d.grads[s][i];
      if (!adam_w && wd > 0) g += wd * p[i];
      m[i] = beta1 * m[i] + (1 - beta1) * g;
      v[i] = beta2 * v[i] + (1 - beta2) * g * g;
      const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + eps;
      const double before = p[i];
      if (adam_w && wd > 0) p[i] -= lr * wd * p[i];
      p[i] -= lr / bc1 * m[i] / denom;
      path[i] += std::fabs(p[i] - before);
    }
    AdamParams hp{.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = wd,
                  .bias_correction = bias_correction, .adam_w_mode = adam_w};
    ASSERT_TRUE(adam_step(hp, t, d.p, fm, fv, GradView{d.grads[s].data(), DType::kF32, kN}, {}, {.pool = &pool}).is_ok());
  }
  expect_close(d.p, p, path, "param");
}

TEST(AdamMath, AdamWAgreesWithDouble) { check_adam(true, 0.1, true); }
TEST(AdamMath, AdamL2AgreesWithDouble) { check_adam(false, 0.1, true); }
TEST(AdamMath, NoDecayNoBiasCorrectionAgreesWithDouble) { check_adam(true, 0.0, false); }

TEST(AdagradMath, AgreesWithDoubleTorchSemantics) {
  ThreadPool pool(2);
  Data d = make_data(12);
  std::vector<double> p(d.p.begin(), d.p.end()), v(kN, 0.0);
  std::vector<double> path(kN, 0.0);
  std::vector<float> fv(kN, 0.0f);
  const double wd = 0.05, eps = 1e-10;
  for (int s = 0; s < kSteps; ++s) {
    const double lr = 10 * lr_at(s);
    for (std::size_t i = 0; i < kN; ++i) {
      const double g = d.grads[s][i] + wd * p[i];  // torch: the decayed gradient, also in the numerator
      v[i] += g * g;
      const double step = lr * g / (std::sqrt(v[i]) + eps);
      p[i] -= step;
      path[i] += std::fabs(step);
    }
    AdagradParams hp{.lr = lr, .eps = eps, .weight_decay = wd};
    ASSERT_TRUE(adagrad_step(hp, d.p, fv, GradView{d.grads[s].data(), DType::kF32, kN}, {}, {.pool = &pool}).is_ok());
  }
  expect_close(d.p, p, path, "param");
}

TEST(LionMath, AgreesWithDouble) {
  ThreadPool pool(2);
  Data d = make_data(13);
  std::vector<double> p(d.p.begin(), d.p.end()), m(kN, 0.0);
  std::vector<double> path(kN, 0.0);
  std::vector<float> fm(kN, 0.0f);
  const double beta2 = 0.99, wd = 0.1;
  for (int s = 0; s < kSteps; ++s) {
    const double lr = lr_at(s), beta1 = beta1_at(s);
    for (std::size_t i = 0; i < kN; ++i) {
      const double g = d.grads[s][i];
      const double c = beta1 * m[i] + (1 - beta1) * g;
      const double sign = c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0);
      const double before = p[i];
      p[i] = p[i] * (1 - lr * wd) - lr * sign;
      path[i] += std::fabs(p[i] - before);
      m[i] = beta2 * m[i] + (1 - beta2) * g;
    }
    LionParams hp{.lr = lr, .beta1 = beta1, .beta2 = beta2, .weight_decay = wd};
    ASSERT_TRUE(lion_step(hp, d.p, fm, GradView{d.grads[s].data(), DType::kF32, kN}, {}, {.pool = &pool}).is_ok());
  }
  expect_close(d.p, p, path, "param");
}

// The update is lr * sign(c) on every path (the reference's vector path only applied the decay).
TEST(LionMath, EveryPathAppliesTheSign) {
  for (KernelIsa isa : {KernelIsa::kScalar, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    std::vector<float> p(37, 1.0f), m(37, 0.0f), g(37);
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = i % 3 == 0 ? 0.5f : (i % 3 == 1 ? -0.25f : 0.0f);
    const LionParams hp{.lr = 0.125, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.0};
    ASSERT_TRUE(lion_step(hp, p, m, GradView{g.data(), DType::kF32, g.size()}, {}, {.isa = isa}).is_ok());
    for (std::size_t i = 0; i < p.size(); ++i) {
      EXPECT_EQ(p[i], i % 3 == 0 ? 0.875f : (i % 3 == 1 ? 1.125f : 1.0f)) << isa_name(isa) << " " << i;
    }
  }
}

TEST(OptimizerChecks, RejectsBadArguments) {
  std::vector<float> p(8), m(8), v(8), g(8), short_v(7);
  const GradView grad{g.data(), DType::kF32, 8};
  EXPECT_EQ(adam_step({}, 0, p, m, v, grad).code(), ErrorCode::kInvalidArgument);  // steps count from 1
  EXPECT_EQ(adam_step({}, 1, p, m, short_v, grad).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(adam_step({}, 1, p, m, m, grad).code(), ErrorCode::kInvalidArgument);  // state overlaps state
  EXPECT_EQ(adam_step({}, 1, p, m, v, GradView{p.data(), DType::kF32, 8}).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(adam_step({}, 1, p, m, v, GradView{g.data(), DType::kF32, 7}).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(adam_step({}, 1, p, m, v, GradView{g.data(), DType::kF32, 8, 0.0}).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(adam_step({}, 1, p, m, v, grad, HalfCopy{g.data(), DType::kF32}).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(adam_step({.beta1 = 1.0}, 1, p, m, v, grad).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(lion_step({.lr = -1}, p, m, grad).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(adagrad_step({.eps = -1}, p, v, grad).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(adam_step({}, 1, {}, {}, {}, GradView{}).is_ok());  // empty is fine
}

TEST(OptimizerClass, DrivesEachKindThroughOneInterface) {
  ThreadPool pool(1);
  for (const char* type : {"Adam", "Adagrad", "Lion"}) {
    std::vector<float> p(64, 1.0f), a(64, 0.0f), b(64, 0.0f), g(64, 0.5f);
    Result<OptimizerConfig> cfg = OptimizerConfig::parse(type, {});
    ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
    const Optimizer opt(*cfg);
    std::vector<std::span<float>> state = {a, b};
    state.resize(opt.state_count());
    const Status st = opt.step({.step = 1, .lr = 0.01}, p, state, GradView{g.data(), DType::kF32, 64}, {}, {.pool = &pool});
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_LT(p[0], 1.0f) << type;  // a positive gradient moves the parameter down
    std::vector<std::span<float>> wrong(opt.state_count() + 1, std::span<float>(a));
    EXPECT_FALSE(opt.step({}, p, wrong, GradView{g.data(), DType::kF32, 64}).is_ok());
  }
}

}  // namespace
}  // namespace zinf::optim
