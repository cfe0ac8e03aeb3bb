// Backend queues on their own: every op completes once, fixed buffers work, faults apply.
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "aio/backend.h"
#include "aio/file.h"
#include "test_util.h"

namespace zinf::aio::detail {
namespace {

using testing::fill_pattern;
using testing::first_mismatch;
using testing::TempDir;

constexpr std::size_t kDepth = 4;
constexpr std::size_t kChunk = 64 * 1024;

// Submits `ops` (at most kDepth), reaps until all completed; returns results by tag.
std::vector<std::int64_t> run_ops(BackendQueue& queue, const std::vector<IoOp>& ops, bool one_by_one) {
  for (const IoOp& op : ops) {
    queue.prepare(op);
    if (one_by_one) queue.submit();
  }
  queue.submit();
  std::vector<std::int64_t> results(kDepth, 1234567);
  std::size_t seen = 0;
  std::vector<IoCompletion> out(kDepth);
  while (seen < ops.size()) {
    auto got = queue.reap(out.data(), out.size(), 1, Clock::time_point::max());
    EXPECT_TRUE(got.is_ok()) << got.status().to_string();
    if (!got.is_ok()) break;
    for (std::size_t i = 0; i < got.value(); ++i) results.at(out[i].tag) = out[i].result;
    seen += got.value();
  }
  EXPECT_EQ(seen, ops.size());
  return results;
}

class BackendQueueTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (!backend_available(GetParam())) GTEST_SKIP() << backend_name(GetParam()) << " is not available here";
    auto memory = AlignedBuffer::allocate(2 * kDepth * kChunk, 4096);
    ASSERT_TRUE(memory.is_ok());
    memory_ = std::move(memory).value();
    path_ = dir_.file("q.bin");
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0644);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override {
    if (fd_ >= 0) ::close(fd_);
  }

  std::vector<IoOp> ops(bool is_write, std::byte* base) {
    std::vector<IoOp> v;
    for (std::uint32_t i = 0; i < kDepth; ++i) {
      v.push_back(IoOp{is_write, fd_, base + i * kChunk, kChunk, i * kChunk, i, -1, &path_});
    }
    return v;
  }

  TempDir dir_;
  AlignedBuffer memory_;
  std::string path_;
  int fd_ = -1;
};

TEST_P(BackendQueueTest, WritesThenReadsEveryOpOnce) {
  auto queue = make_backend_queue(GetParam(), kDepth, nullptr);
  ASSERT_TRUE(queue.is_ok()) << queue.status().to_string();
  std::byte* out = memory_.data();
  std::byte* in = memory_.data() + kDepth * kChunk;
  fill_pattern(out, kDepth * kChunk, 0, 21);
  for (std::int64_t r : run_ops(*queue.value(), ops(true, out), false)) EXPECT_EQ(r, static_cast<std::int64_t>(kChunk));
  for (std::int64_t r : run_ops(*queue.value(), ops(false, in), true)) EXPECT_EQ(r, static_cast<std::int64_t>(kChunk));
  EXPECT_EQ(first_mismatch(in, kDepth * kChunk, 0, 21), -1);
}

TEST_P(BackendQueueTest, RefusedOpsCompleteWithErrno) {
  auto queue = make_backend_queue(GetParam(), kDepth, nullptr);
  ASSERT_TRUE(queue.is_ok());
  // A misaligned O_DIRECT op fails with EINVAL (at submission for libaio, at completion otherwise).
  std::vector<IoOp> bad = ops(true, memory_.data());
  bad[1].buf = memory_.data() + 1;
  bad[2].fd = 987654;  // not open
  const auto results = run_ops(*queue.value(), bad, false);
  EXPECT_EQ(results[0], static_cast<std::int64_t>(kChunk));
  EXPECT_EQ(results[1], -EINVAL);
  EXPECT_EQ(results[2], -EBADF);
  EXPECT_EQ(results[3], static_cast<std::int64_t>(kChunk));
}

