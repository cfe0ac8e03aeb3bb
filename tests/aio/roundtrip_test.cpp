// Byte-exact write/read round trips for every backend x submit mode x event mode x parallelism.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "test_util.h"
#include "zinf/aio/handle.h"

namespace zinf::aio {
namespace {

using testing::first_mismatch;
using testing::fill_pattern;
using testing::GuardedBuffer;
using testing::read_plain;
using testing::TempDir;
using testing::write_plain;

constexpr std::uint32_t kSeed = 11;
constexpr std::uint32_t kBackgroundSeed = 29;

// Where the request sits: file offset and how far the caller's buffer is from 4096 alignment.
struct Layout {
  std::uint64_t offset;
  std::size_t misalign;
  const char* name;
};
constexpr Layout kLayouts[] = {
    {0, 0, "aligned"},
    {5 * 4096 + 777, 0, "unaligned offset"},
    {3 * 4096, 1, "unaligned buffer"},
    {2 * 4096 + 100, 100, "same misalignment"},
    {4096 + 4000, 17, "both unaligned"},
};
constexpr std::size_t kSizes[] = {0, 1, 511, 4095, 4097, (1u << 20) + 3};

// Writes [offset, offset+n) of a file that already holds other data, checks the neighbours
// and the size with plain I/O, then reads the range back through the engine.
void round_trip(Handle& handle, const std::string& path, std::size_t n, const Layout& layout) {
  SCOPED_TRACE(fmt::format("{} bytes, {} (offset {}, buffer +{})", n, layout.name, layout.offset, layout.misalign));
  const std::size_t file_size = layout.offset + n + 5000;
  std::vector<std::byte> background(file_size);
  fill_pattern(background.data(), file_size, 0, kBackgroundSeed);
  write_plain(path, background);

  GuardedBuffer out(n, layout.misalign);
  fill_pattern(out.data(), n, layout.offset, kSeed);
  ASSERT_TRUE(handle.sync_pwrite(out.data(), n, path, layout.offset).is_ok());

  const std::vector<std::byte> file = read_plain(path);
  ASSERT_EQ(file.size(), file_size);
  EXPECT_EQ(first_mismatch(file.data(), layout.offset, 0, kBackgroundSeed), -1) << "bytes before the range changed";
  EXPECT_EQ(first_mismatch(file.data() + layout.offset, n, layout.offset, kSeed), -1) << "written range differs";
  const std::uint64_t after = layout.offset + n;
  EXPECT_EQ(first_mismatch(file.data() + after, file_size - after, after, kBackgroundSeed), -1)
      << "bytes after the range changed";

  GuardedBuffer in(n, layout.misalign);
  ASSERT_TRUE(handle.sync_pread(in.data(), n, path, layout.offset).is_ok());
  EXPECT_EQ(first_mismatch(in.data(), n, layout.offset, kSeed), -1) << "read back differs";
  EXPECT_TRUE(in.guards_intact()) << "read wrote outside the caller's buffer";
}

// A write to a new file leaves it exactly offset+n bytes long (no rounding to blocks).
void fresh_file(Handle& handle, const std::string& path, std::size_t n, const Layout& layout) {
  SCOPED_TRACE(fmt::format("fresh file, {} bytes, {}", n, layout.name));
  GuardedBuffer out(n, layout.misalign);
  fill_pattern(out.data(), n, layout.offset, kSeed);
  ASSERT_TRUE(handle.sync_pwrite(out.data(), n, path, layout.offset, WriteOptions{.truncate = true}).is_ok());
  const std::vector<std::byte> file = read_plain(path);
  ASSERT_EQ(file.size(), n == 0 ? 0 : layout.offset + n);
  if (n > 0) {
    EXPECT_EQ(first_mismatch(file.data() + layout.offset, n, layout.offset, kSeed), -1);
  }
}

using Combo = std::tuple<Backend, bool, bool, std::size_t>;  // backend, single_submit, overlap, parallelism

class RoundTripTest : public ::testing::TestWithParam<Combo> {
 protected:
  void SetUp() override {
    const auto [backend, single_submit, overlap, parallelism] = GetParam();
    if (!backend_available(backend)) GTEST_SKIP() << backend_name(backend) << " is not available here";
    config_.backend = backend;
    config_.single_submit = single_submit;
    config_.overlap_events = overlap;
    config_.intra_op_parallelism = parallelism;
    config_.block_size = 64 * 1024;  // many chunks per request
    config_.queue_depth = 4;
    auto handle = Handle::create(config_);
    ASSERT_TRUE(handle.is_ok()) << handle.status().to_string();
    handle_ = std::move(handle).value();
  }

