// Parameter initialisation: deterministic per element, shardable, GPT-2 statistics, golden bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "model/rng.h"
#include "model_test_util.h"
#include "zinf/model/gpt.h"
#include "zinf/thread_pool.h"

namespace zinf::model {
namespace {

TEST(InitTest, PortableLogMatchesLibm) {
  double worst = 0.0;
  for (uint64_t i = 1; i < 20000; i++) {
    const double x = detail::unit_double(detail::splitmix64(i)) + 1e-300;
    const double a = detail::portable_log(x), b = std::log(x);
    worst = std::max(worst, std::fabs(a - b) / std::max(1.0, std::fabs(b)));
  }
  for (double x : {1.0, 0.5, 2.0, 1e-30, 0.7071067811865476, 0.9999999}) {
    worst = std::max(worst, std::fabs(detail::portable_log(x) - std::log(x)) /
                                std::max(1.0, std::fabs(std::log(x))));
  }
  EXPECT_LT(worst, 1e-15);
  EXPECT_EQ(detail::portable_log(1.0), 0.0);
}

TEST(InitTest, ElementDependsOnlyOnSeedParamAndIndex) {
  GptModel model = testing::make_gpt(testing::must(gpt_preset("tiny", 256)));
  const ParamSpec& w = model.params()[2 + 2];  // h.0.attn.c_attn.weight
  ASSERT_EQ(w.name, "h.0.attn.c_attn.weight");
  std::vector<float> whole(w.numel);
  init_param(w, 42, whole, 0);
  // Any chunking gives the same bits.
  for (size_t chunk : {1ul, 7ul, 1000ul}) {
    std::vector<float> pieces(w.numel);
    for (size_t off = 0; off < w.numel; off += chunk) {
      const size_t n = std::min(chunk, w.numel - off);
      init_param(w, 42, std::span<float>(pieces).subspan(off, n), off);
    }
    EXPECT_EQ(std::memcmp(whole.data(), pieces.data(), whole.size() * sizeof(float)), 0);
  }
  std::vector<float> other_seed(w.numel);
  init_param(w, 43, other_seed, 0);
  EXPECT_NE(whole, other_seed);
  // Same shape, another parameter index: different values.
  ParamSpec moved = w;
  moved.index += 12;
  std::vector<float> other_param(w.numel);
  init_param(moved, 42, other_param, 0);
  EXPECT_NE(whole, other_param);
}

// Spans longer than one chunk are filled on the default pool: the same bits as element by
// element, at an offset, and when called from a task of that pool (then run inline).
TEST(InitTest, ThreadedFillMatchesElementByElement) {
  GptModel model = testing::make_gpt(testing::must(gpt_preset("tiny", 256)));
  ParamSpec big = model.params()[2 + 2];
  big.numel = 5 * (size_t{1} << 16) + 1234;
  const size_t offset = 777;
  std::vector<float> threaded(big.numel - offset);
  init_param(big, 9, threaded, offset);
  std::vector<float> single(threaded.size());
  for (size_t i = 0; i < single.size(); ++i) init_param(big, 9, std::span<float>(single).subspan(i, 1), offset + i);
  EXPECT_EQ(std::memcmp(threaded.data(), single.data(), single.size() * sizeof(float)), 0);
  std::vector<float> nested(threaded.size());
  default_thread_pool().run(1, [&](size_t) { init_param(big, 9, nested, offset); });
  default_thread_pool().run(2, [&](size_t t) {
    if (t == 1) init_param(big, 9, nested, offset);
  });
  EXPECT_EQ(std::memcmp(threaded.data(), nested.data(), nested.size() * sizeof(float)), 0);
}

// The AVX2 fill (four lanes, rejected lanes redone one at a time) gives the scalar fill's bits:
// several keys, scales, offsets (one past 2^32, where the 64-bit lane arithmetic carries) and
// lengths that are not multiples of 4. On a machine without AVX2 both are the scalar path.
TEST(InitTest, VectorFillMatchesScalarBits) {
  for (const uint64_t param_key : {0ull, 1ull, 0x67707432ull, 0xfedcba9876543210ull}) {
    for (const double std_dev : {0.02, 1.0, 0.0028867513459481291}) {
      for (const size_t first : {size_t{0}, size_t{13}, (size_t{1} << 32) - 7}) {
        std::vector<float> vec(100003), ref(vec.size());
        detail::fill_normal(param_key, std_dev, first, vec, /*vector=*/true);
        detail::fill_normal(param_key, std_dev, first, ref, /*vector=*/false);
        ASSERT_EQ(std::memcmp(vec.data(), ref.data(), vec.size() * sizeof(float)), 0)
            << "key " << param_key << " std " << std_dev << " first " << first;
      }
    }
  }
}

#if defined(__x86_64__)
// The AVX2 parts at double precision, where the float outputs above would hide a last-bit
// difference: portable_log over (0, 1) (random mantissas and exponents down to 2^-104, the least
// s can be, and both sides of the sqrt(1/2) split) and the first-pair normals of 400,000 keys.
TEST(InitTest, VectorPartsMatchScalarBitsInDouble) {
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "no AVX2 on this CPU: only the scalar path runs";
  uint64_t state = 12345;
  size_t compared = 0, rejected_lanes = 0;
  for (int round = 0; round < 100000; ++round) {
    double x[4], got[4];
    for (double& v : x) {
      state = detail::splitmix64(state);
      const int exponent = -1 - static_cast<int>(state % 104);
      v = std::ldexp(1.0 + detail::unit_double(detail::splitmix64(state + 1)), exponent);
      if (v >= 1.0) v = 0.70710678118654752440;
    }
    detail::portable_log_avx2(x, got);
    for (int l = 0; l < 4; ++l) {
      const double want = detail::portable_log(x[l]);
      ASSERT_EQ(std::memcmp(&got[l], &want, sizeof(double)), 0) << "x " << x[l];
    }
    uint64_t keys[4];
    for (uint64_t& k : keys) k = state = detail::splitmix64(state);
    double normals[4];
    const int rejected = detail::normals_avx2(keys, normals);
    for (int l = 0; l < 4; ++l) {
      if ((rejected >> l) & 1) {
        ++rejected_lanes;
        continue;
      }
      const double want = detail::normal_from_key(keys[l]);
      ASSERT_EQ(std::memcmp(&normals[l], &want, sizeof(double)), 0) << "key " << keys[l];
      ++compared;
    }
  }
  // About 1 - pi/4 of the lanes are rejected (and redone one at a time by fill_normal).
  EXPECT_GT(rejected_lanes, 400000u / 6);
  EXPECT_LT(rejected_lanes, 400000u / 4);
  EXPECT_EQ(compared + rejected_lanes, 400000u);
}
#endif

TEST(InitTest, Gpt2Statistics) {
  GptModel model = testing::make_gpt(testing::must(gpt_preset("mini", 256)));
  for (const ParamSpec& p : model.params()) {
    std::vector<float> v(p.numel);
    init_param(p, 1, v, 0);
    double sum = 0.0, sq = 0.0;
    for (float x : v) {
      sum += x;
      sq += static_cast<double>(x) * x;
    }
    const double mean = sum / v.size(), sd = std::sqrt(sq / v.size() - mean * mean);
    if (p.init == ParamInit::kOnes) {
      EXPECT_EQ(sum, static_cast<double>(v.size())) << p.name;
    } else if (p.init == ParamInit::kZeros) {
      EXPECT_EQ(sq, 0.0) << p.name;
    } else {
      const double expect_sd = p.name.find("c_proj") != std::string::npos
                                   ? 0.02 / std::sqrt(2.0 * model.config().n_layer)
                                   : (p.name == "wpe.weight" ? 0.01 : 0.02);
      EXPECT_FLOAT_EQ(p.init_std, static_cast<float>(expect_sd)) << p.name;
      EXPECT_NEAR(sd, expect_sd, 0.02 * expect_sd + 3 * expect_sd / std::sqrt(v.size())) << p.name;
      EXPECT_NEAR(mean, 0.0, 5 * expect_sd / std::sqrt(v.size())) << p.name;
    }
  }
}

// Pinned bits: initialisation uses only integer hashing and IEEE-exact double arithmetic, so
// these values hold on every machine and compiler. If this fails, checkpoints made from a seed
// no longer reproduce.
TEST(InitTest, GoldenValues) {
  GptModel model = testing::make_gpt(testing::must(gpt_preset("tiny", 256)));
  std::vector<float> v(4);
  init_param(model.params()[0], 1234, v, 1000);
  uint32_t bits[4];
  std::memcpy(bits, v.data(), sizeof(bits));
  std::printf("golden: 0x%08x 0x%08x 0x%08x 0x%08x (%g %g %g %g)\n", bits[0], bits[1], bits[2],
              bits[3], v[0], v[1], v[2], v[3]);
  const uint32_t expected[4] = {0xbc52477b, 0x3c1d1470, 0xbd0aed13, 0x3c7cc620};
  for (int i = 0; i < 4; i++) EXPECT_EQ(bits[i], expected[i]) << i;
}

}  // namespace
}  // namespace zinf::model
