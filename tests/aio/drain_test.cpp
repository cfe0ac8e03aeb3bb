// A broken queue or a late request gives no buffer back while an op may still use it: the ops in
// flight are cancelled and drained before wait() reports the failure, on every backend.
//
// The fault backend's kStall holds one chunk's op back as a device that does not answer would:
// it moves its data only when its queue is torn down (or never, once cancelled). An engine that
// reported the failure without draining would leave it held, and it would then run when the
// handle's queues are destroyed, writing into the caller's buffer (or reading it into the file)
// after wait() returned. Each test therefore compares what the caller saw when wait() returned
// with what is there after the handle is gone. No timing is asserted; a HangGuard turns a hang
// into a failure.
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"
#include "zinf/aio/handle.h"

namespace zinf::aio {
namespace {

using testing::fill_pattern;
using testing::first_mismatch;
using testing::GuardedBuffer;
using testing::TempDir;

constexpr std::size_t kBlock = 64 * 1024;
constexpr std::size_t kChunks = 16;
constexpr std::size_t kBytes = kChunks * kBlock;
constexpr std::uint32_t kSeed = 31;
// Far above what any of these tests needs when it works; a hang is a failure, not a suite timeout.
constexpr std::chrono::seconds kHangBound{90};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Aborts the test program, naming `what`, when it is still armed `bound` after it was made.
class HangGuard {
 public:
  HangGuard(std::string what, std::chrono::seconds bound) : what_(std::move(what)), thread_([this, bound] {
    std::unique_lock lock(mutex_);
    if (!cv_.wait_for(lock, bound, [&] { return done_; })) {
      std::fprintf(stderr, "%s: still running after %lld s: it hangs\n", what_.c_str(),
                   static_cast<long long>(bound.count()));
      std::abort();
    }
  }) {}
  ~HangGuard() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  HangGuard(const HangGuard&) = delete;
  HangGuard& operator=(const HangGuard&) = delete;

 private:
  std::string what_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// One worker with 4 chunks in flight, so the held chunk is in the queue with three others.
std::unique_ptr<Handle> make_handle(Backend backend, std::shared_ptr<FaultInjector> faults, double timeout_s) {
  AioConfig config;
  config.backend = backend;
  config.block_size = kBlock;
  config.queue_depth = 4;
  config.intra_op_parallelism = 1;
  config.request_timeout_s = timeout_s;
  config.faults = std::move(faults);
  auto handle = Handle::create(config);
  EXPECT_TRUE(handle.is_ok()) << handle.status().to_string();
  return handle.is_ok() ? std::move(handle).value() : nullptr;
}

// The first byte where `now` differs from `then`, or -1.
std::int64_t first_change(const std::byte* now, const std::vector<std::byte>& then) {
  for (std::size_t i = 0; i < then.size(); ++i) {
    if (now[i] != then[i]) return static_cast<std::int64_t>(i);
  }
  return -1;
}

class DrainTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (!backend_available(GetParam())) GTEST_SKIP() << backend_name(GetParam()) << " is not available here";
    std::vector<std::byte> data(kBytes);
    fill_pattern(data.data(), kBytes, 0, kSeed);
    path_ = dir_.file("data.bin");
    testing::write_plain(path_, data);
  }

  // Reads the file with `rules` in force through a handle with `timeout_s`, expecting the read
  // to fail; checks that the handle then reads the file correctly, and that the buffer did not
  // change after wait() returned (the handle and its queues gone by then). Returns the read's
  // status and the handle's counters as they were after it.
  std::pair<Status, HandleStats> failing_read(const std::vector<FaultRule>& rules, double timeout_s) {
    auto faults = std::make_shared<FaultInjector>();
    GuardedBuffer buf(kBytes, 0);
    std::memset(buf.data(), 0, kBytes);
    std::vector<std::byte> seen;
    Status st;
    HandleStats stats;
    {
      auto handle = make_handle(GetParam(), faults, timeout_s);
      if (handle == nullptr) return {Status::internal("no handle"), {}};
      for (const FaultRule& rule : rules) faults->add(rule);
      st = handle->sync_pread(buf.data(), kBytes, path_, 0);
      seen.assign(buf.data(), buf.data() + kBytes);  // what the caller has when the failure is reported
      stats = handle->stats();
      // The handle goes on working (one block: well inside even a 0.2 s limit).
      faults->clear();
      GuardedBuffer again(kBlock, 0);
      const Status next = handle->sync_pread(again.data(), kBlock, path_, 0);
      EXPECT_TRUE(next.is_ok()) << next.to_string();
      EXPECT_EQ(first_mismatch(again.data(), kBlock, 0, kSeed), -1);
    }
    EXPECT_EQ(first_change(buf.data(), seen), -1) << "the buffer was written after wait() reported the failure";
    EXPECT_TRUE(buf.guards_intact());
    EXPECT_EQ(faults->injected(), rules.size());
    return {st, stats};
  }

  TempDir dir_;
  std::string path_;
};

// (a) A queue whose reap() fails while one op is held (cancellable) and others are in the
// kernel: the queue is cancelled and drained before the read fails; the held op never runs.
TEST_P(DrainTest, BrokenQueueIsDrainedBeforeTheReadFails) {
  HangGuard guard("BrokenQueueIsDrainedBeforeTheReadFails", kHangBound);
  const auto [st, stats] = failing_read({FaultRule{.action = FaultAction::kStall, .op = FaultOp::kRead, .skip = 1},
                                         FaultRule{.action = FaultAction::kBreakQueue, .op = FaultOp::kRead}},
                                        120.0);
  EXPECT_EQ(st.code(), ErrorCode::kIoError) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "injected fault")) << st.message();
  EXPECT_TRUE(contains(st.message(), "aio worker 0")) << st.message();
  EXPECT_EQ(stats.queue_resets, 1u);
}

