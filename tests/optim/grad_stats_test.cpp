// The fused overflow check and squared norm: same bits on every path and thread count, close
// to a plain double sum, overflow found wherever it is, and the clipping formula.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "test_util.h"
#include "zinf/optim/clipping.h"
#include "zinf/optim/grad_stats.h"
#include "zinf/thread_pool.h"

namespace zinf::optim {
namespace {

using testing::Buffer;

double norm_on(const Buffer& b, DType dt, std::size_t n, const ExecOptions& exec) {
  Result<GradStats> r = grad_stats(GradView{b.data(), dt, n}, exec);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? r->sq_norm : -1.0;
}

TEST(GradStats, EveryPathAndThreadCountGivesTheSameBits) {
  ThreadPool one(1), three(3);
  std::mt19937 rng(7);
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n <= 300; ++n) lengths.push_back(n);
  lengths.push_back(8192);
  lengths.push_back(3 * 8192 + 17);
  lengths.push_back(100'001);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (std::size_t n : lengths) {
      Buffer b(n, dtype_size(dt), n % 16);
      testing::fill(b.data(), dt, n, rng, 3.0f);
      const double want = norm_on(b, dt, n, {.pool = &one, .isa = KernelIsa::kScalar});
      for (KernelIsa isa : {KernelIsa::kScalar, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
        if (!isa_supported(isa)) continue;
        const double one_thread = norm_on(b, dt, n, {.pool = &one, .isa = isa});
        const double threaded = norm_on(b, dt, n, {.pool = &three, .isa = isa, .min_elements_per_thread = 16});
        ASSERT_EQ(std::memcmp(&one_thread, &want, 8), 0) << isa_name(isa) << " " << dtype_name(dt) << " n " << n;
        ASSERT_EQ(std::memcmp(&threaded, &want, 8), 0) << isa_name(isa) << " threaded " << dtype_name(dt) << " n " << n;
      }
    }
  }
}

TEST(GradStats, AgreesWithAPlainDoubleSum) {
  std::mt19937 rng(8);
  const std::size_t n = 54'321;
  std::vector<float> g(n);
  testing::fill(g.data(), DType::kF32, n, rng, 10.0f);
  long double want = 0;
  for (float x : g) want += static_cast<long double>(x) * x;
  Result<GradStats> r = grad_stats(GradView{g.data(), DType::kF32, n});
  ASSERT_TRUE(r.is_ok());
  EXPECT_NEAR(r->sq_norm, static_cast<double>(want), 1e-12 * static_cast<double>(want));
  EXPECT_TRUE(r->finite());
  EXPECT_EQ(r->elements, n);
}

TEST(GradStats, FindsInfAndNanAnywhere) {
  ThreadPool three(3);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::size_t n = 2 * 8192 + 45;
  for (KernelIsa isa : {KernelIsa::kScalar, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    const ExecOptions exec{.pool = &three, .isa = isa, .min_elements_per_thread = 64};
    for (std::size_t pos : {std::size_t{0}, std::size_t{15}, std::size_t{8191}, std::size_t{8200}, n - 1}) {
      for (float bad : {inf, -inf, nan}) {
        std::vector<float> f(n, 0.25f);
        f[pos] = bad;
        Result<GradStats> r32 = grad_stats(GradView{f.data(), DType::kF32, n}, exec);
        ASSERT_TRUE(r32.is_ok());
        EXPECT_FALSE(r32->finite()) << isa_name(isa) << " pos " << pos << " " << bad;
        for (DType dt : {DType::kBF16, DType::kF16}) {
          std::vector<std::uint16_t> h(n);
          ASSERT_TRUE(convert_from_f32(f, h.data(), dt, exec).is_ok());
          Result<GradStats> r16 = grad_stats(GradView{h.data(), dt, n}, exec);
          ASSERT_TRUE(r16.is_ok());
          EXPECT_FALSE(r16->finite()) << isa_name(isa) << " " << dtype_name(dt) << " pos " << pos;
        }
      }
    }
  }
  // The largest finite values do not overflow the double sum.
  std::vector<float> big(1000, std::numeric_limits<float>::max());
  Result<GradStats> r = grad_stats(GradView{big.data(), DType::kF32, big.size()});
  ASSERT_TRUE(r.is_ok());
  EXPECT_TRUE(r->finite());
}

TEST(GradStats, SumsOfSpansFoldInOrder) {
  GradStats a{4.0, 2}, b{9.0, 3};
  a += b;
  EXPECT_EQ(a.sq_norm, 13.0);
  EXPECT_EQ(a.elements, 5u);
}

TEST(Clipping, ReferenceFormula) {
  // Stored grads have norm 2^16 * 3 at loss scale 2^16: unscaled norm 3 > max_norm 1.
  ClipResult r = clip_gradients(3.0 * 65536.0, 65536.0, 1.0);
  EXPECT_TRUE(r.clipped);
  EXPECT_DOUBLE_EQ(r.norm, 3.0);
  const double clip = (3.0 + 1e-6) / 1.0;
  EXPECT_DOUBLE_EQ(r.grad_scale, 1.0 / (clip * 65536.0));
  // Under the threshold: only unscaling.
  r = clip_gradients(0.5 * 1024.0, 1024.0, 1.0);
  EXPECT_FALSE(r.clipped);
  EXPECT_DOUBLE_EQ(r.grad_scale, 1.0 / 1024.0);
  // Clipping off.
  r = clip_gradients(1e9, 2.0, 0.0);
  EXPECT_FALSE(r.clipped);
  EXPECT_DOUBLE_EQ(r.grad_scale, 0.5);
  // Exactly at max_norm the 1e-6 tips it over: clip = 1 + 1e-6.
  r = clip_gradients(1.0, 1.0, 1.0);
  EXPECT_TRUE(r.clipped);
  EXPECT_DOUBLE_EQ(r.grad_scale, 1.0 / (1.0 + 1e-6));
}

}  // namespace
}  // namespace zinf::optim
