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
