// Shared helpers for the swap tests: temp folders, reproducible tensor contents, aio handles.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "zinf/aio/handle.h"

namespace zinf::swap::testing {

// Per-test folders: the shared helper.
using TempDir = zinf::testing::TempDir;

// Byte `pos` of content version `seed`: neighbours differ, so shifted or mixed bytes are caught.
std::uint8_t pattern_byte(std::uint64_t pos, std::uint64_t seed);
void fill_pattern(std::byte* p, std::size_t n, std::uint64_t pos, std::uint64_t seed);
std::vector<std::byte> pattern(std::size_t n, std::uint64_t seed);
// Index of the first byte that differs from the pattern, or -1.
std::int64_t first_mismatch(const std::byte* p, std::size_t n, std::uint64_t pos, std::uint64_t seed);

// A rule that fails the next `count` read chunks (skipping `skip` first) with EIO.
aio::FaultRule fail_reads(std::uint64_t skip = 0, std::uint64_t count = 1);
aio::FaultRule fail_writes(std::uint64_t skip = 0, std::uint64_t count = 1);

// A handle with the defaults, small blocks and (optionally) a fault injector; fails the test on error.
std::unique_ptr<aio::Handle> make_handle(std::shared_ptr<aio::FaultInjector> faults = nullptr,
                                         std::size_t block_size = 64 << 10);

}  // namespace zinf::swap::testing