TEST_P(BackendQueueTest, FixedBuffers) {
  auto queue = make_backend_queue(GetParam(), kDepth, nullptr);
  ASSERT_TRUE(queue.is_ok());
  BackendQueue& q = *queue.value();
  const iovec range{memory_.data(), memory_.size()};
  std::string why;
  const bool fixed = q.set_fixed_buffers({&range, 1}, &why);
  EXPECT_EQ(fixed, GetParam() == Backend::kIoUring) << why;
  std::byte* out = memory_.data();
  std::byte* in = memory_.data() + kDepth * kChunk;
  fill_pattern(out, kDepth * kChunk, 0, 22);
  auto writes = ops(true, out);
  auto reads = ops(false, in);
  for (auto* v : {&writes, &reads}) {
    for (IoOp& op : *v) op.fixed_index = fixed ? 0 : -1;
  }
  for (std::int64_t r : run_ops(q, writes, false)) EXPECT_EQ(r, static_cast<std::int64_t>(kChunk));
  for (std::int64_t r : run_ops(q, reads, false)) EXPECT_EQ(r, static_cast<std::int64_t>(kChunk));
  EXPECT_EQ(first_mismatch(in, kDepth * kChunk, 0, 22), -1);
  EXPECT_FALSE(q.set_fixed_buffers({}, &why));
}

TEST_P(BackendQueueTest, FaultWrapperFailsShortensAndDelays) {
  auto faults = std::make_shared<FaultInjector>();
  faults->add(FaultRule{.action = FaultAction::kFail, .op = FaultOp::kWrite, .skip = 1, .errno_value = ENOSPC});
  faults->add(FaultRule{.action = FaultAction::kShorten, .op = FaultOp::kWrite, .skip = 2, .shorten_by = 4096});
  faults->add(FaultRule{.action = FaultAction::kDelay, .op = FaultOp::kRead, .path_contains = "q.bin", .count = 4,
                        .delay = std::chrono::microseconds(100)});
  faults->add(FaultRule{.action = FaultAction::kFail, .path_contains = "elsewhere"});
  auto queue = make_backend_queue(GetParam(), kDepth, faults);
  ASSERT_TRUE(queue.is_ok());
  // The kernel completes ops in any order; the rules count completions in the order delivered.
  const auto results = run_ops(*queue.value(), ops(true, memory_.data()), false);
  int full = 0, failed = 0, shortened = 0;
  for (std::int64_t r : results) {
    if (r == static_cast<std::int64_t>(kChunk)) ++full;
    if (r == -ENOSPC) ++failed;
    if (r == static_cast<std::int64_t>(kChunk - 4096)) ++shortened;
  }
  EXPECT_EQ(full, 2);
  EXPECT_EQ(failed, 1);
  EXPECT_EQ(shortened, 1);
  for (std::int64_t r : run_ops(*queue.value(), ops(false, memory_.data()), false)) {
    EXPECT_EQ(r, static_cast<std::int64_t>(kChunk));
  }
  EXPECT_EQ(faults->injected(), 6u);
}

// Every op not yet reaped is accounted for by cancel_and_drain, and when it returns each read
// has either moved all its bytes or none (cancelled before it started): nothing is still
// running. With the deadline already past, the drain goes straight to the teardown that waits
// (io_destroy; io_uring's unbounded wait); the threads queue drops the ops it has not started.
TEST_P(BackendQueueTest, CancelAndDrainAccountsForEveryOp) {
  for (const bool past_deadline : {false, true}) {
    SCOPED_TRACE(past_deadline ? "deadline already past" : "deadline in 30 s");
    auto writer = make_backend_queue(GetParam(), kDepth, nullptr);
    ASSERT_TRUE(writer.is_ok());
    std::byte* out = memory_.data();
    std::byte* in = memory_.data() + kDepth * kChunk;
    fill_pattern(out, kDepth * kChunk, 0, 23);
    run_ops(*writer.value(), ops(true, out), false);
    std::memset(in, 0, kDepth * kChunk);
    auto queue = make_backend_queue(GetParam(), kDepth, nullptr);
    ASSERT_TRUE(queue.is_ok());
    for (const IoOp& op : ops(false, in)) queue.value()->prepare(op);
    queue.value()->submit();
    const Clock::time_point deadline = past_deadline ? Clock::now() : Clock::now() + std::chrono::seconds(30);
    auto report = queue.value()->cancel_and_drain(deadline);
    ASSERT_TRUE(report.is_ok()) << report.status().to_string();
    const DrainReport& r = report.value();
    EXPECT_EQ(r.cancelled + r.finished + r.late, kDepth);
    if (!past_deadline) {
      EXPECT_EQ(r.late, 0u);
    }
    if (GetParam() == Backend::kThreads) {
      EXPECT_EQ(r.cancelled, kDepth);
    }
    std::size_t whole = 0;
    for (std::size_t i = 0; i < kDepth; ++i) {
      const std::byte* chunk = in + i * kChunk;
      const bool untouched = std::all_of(chunk, chunk + kChunk, [](std::byte b) { return b == std::byte{0}; });
      const bool complete = first_mismatch(chunk, kChunk, i * kChunk, 23) == -1;
      EXPECT_TRUE(untouched || complete) << "read " << i << " was still moving data when the drain returned";
      whole += complete ? 1 : 0;
    }
    EXPECT_GE(whole, r.finished + r.late);
  }
}