// The same with an op that ignores cancellation: the drain waits for it (here until its
// deadline, aio.request_timeout_s = 1 s, when the teardown makes it run) before the read fails.
TEST_P(DrainTest, BrokenQueueWaitsForAnOpThatCannotBeCancelled) {
  HangGuard guard("BrokenQueueWaitsForAnOpThatCannotBeCancelled", kHangBound);
  const auto [st, stats] = failing_read(
      {FaultRule{.action = FaultAction::kStall, .op = FaultOp::kRead, .skip = 1, .cancellable = false},
       FaultRule{.action = FaultAction::kBreakQueue, .op = FaultOp::kRead}},
      1.0);
  EXPECT_EQ(st.code(), ErrorCode::kIoError) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "injected fault")) << st.message();
  EXPECT_EQ(stats.queue_resets, 1u);
}

// A write whose queue breaks: once wait() has failed it, the caller refills the buffer; the file
// must never receive those new bytes (a held write that ran later would put them there).
TEST_P(DrainTest, BrokenQueueWriteDoesNotReadTheBufferAfterwards) {
  HangGuard guard("BrokenQueueWriteDoesNotReadTheBufferAfterwards", kHangBound);
  for (const bool cancellable : {true, false}) {
    SCOPED_TRACE(cancellable ? "cancellable" : "not cancellable");
    const std::string path = dir_.file(cancellable ? "w1.bin" : "w2.bin");
    testing::write_plain(path, std::vector<std::byte>(kBytes));
    auto faults = std::make_shared<FaultInjector>();
    GuardedBuffer buf(kBytes, 0);
    fill_pattern(buf.data(), kBytes, 0, 41);
    {
      auto handle = make_handle(GetParam(), faults, 1.0);
      ASSERT_NE(handle, nullptr);
      faults->add(FaultRule{.action = FaultAction::kStall, .op = FaultOp::kWrite, .skip = 1,
                            .cancellable = cancellable});
      faults->add(FaultRule{.action = FaultAction::kBreakQueue, .op = FaultOp::kWrite});
      const Status st = handle->sync_pwrite(buf.data(), kBytes, path, 0);
      EXPECT_EQ(st.code(), ErrorCode::kIoError) << st.to_string();
      fill_pattern(buf.data(), kBytes, 0, 42);  // the caller reuses its buffer
    }
    const std::vector<std::byte> file = testing::read_plain(path);
    ASSERT_EQ(file.size(), kBytes);
    for (std::size_t c = 0; c < kChunks; ++c) {
      EXPECT_NE(first_mismatch(file.data() + c * kBlock, kBlock, c * kBlock, 42), -1)
          << "chunk " << c << " holds bytes the caller wrote into its buffer after wait() failed the write";
    }
    EXPECT_EQ(faults->injected(), 2u);
  }
}

// A request whose op never answers is failed at its deadline, and the op is cancelled; wait()
// returns once it is back (without the cancel it would wait for ever).
TEST_P(DrainTest, LateRequestIsCancelledAtItsDeadline) {
  HangGuard guard("LateRequestIsCancelledAtItsDeadline", kHangBound);
  const auto [st, stats] =
      failing_read({FaultRule{.action = FaultAction::kStall, .op = FaultOp::kRead, .skip = 1}}, 0.2);
  EXPECT_EQ(st.code(), ErrorCode::kIoError) << st.to_string();
  EXPECT_EQ(st.sys_errno(), ETIMEDOUT);
  EXPECT_TRUE(contains(st.message(), "pread " + path_ + " offset 0")) << st.message();
  EXPECT_TRUE(contains(st.message(), "aio.request_timeout_s")) << st.message();
  EXPECT_GE(stats.cancels, 1u);
  EXPECT_EQ(stats.queue_resets, 0u);
}

// An op that neither answers nor can be cancelled: request_timeout_s after the cancel the worker
// tears its queue down, which returns only once the op has let go of the buffer (here: the held
// op runs then), and only then does wait() fail the request.
TEST_P(DrainTest, StuckOpTearsTheQueueDown) {
  HangGuard guard("StuckOpTearsTheQueueDown", kHangBound);
  const auto [st, stats] = failing_read(
      {FaultRule{.action = FaultAction::kStall, .op = FaultOp::kRead, .skip = 1, .cancellable = false}}, 0.2);
  EXPECT_EQ(st.code(), ErrorCode::kIoError) << st.to_string();
  EXPECT_EQ(st.sys_errno(), ETIMEDOUT);
  EXPECT_TRUE(contains(st.message(), "aio.request_timeout_s")) << st.message();
  EXPECT_GE(stats.cancels, 1u);
  EXPECT_EQ(stats.queue_resets, 1u);
}

std::string backend_param_name(const ::testing::TestParamInfo<Backend>& info) {
  return std::string(backend_name(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllBackends, DrainTest, ::testing::ValuesIn(testing::all_backends()), backend_param_name);

}  // namespace
}  // namespace zinf::aio
