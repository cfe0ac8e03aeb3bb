// fp32 <-> bf16 / fp16: ties, NaN, infinities, subnormals, overflow; independent references;
// and the bulk (vector) conversions against the scalar definitions.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "zinf/optim/half.h"
#include "zinf/thread_pool.h"

namespace zinf::optim {
namespace {

float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x3F808000)), 0x3F80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x3F818000)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x3F808001)), 0x3F81);  // just above the tie
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x3F807FFF)), 0x3F80);  // just below
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0xBF818000)), 0xBF82);  // negative tie
}

TEST(Bf16, NanInfOverflowSubnormal) {
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::quiet_NaN()), 0x7FC0);
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x7F800001)), 0x7FC0);  // signalling NaN whose payload would round away
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0xFFFFFFFF)), 0x7FC0);  // negative NaN, all payload bits
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(f32_to_bf16_bits(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to inf
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x7F7F7FFF)), 0x7F7F);              // stays finite
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x00008000)), 0x0000);              // subnormal tie to even
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x00018000)), 0x0002);
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x80000001)), 0x8000);  // -tiny -> -0
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x007FFFFF)), 0x0080);  // largest subnormal rounds to the smallest normal
  EXPECT_EQ(bf16_bits_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(bf16_bits_to_f32(0x8001)), 0x80010000u);
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(0x7FC0)));
}

TEST(Fp16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_f16_bits(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_f16_bits(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie, even stays
  EXPECT_EQ(f32_to_f16_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie, odd rounds up
  EXPECT_EQ(f32_to_f16_bits(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_f16_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16_bits(65519.996f), 0x7BFF);
  EXPECT_EQ(f32_to_f16_bits(65520.0f), 0x7C00);  // tie to even rounds up to inf
  EXPECT_EQ(f32_to_f16_bits(-1e9f), 0xFC00);
  EXPECT_EQ(f32_to_f16_bits(std::numeric_limits<float>::infinity()), 0x7C00);
}

TEST(Fp16, SubnormalsAndNan) {
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: 0
  EXPECT_EQ(f32_to_f16_bits(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16_bits(3 * std::ldexp(1.0f, -25)), 0x0002);  // 1.5 units: tie to even 2
  EXPECT_EQ(f32_to_f16_bits(5 * std::ldexp(1.0f, -25)), 0x0002);  // 2.5 units: tie to even 2
  EXPECT_EQ(f32_to_f16_bits(-std::ldexp(1.0f, -20)), 0x8010);
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1023.0f, -24)), 0x03FF);  // largest subnormal
  EXPECT_EQ(f32_to_f16_bits(1e-45f), 0x0000);
  EXPECT_EQ(f32_to_f16_bits(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16_bits(std::numeric_limits<float>::quiet_NaN()), 0x7E00);
  EXPECT_EQ(f32_to_f16_bits(from_bits(0xFF800001)), 0xFE00);  // signalling NaN becomes quiet, sign kept
  EXPECT_EQ(f32_to_f16_bits(from_bits(0x7FA02000)), 0x7F01);  // top payload bits kept
  EXPECT_EQ(f16_bits_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_bits_to_f32(0x83FF), -std::ldexp(1023.0f, -24));
  EXPECT_EQ(f16_bits_to_f32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(std::bit_cast<std::uint32_t>(f16_bits_to_f32(0x7C01)), 0x7FC02000u);  // quietened
  EXPECT_EQ(std::bit_cast<std::uint32_t>(f16_bits_to_f32(0xFE00)), 0xFFC00000u);
}

// Every binary16 value widens to exactly the value its fields describe.
TEST(Fp16, WideningIsExactForEveryValue) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const std::uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0x1F) continue;
    double v = e == 0 ? std::ldexp(static_cast<double>(m), -24) : std::ldexp(1024.0 + m, static_cast<int>(e) - 25);
    if (h & 0x8000) v = -v;
    const float f = f16_bits_to_f32(static_cast<std::uint16_t>(h));
    ASSERT_EQ(static_cast<double>(f), v) << std::hex << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0);
    ASSERT_EQ(f32_to_f16_bits(f), h) << "round trip " << std::hex << h;  // narrowing an exact value is exact
  }
}

// An independent round-to-nearest-even: pick the nearer of the two neighbours, the even one on a tie.
std::uint16_t nearest_even_bf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t lo = static_cast<std::uint16_t>(x >> 16);
  const std::uint16_t hi = static_cast<std::uint16_t>(lo + 1);
  const double dl = std::fabs(static_cast<double>(f) - bf16_bits_to_f32(lo));
  const double dh = std::fabs(static_cast<double>(bf16_bits_to_f32(hi)) - f);
  if ((hi & 0x7FFF) == 0x7F80) {  // the upper neighbour is inf: compare with 2^128 instead
    const double up = std::ldexp(1.0, 128) - std::fabs(static_cast<double>(f));
    return dl < up || (dl == up && (lo & 1) == 0) ? lo : hi;
  }
  return dl < dh || (dl == dh && (lo & 1) == 0) ? lo : hi;
}

TEST(Bf16, AgreesWithIndependentRounding) {
  std::mt19937 rng(1);
  for (int i = 0; i < 2'000'000; ++i) {
    const float f = from_bits(rng());
    if (std::isnan(f) || std::isinf(f)) continue;
    ASSERT_EQ(f32_to_bf16_bits(f), nearest_even_bf16(f)) << std::hexfloat << f;
  }
}

