// Tests for the checksum helper: the XXH3-64 reference value, streaming equals one-shot.
#include "common/checksum.h"

#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace zinf {
namespace {

TEST(Checksum64, MatchesTheXxh3ReferenceValue) {
  // XXH3_64bits("", 0) with seed 0, from the xxHash specification's test vectors.
  EXPECT_EQ(checksum64("", 0), 0x2D06800538D394C2ull);
  Checksum64 empty;
  EXPECT_EQ(empty.value(), 0x2D06800538D394C2ull);
}

TEST(Checksum64, StreamingEqualsOneShotHoweverTheBytesAreCut) {
  std::mt19937_64 rng(7);
  std::vector<unsigned char> data(3 << 20);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  const std::uint64_t whole = checksum64(data.data(), data.size());
  for (std::size_t piece : {1u, 7u, 64u, 4096u, 65537u, 1u << 20}) {
    Checksum64 s;
    for (std::size_t at = 0; at < data.size(); at += piece) s.add(data.data() + at, std::min(piece, data.size() - at));
    EXPECT_EQ(s.value(), whole) << "pieces of " << piece;
  }
  Checksum64 s;
  s.add(data.data(), 10);
  s.reset();
  s.add(data.data(), data.size());
  EXPECT_EQ(s.value(), whole);
}

TEST(Checksum64, OneFlippedBitChangesTheValue) {
  std::vector<unsigned char> page(4096, 0);
  const std::uint64_t zero = checksum64(page.data(), page.size());
  for (std::size_t bit : {0u, 1000u, 4096u * 8 - 1}) {
    page[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    EXPECT_NE(checksum64(page.data(), page.size()), zero) << "bit " << bit;
    page[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  }
}

}  // namespace
}  // namespace zinf
