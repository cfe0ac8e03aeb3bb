// One handle used from several threads at once, and many requests in flight on one handle.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "test_util.h"
#include "zinf/aio/handle.h"

namespace zinf::aio {
namespace {

using testing::fill_pattern;
using testing::first_mismatch;
using testing::GuardedBuffer;
using testing::TempDir;

class ConcurrencyTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (!backend_available(GetParam())) GTEST_SKIP() << backend_name(GetParam()) << " is not available here";
    AioConfig config;
    config.backend = GetParam();
    config.block_size = 64 * 1024;
    config.queue_depth = 8;
    config.intra_op_parallelism = 3;
    auto handle = Handle::create(config);
    ASSERT_TRUE(handle.is_ok()) << handle.status().to_string();
    handle_ = std::move(handle).value();
  }
  std::unique_ptr<Handle> handle_;
  TempDir dir_;
};

TEST_P(ConcurrencyTest, ThreadsShareOneHandle) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 12;
  // Each thread round-trips its own file and also writes its own stripe of a shared file.
  const std::string shared = dir_.file("shared");
  const std::size_t stripe = 300000;  // not a multiple of 4096: stripes share blocks
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string own = dir_.file(fmt::format("own{}", t));
      for (int round = 0; round < kRounds; ++round) {
        const std::size_t n = 1000 + static_cast<std::size_t>(round) * 37001;
        const std::uint64_t offset = static_cast<std::uint64_t>(round) * 513;
        const auto seed = static_cast<std::uint32_t>(t * 100 + round);
        GuardedBuffer out(n, static_cast<std::size_t>(round) % 3);
        fill_pattern(out.data(), n, offset, seed);
        GuardedBuffer in(n, static_cast<std::size_t>(t));
        if (!handle_->sync_pwrite(out.data(), n, own, offset).is_ok() ||
            !handle_->sync_pread(in.data(), n, own, offset).is_ok() ||
            first_mismatch(in.data(), n, offset, seed) != -1 || !in.guards_intact()) {
          ++failures;
        }
      }
      GuardedBuffer part(stripe, 1);
      fill_pattern(part.data(), stripe, static_cast<std::uint64_t>(t) * stripe, 77);
      if (!handle_->sync_pwrite(part.data(), stripe, shared, static_cast<std::uint64_t>(t) * stripe).is_ok()) {
        ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  const auto file = testing::read_plain(shared);
  ASSERT_EQ(file.size(), kThreads * stripe);
  EXPECT_EQ(first_mismatch(file.data(), file.size(), 0, 77), -1);
}

TEST_P(ConcurrencyTest, ManyRequestsInFlight) {
  constexpr int kRequests = 64;
  constexpr std::size_t kSize = 64 * 1024 + 123;
  const std::string path = dir_.file("many");
  std::vector<GuardedBuffer> out;
  out.reserve(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    out.emplace_back(kSize, static_cast<std::size_t>(i) % 5);
    fill_pattern(out.back().data(), kSize, i * kSize, 5);
    auto id = handle_->async_pwrite(out.back().data(), kSize, path, i * kSize);
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  }
  std::size_t completed = 0;
  const Status st = handle_->wait_all(&completed);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(completed, static_cast<std::size_t>(kRequests));

  std::vector<GuardedBuffer> in;
  std::vector<RequestId> ids;
  in.reserve(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    in.emplace_back(kSize, static_cast<std::size_t>(i) % 7);
    auto id = handle_->async_pread(in.back().data(), kSize, path, i * kSize);
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
    ids.push_back(id.value());
  }
  EXPECT_EQ(handle_->pending(), static_cast<std::size_t>(kRequests));
  // Wait in reverse order: completion order must not matter.
  for (int i = kRequests - 1; i >= 0; --i) {
    ASSERT_TRUE(handle_->wait(ids[static_cast<std::size_t>(i)]).is_ok());
    EXPECT_EQ(first_mismatch(in[static_cast<std::size_t>(i)].data(), kSize, i * kSize, 5), -1) << i;
    EXPECT_TRUE(in[static_cast<std::size_t>(i)].guards_intact());
  }
  EXPECT_EQ(handle_->pending(), 0u);
}

TEST_P(ConcurrencyTest, WaitersOnOtherThreads) {
  constexpr int kRequests = 16;
  constexpr std::size_t kSize = 200000;
  std::vector<std::vector<std::byte>> data(kRequests, std::vector<std::byte>(kSize));
  std::vector<RequestId> ids;
  for (int i = 0; i < kRequests; ++i) {
    fill_pattern(data[i].data(), kSize, 0, static_cast<std::uint32_t>(i));
    auto id = handle_->async_pwrite(data[i].data(), kSize, dir_.file(fmt::format("w{}", i)), 0);
    ASSERT_TRUE(id.is_ok());
    ids.push_back(id.value());
  }
  std::atomic<int> ok{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < kRequests; ++i) {
    waiters.emplace_back([&, i] {
      if (handle_->wait(ids[i]).is_ok()) ++ok;
    });
  }
  for (auto& w : waiters) w.join();
  EXPECT_EQ(ok.load(), kRequests);
  for (int i = 0; i < kRequests; ++i) {
    const auto file = testing::read_plain(dir_.file(fmt::format("w{}", i)));
    ASSERT_EQ(file.size(), kSize);
    EXPECT_EQ(first_mismatch(file.data(), kSize, 0, static_cast<std::uint32_t>(i)), -1);
  }
}

TEST_P(ConcurrencyTest, DestructorDrainsRequestsNobodyWaitedFor) {
  constexpr int kRequests = 12;
  constexpr std::size_t kSize = (1 << 20) + 9;
  std::vector<std::byte> data(kSize);
  fill_pattern(data.data(), kSize, 0, 12);
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(handle_->async_pwrite(data.data(), kSize, dir_.file(fmt::format("d{}", i)), 0).is_ok());
  }
  handle_.reset();  // must block until every write is done
  for (int i = 0; i < kRequests; ++i) {
    const auto file = testing::read_plain(dir_.file(fmt::format("d{}", i)));
    ASSERT_EQ(file.size(), kSize);
    EXPECT_EQ(first_mismatch(file.data(), kSize, 0, 12), -1);
  }
}

std::string backend_param_name(const ::testing::TestParamInfo<Backend>& info) {
  return std::string(backend_name(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllBackends, ConcurrencyTest, ::testing::ValuesIn(testing::all_backends()),
                         backend_param_name);

}  // namespace
}  // namespace zinf::aio