#ifdef __FLT16_MAX__
// The compiler's _Float16 conversion (libgcc, round to nearest even) as the independent reference.
TEST(Fp16, AgreesWithCompilerFloat16) {
  std::mt19937 rng(2);
  for (int i = 0; i < 2'000'000; ++i) {
    // Half the samples near the binary16 range, where rounding is interesting.
    std::uint32_t bits = rng();
    if (i % 2 == 0) bits = (bits & 0x80FFFFFFu) | ((0x30u + (bits >> 27) % 0x18u) << 24);
    const float f = from_bits(bits);
    if (std::isnan(f)) continue;
    const _Float16 h = static_cast<_Float16>(f);
    ASSERT_EQ(f32_to_f16_bits(f), std::bit_cast<std::uint16_t>(h)) << std::hexfloat << f;
  }
}
#endif

// Bulk conversions on every path equal the scalar definitions, for every bit pattern class.
TEST(BulkConversion, EveryPathMatchesScalar) {
  ThreadPool pool(3);
  std::mt19937 rng(3);
  const std::size_t n = 100'003;
  std::vector<float> src(n);
  for (float& f : src) f = from_bits(rng());
  std::vector<std::uint16_t> halves(0x10000);
  for (std::uint32_t h = 0; h < 0x10000; ++h) halves[h] = static_cast<std::uint16_t>(h);
  for (KernelIsa isa : {KernelIsa::kScalar, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    const ExecOptions exec{.pool = &pool, .isa = isa, .min_elements_per_thread = 1000};
    for (DType dt : {DType::kBF16, DType::kF16}) {
      for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{33}, n - 1}) {
        std::vector<std::uint16_t> out(len + 1, 0xABCD);
        ASSERT_TRUE(convert_from_f32(std::span(src).subspan(1, len), out.data(), dt, exec).is_ok());
        for (std::size_t i = 0; i < len; ++i) {
          const std::uint16_t want = dt == DType::kBF16 ? f32_to_bf16_bits(src[i + 1]) : f32_to_f16_bits(src[i + 1]);
          ASSERT_EQ(out[i], want) << isa_name(isa) << " " << dtype_name(dt) << " " << std::hex << src[i + 1];
        }
        EXPECT_EQ(out[len], 0xABCD) << "wrote past the end";
      }
      std::vector<float> wide(halves.size() - 1);
      ASSERT_TRUE(convert_to_f32(halves.data() + 1, dt, wide, exec).is_ok());
      for (std::size_t i = 0; i < wide.size(); ++i) {
        const std::uint16_t h = halves[i + 1];
        const float want = dt == DType::kBF16 ? bf16_bits_to_f32(h) : f16_bits_to_f32(h);
        ASSERT_EQ(std::bit_cast<std::uint32_t>(wide[i]), std::bit_cast<std::uint32_t>(want))
            << isa_name(isa) << " " << dtype_name(dt) << " " << std::hex << h;
      }
    }
  }
}

// In place: the first 2n bytes end up as convert_from_f32 would write them, for lengths around
// the small head and the doubling ranges' ends, on every path.
TEST(BulkConversion, NarrowingInPlaceMatchesTheOutOfPlaceConversion) {
  ThreadPool pool(3);
  std::mt19937 rng(5);
  for (KernelIsa isa : {KernelIsa::kScalar, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    const ExecOptions exec{.pool = &pool, .isa = isa, .min_elements_per_thread = 1000};
    for (DType dt : {DType::kBF16, DType::kF16}) {
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{16383}, std::size_t{16384}, std::size_t{16385},
                            std::size_t{32769}, std::size_t{200'003}}) {
        std::vector<float> src(n + 1);
        for (float& f : src) f = from_bits(rng());
        std::vector<std::uint16_t> want(n);
        ASSERT_TRUE(convert_from_f32(std::span(src).first(n), want.data(), dt, exec).is_ok());
        std::vector<float> data = src;
        ASSERT_TRUE(narrow_f32_in_place(data.data(), n, dt, exec).is_ok());
        if (n > 0) {  // want.data() is null for n = 0, which memcmp may not be given
          ASSERT_EQ(std::memcmp(data.data(), want.data(), n * sizeof(std::uint16_t)), 0)
              << isa_name(isa) << " " << dtype_name(dt) << " n " << n;
        }
        // Bytes [2n, 4n + 4) are not written: they still hold the input's.
        const auto* got = reinterpret_cast<const unsigned char*>(data.data());
        const auto* was = reinterpret_cast<const unsigned char*>(src.data());
        EXPECT_EQ(std::memcmp(got + 2 * n, was + 2 * n, 2 * n + sizeof(float)), 0) << "wrote past the 16-bit values";
      }
    }
  }
  float f = 1.0f;
  EXPECT_EQ(narrow_f32_in_place(&f, 1, DType::kF32).code(), ErrorCode::kInvalidArgument);
}

TEST(BulkConversion, RejectsMisalignedBuffers) {
  std::vector<float> src(8);
  std::vector<std::uint16_t> dst(9);
  const Status st = convert_from_f32(src, reinterpret_cast<char*>(dst.data()) + 1, DType::kBF16);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace zinf::optim