// A read that can never complete on its own (an empty pipe) is really in the kernel; io_uring
// cancels it: reap() returns it with -ECANCELED, and data written to the pipe afterwards stays
// in the pipe instead of landing in the buffer. The same through cancel_and_drain.
TEST_P(BackendQueueTest, CancelStopsAReadThatNeverCompletes) {
  if (GetParam() != Backend::kIoUring) {
    GTEST_SKIP() << backend_name(GetParam()) << " cannot cancel such a read (libaio would block in io_submit on "
                 << "a pipe, threads in pread); cancel_and_drain is covered above";
  }
  for (const bool whole_queue : {false, true}) {
    SCOPED_TRACE(whole_queue ? "cancel_and_drain" : "cancel");
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const std::string pipe_name = "pipe";
    auto queue = make_backend_queue(GetParam(), kDepth, nullptr);
    ASSERT_TRUE(queue.is_ok());
    BackendQueue& q = *queue.value();
    std::byte* in = memory_.data();
    std::memset(in, 0, 4096);
    q.prepare(IoOp{false, fds[0], in, 4096, 0, 2, -1, &pipe_name});
    q.submit();
    std::vector<IoCompletion> out(kDepth);
    // Nothing can come back: the pipe is empty and its write end open.
    auto got = q.reap(out.data(), out.size(), 1, Clock::now() + std::chrono::milliseconds(20));
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    ASSERT_EQ(got.value(), 0u);
    if (whole_queue) {
      auto report = q.cancel_and_drain(Clock::now() + std::chrono::seconds(30));
      ASSERT_TRUE(report.is_ok()) << report.status().to_string();
      EXPECT_EQ(report.value().cancelled, 1u);
      EXPECT_EQ(report.value().late, 0u);
    } else {
      q.cancel(2);
      got = q.reap(out.data(), out.size(), 1, Clock::now() + std::chrono::seconds(30));
      ASSERT_TRUE(got.is_ok()) << got.status().to_string();
      ASSERT_EQ(got.value(), 1u);
      EXPECT_EQ(out[0].tag, 2u);
      EXPECT_EQ(out[0].result, -ECANCELED);
    }
    const char text[] = "late bytes";
    ASSERT_EQ(::write(fds[1], text, sizeof(text)), static_cast<ssize_t>(sizeof(text)));
    char back[sizeof(text)] = {};
    ASSERT_EQ(::read(fds[0], back, sizeof(back)), static_cast<ssize_t>(sizeof(text)));  // still in the pipe
    EXPECT_TRUE(std::all_of(in, in + 4096, [](std::byte b) { return b == std::byte{0}; }));
    ::close(fds[0]);
    ::close(fds[1]);
  }
}

std::string backend_param_name(const ::testing::TestParamInfo<Backend>& info) {
  return std::string(backend_name(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllBackends, BackendQueueTest, ::testing::ValuesIn(testing::all_backends()),
                         backend_param_name);

}  // namespace
}  // namespace zinf::aio::detail
