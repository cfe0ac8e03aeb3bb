// AioConfig validation, backend names and selection, and Handle argument checks.
#include <fcntl.h>
#include <unistd.h>

#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "test_util.h"
#include "zinf/aio/handle.h"
#include "zinf/log.h"

namespace zinf::aio {
namespace {

using testing::TempDir;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(AioConfigTest, DefaultsMatchTheReference) {
  AioConfig config;
  EXPECT_EQ(config.block_size, 1048576u);
  EXPECT_EQ(config.queue_depth, 8u);
  EXPECT_EQ(config.intra_op_parallelism, 1u);
  EXPECT_FALSE(config.single_submit);
  EXPECT_TRUE(config.overlap_events);
  EXPECT_TRUE(config.validate().is_ok());
}

TEST(AioConfigTest, BadValuesNameTheKey) {
  struct Case {
    AioConfig config;
    std::string key;
  };
  std::vector<Case> cases;
  for (std::size_t bad : {std::size_t{0}, std::size_t{100}, std::size_t{512}, std::size_t{4097}, std::size_t{2} << 30}) {
    AioConfig c;
    c.block_size = bad;
    cases.push_back({c, "aio.block_size = " + std::to_string(bad)});
  }
  for (std::size_t bad : {std::size_t{0}, std::size_t{1025}}) {
    AioConfig c;
    c.queue_depth = bad;
    cases.push_back({c, "aio.queue_depth = " + std::to_string(bad)});
  }
  for (std::size_t bad : {std::size_t{0}, std::size_t{65}}) {
    AioConfig c;
    c.intra_op_parallelism = bad;
    cases.push_back({c, "aio.intra_op_parallelism = " + std::to_string(bad)});
  }
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    AioConfig c;
    c.request_timeout_s = bad;
    cases.push_back({c, "aio.request_timeout_s = " + fmt::format("{}", bad)});
  }
  for (const Case& c : cases) {
    const Status st = c.config.validate();
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << c.key;
    EXPECT_TRUE(contains(st.message(), c.key)) << st.message();
    auto handle = Handle::create(c.config);
    EXPECT_FALSE(handle.is_ok()) << c.key;
  }
}

TEST(AioConfigTest, EdgeValuesAreAccepted) {
  AioConfig config;
  config.block_size = 4096;
  config.queue_depth = 1;
  config.intra_op_parallelism = 64;
  EXPECT_TRUE(config.validate().is_ok());
  config.block_size = 8u << 20;
  config.queue_depth = 1024;
  config.intra_op_parallelism = 1;
  EXPECT_TRUE(config.validate().is_ok());
}

TEST(BackendTest, NamesRoundTrip) {
  for (Backend b : {Backend::kAuto, Backend::kIoUring, Backend::kLibaio, Backend::kThreads}) {
    auto parsed = parse_backend(backend_name(b));
    ASSERT_TRUE(parsed.is_ok());
    EXPECT_EQ(parsed.value(), b);
  }
  auto bad = parse_backend("uring");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(bad.status().message(), "aio.backend = 'uring'"));
  EXPECT_TRUE(contains(bad.status().message(), "io_uring"));
}

TEST(BackendTest, AutoPicksTheFirstAvailable) {
  EXPECT_TRUE(backend_available(Backend::kThreads));
  const Backend chosen = resolve_auto_backend();
  EXPECT_NE(chosen, Backend::kAuto);
  EXPECT_TRUE(backend_available(chosen));
  if (backend_available(Backend::kIoUring)) {
    EXPECT_EQ(chosen, Backend::kIoUring);
  } else if (backend_available(Backend::kLibaio)) {
    EXPECT_EQ(chosen, Backend::kLibaio);
  } else {
    EXPECT_EQ(chosen, Backend::kThreads);
  }
  AioConfig config;
  auto handle = Handle::create(config);
  ASSERT_TRUE(handle.is_ok()) << handle.status().to_string();
  EXPECT_EQ(handle.value()->backend(), chosen);
  EXPECT_EQ(Handle::alignment(), 4096u);
}

TEST(BackendTest, UnavailableBackendIsUnsupported) {
  for (Backend b : {Backend::kIoUring, Backend::kLibaio}) {
    if (backend_available(b)) continue;
    AioConfig config;
    config.backend = b;
    auto handle = Handle::create(config);
    ASSERT_FALSE(handle.is_ok());
    EXPECT_EQ(handle.status().code(), ErrorCode::kUnsupported);
    EXPECT_TRUE(contains(handle.status().message(), "aio.backend"));
  }
}

class HandleArgsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    AioConfig config;
    config.intra_op_parallelism = 2;
    auto handle = Handle::create(config);
    ASSERT_TRUE(handle.is_ok()) << handle.status().to_string();
    handle_ = std::move(handle).value();
  }
  std::unique_ptr<Handle> handle_;
  TempDir dir_;
};

TEST_F(HandleArgsTest, WaitForUnknownOrWaitedIdIsInvalid) {
  EXPECT_EQ(handle_->wait(12345).code(), ErrorCode::kInvalidArgument);
  std::vector<std::byte> data(100, std::byte{1});
  auto id = handle_->async_pwrite(data.data(), data.size(), dir_.file("a"), 0);
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  EXPECT_EQ(handle_->pending(), 1u);
  EXPECT_TRUE(handle_->wait(id.value()).is_ok());
  EXPECT_EQ(handle_->pending(), 0u);
  const Status again = handle_->wait(id.value());
  EXPECT_EQ(again.code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(again.message(), std::to_string(id.value())));
}

TEST_F(HandleArgsTest, WaitAllCountsAndEmptiesPending) {
  std::vector<std::byte> data(10000, std::byte{7});
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(handle_->async_pwrite(data.data(), data.size(), dir_.file("b"), i * 10000u).is_ok());
  }
  std::size_t completed = 0;
  EXPECT_TRUE(handle_->wait_all(&completed).is_ok());
  EXPECT_EQ(completed, 5u);
  EXPECT_EQ(handle_->pending(), 0u);
  EXPECT_TRUE(handle_->wait_all(&completed).is_ok());
  EXPECT_EQ(completed, 0u);
  EXPECT_EQ(testing::read_plain(dir_.file("b")).size(), 50000u);
}

TEST_F(HandleArgsTest, BadArgumentsAreRefusedAtSubmission) {
  EXPECT_EQ(handle_->sync_pread(nullptr, 10, dir_.file("x"), 0).code(), ErrorCode::kInvalidArgument);
  std::byte b[4];
  EXPECT_EQ(handle_->sync_pread(b, sizeof(b), std::string(), 0).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(handle_->sync_pwrite(b, sizeof(b), dir_.file("x"), ~std::uint64_t{0} - 1).code(),
            ErrorCode::kInvalidArgument);
  const Status bad_fd = handle_->sync_pread(b, sizeof(b), -1, 0);
  EXPECT_FALSE(bad_fd.is_ok());
  EXPECT_TRUE(contains(bad_fd.message(), "fd -1")) << bad_fd.message();
  const std::string path = dir_.file("append");
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  ASSERT_GE(fd, 0);
  const Status append = handle_->sync_pwrite(b, sizeof(b), fd, 0);
  EXPECT_EQ(append.code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(append.message(), "O_APPEND"));
  ::close(fd);
  EXPECT_EQ(handle_->pending(), 0u);
}

TEST_F(HandleArgsTest, RegisterBufferChecksRanges) {
  std::vector<std::byte> arena(1 << 16);
  EXPECT_EQ(handle_->register_buffer(nullptr, 10).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(handle_->register_buffer(arena.data(), 0).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(handle_->register_buffer(arena.data(), 4096).is_ok());
  EXPECT_EQ(handle_->register_buffer(arena.data() + 100, 4096).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(handle_->register_buffer(arena.data() + 8192, 8192).is_ok());
  EXPECT_TRUE(handle_->unregister_buffers().is_ok());
  EXPECT_TRUE(handle_->register_buffer(arena.data() + 100, 4096).is_ok());
  EXPECT_TRUE(handle_->unregister_buffers().is_ok());
}

TEST_F(HandleArgsTest, ZeroByteRequestsComplete) {
  const std::string path = dir_.file("empty");
  EXPECT_TRUE(handle_->sync_pwrite(nullptr, 0, path, 0, WriteOptions{.truncate = true, .fdatasync = true}).is_ok());
  EXPECT_TRUE(handle_->sync_pread(nullptr, 0, path, 0).is_ok());
  EXPECT_TRUE(handle_->sync_pread(nullptr, 0, path, 1 << 20).is_ok());
  EXPECT_EQ(testing::read_plain(path).size(), 0u);
}

TEST_F(HandleArgsTest, FdatasyncWritesSucceed) {
  std::vector<std::byte> data(300000);
  testing::fill_pattern(data.data(), data.size(), 123, 5);
  const std::string path = dir_.file("synced");
  ASSERT_TRUE(handle_->sync_pwrite(data.data(), data.size(), path, 123, WriteOptions{.fdatasync = true}).is_ok());
  const auto file = testing::read_plain(path);
  ASSERT_EQ(file.size(), 123 + data.size());
  EXPECT_EQ(testing::first_mismatch(file.data() + 123, data.size(), 123, 5), -1);
}

}  // namespace
}  // namespace zinf::aio
