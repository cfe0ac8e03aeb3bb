// Helpers for the swap tests.
#include "swap_test_util.h"

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>

#include <gtest/gtest.h>

namespace zinf::swap::testing {

std::uint8_t pattern_byte(std::uint64_t pos, std::uint64_t seed) {
  std::uint64_t x = (pos / 8) * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull + 1;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<std::uint8_t>((x >> (8 * (pos % 8))) + pos);
}

void fill_pattern(std::byte* p, std::size_t n, std::uint64_t pos, std::uint64_t seed) {
  for (std::size_t i = 0; i < n; ++i) p[i] = std::byte{pattern_byte(pos + i, seed)};
}

std::vector<std::byte> pattern(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> v(n);
  fill_pattern(v.data(), n, 0, seed);
  return v;
}

std::int64_t first_mismatch(const std::byte* p, std::size_t n, std::uint64_t pos, std::uint64_t seed) {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != std::byte{pattern_byte(pos + i, seed)}) return static_cast<std::int64_t>(i);
  }
  return -1;
}

aio::FaultRule fail_reads(std::uint64_t skip, std::uint64_t count) {
  aio::FaultRule r;
  r.action = aio::FaultAction::kFail;
  r.op = aio::FaultOp::kRead;
  r.skip = skip;
  r.count = count;
  return r;
}

aio::FaultRule fail_writes(std::uint64_t skip, std::uint64_t count) {
  aio::FaultRule r = fail_reads(skip, count);
  r.op = aio::FaultOp::kWrite;
  return r;
}

std::unique_ptr<aio::Handle> make_handle(std::shared_ptr<aio::FaultInjector> faults, std::size_t block_size) {
  aio::AioConfig config;
  config.block_size = block_size;
  config.queue_depth = 8;
  config.pin_threads = false;
  config.faults = std::move(faults);
  Result<std::unique_ptr<aio::Handle>> h = aio::Handle::create(config);
  if (!h.is_ok()) {
    ADD_FAILURE() << h.status().to_string();
    return nullptr;
  }
  return std::move(h).value();
}

}  // namespace zinf::swap::testing
