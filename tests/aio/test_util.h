// Shared helpers for the aio tests: per-test temp folders, position-dependent data, child runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "zinf/aio/handle.h"

namespace zinf::aio::testing {

// Per-test folders: the shared helper.
using TempDir = zinf::testing::TempDir;
using zinf::testing::drop_to_nobody;
using zinf::testing::temp_dir_nobody_can_reach;

// The byte that position `pos` of a file written with `seed` holds: every position differs
// from its neighbours, so shifted, dropped or duplicated bytes are caught.
std::uint8_t pattern_byte(std::uint64_t pos, std::uint32_t seed);
void fill_pattern(std::byte* p, std::size_t n, std::uint64_t file_pos, std::uint32_t seed);
// Index of the first byte of [p, p+n) that differs from the pattern, or -1.
std::int64_t first_mismatch(const std::byte* p, std::size_t n, std::uint64_t file_pos, std::uint32_t seed);

// Plain (buffered, libc) file access, independent of the engine under test.
void write_plain(const std::string& path, const std::vector<std::byte>& data);
std::vector<std::byte> read_plain(const std::string& path);

// Memory with guard bytes around a `size`-byte window that starts `misalign` bytes past a
// 4096-aligned address. guards_intact() says whether anything wrote outside the window.
class GuardedBuffer {
 public:
  GuardedBuffer(std::size_t size, std::size_t misalign);
  std::byte* data() { return storage_.data() + start_; }
  std::size_t size() const { return size_; }
  bool guards_intact() const;

 private:
  static constexpr std::size_t kGuard = 8192;
  std::vector<std::byte> storage_;
  std::size_t start_ = 0;
  std::size_t size_ = 0;
};

// Runs `body` in a forked child (single-threaded, so it may setuid or unshare) and returns
// what it returned ("OK", "SKIP: why" or a failure description), or how the child died.
std::string run_in_child(const std::function<std::string()>& body);

// Backends this build has, for parameterised tests (skipped at run time when the kernel lacks one).
std::vector<Backend> all_backends();

}  // namespace zinf::aio::testing