  AioConfig config_;
  std::unique_ptr<Handle> handle_;
  TempDir dir_;
};

TEST_P(RoundTripTest, ByteExactAtEveryLayout) {
  ASSERT_EQ(handle_->backend(), config_.backend);
  for (const Layout& layout : kLayouts) {
    for (std::size_t n : kSizes) {
      round_trip(*handle_, dir_.file("data"), n, layout);
      // File sizes after writes to a new file: the interesting layouts are enough.
      if (layout.offset % 4096 != 0 && (n == 0 || n % 4096 != 0)) fresh_file(*handle_, dir_.file("fresh"), n, layout);
    }
  }
}

// 64 MiB runs on one combination per backend to keep the suite fast.
class BigRoundTripTest : public RoundTripTest {};

TEST_P(BigRoundTripTest, SixtyFourMiB) { round_trip(*handle_, dir_.file("big"), 64u << 20, kLayouts[3]); }

std::string combo_name(const ::testing::TestParamInfo<Combo>& info) {
  const auto [backend, single_submit, overlap, parallelism] = info.param;
  return fmt::format("{}_{}_{}_p{}", backend_name(backend), single_submit ? "single" : "batch",
                     overlap ? "overlap" : "sequential", parallelism);
}

INSTANTIATE_TEST_SUITE_P(AllModes, RoundTripTest,
                         ::testing::Combine(::testing::ValuesIn(testing::all_backends()), ::testing::Bool(),
                                            ::testing::Bool(), ::testing::Values<std::size_t>(1, 2, 3, 8)),
                         combo_name);

INSTANTIATE_TEST_SUITE_P(Big, BigRoundTripTest,
                         ::testing::Values(Combo{Backend::kIoUring, false, true, 8},
                                           Combo{Backend::kLibaio, false, false, 3},
                                           Combo{Backend::kThreads, true, true, 2}),
                         combo_name);

// Direct vs buffered I/O and registered (fixed) vs plain buffers, path- and fd-based.
using ModeCombo = std::tuple<Backend, bool, bool>;  // backend, use_direct_io, register buffers

class ModesTest : public ::testing::TestWithParam<ModeCombo> {};

TEST_P(ModesTest, PathAndFdRoundTrips) {
  const auto [backend, direct, fixed] = GetParam();
  if (!backend_available(backend)) GTEST_SKIP() << backend_name(backend) << " is not available here";
  AioConfig config;
  config.backend = backend;
  config.use_direct_io = direct;
  config.intra_op_parallelism = 2;
  config.block_size = 128 * 1024;
  auto created = Handle::create(config);
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  Handle& handle = *created.value();
  TempDir dir;
  // One arena for both directions, registered when asked; some requests straddle its end.
  const std::size_t arena_bytes = 4u << 20;
  GuardedBuffer arena(2 * arena_bytes, 0);
  if (fixed) {
    ASSERT_TRUE(handle.register_buffer(arena.data(), arena_bytes).is_ok());
  }
  for (const Layout& layout : kLayouts) {
    const HandleStats before = handle.stats();
    for (std::size_t n : {std::size_t{4097}, std::size_t{(3u << 20) + 5}}) {
      round_trip(handle, dir.file("path"), n, layout);
      // fd-based: the caller opens the file, O_DIRECT or not.
      const std::string path = dir.file("fd");
      const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | (direct ? O_DIRECT : 0), 0644);
      ASSERT_GE(fd, 0);
      std::byte* buf = arena.data() + layout.misalign + (arena_bytes - 2 * n / 3) / 4096 * 4096;
      fill_pattern(buf, n, layout.offset, kSeed);
      Status st = handle.sync_pwrite(buf, n, fd, layout.offset);
      EXPECT_TRUE(st.is_ok()) << st.to_string();
      std::memset(buf, 0, n);
      st = handle.sync_pread(buf, n, fd, layout.offset);
      EXPECT_TRUE(st.is_ok()) << st.to_string();
      EXPECT_EQ(first_mismatch(buf, n, layout.offset, kSeed), -1) << layout.name << " " << n;
      ::close(fd);
    }
    // The paths the layout should take were taken: bounce buffers for memory misaligned
    // relative to the file offset, buffered edges for unaligned ends, fixed ops when registered.
    const HandleStats after = handle.stats();
    const bool bounce = direct && layout.offset % 4096 != layout.misalign;
    const bool edges = direct;  // both sizes end unaligned
    EXPECT_EQ(after.bounced_bytes > before.bounced_bytes, bounce) << layout.name;
    EXPECT_EQ(after.edge_ops > before.edge_ops, edges) << layout.name;
    // Fixed ops need the op's memory inside the arena: bounced chunks never qualify, and with
    // an aligned offset and bounced middle the only edge (the tail) lies past the arena.
    const bool fixed_expected = fixed && backend == Backend::kIoUring && (!bounce || layout.offset % 4096 != 0);
    EXPECT_EQ(after.fixed_ops > before.fixed_ops, fixed_expected) << layout.name;
    EXPECT_GT(after.ops, before.ops);
    EXPECT_EQ(after.requests, before.requests + 2 * 2 * 2) << layout.name;
  }
  EXPECT_TRUE(arena.guards_intact());
  if (fixed) {
    EXPECT_TRUE(handle.unregister_buffers().is_ok());
  }
}

std::string mode_name(const ::testing::TestParamInfo<ModeCombo>& info) {
  const auto [backend, direct, fixed] = info.param;
  return fmt::format("{}_{}_{}", backend_name(backend), direct ? "direct" : "buffered", fixed ? "fixed" : "plain");
}

INSTANTIATE_TEST_SUITE_P(DirectBufferedFixed, ModesTest,
                         ::testing::Combine(::testing::ValuesIn(testing::all_backends()), ::testing::Bool(),
                                            ::testing::Bool()),
                         mode_name);

}  // namespace
}  // namespace zinf::aio
