// Tests of the optimizer swapper's read-ahead (state read before the step, under the passes):
// errors surface at the right call, a failed or dropped read-ahead leaves the committed state
// intact and the slots idle, and every path gives the bits of the in-memory reference.
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "optimizer_test_util.h"
#include "swap_test_util.h"
#include "zinf/aio/fault.h"
#include "zinf/swap/optimizer_swapper.h"

namespace zinf::swap {
namespace {

using testing::TempDir;
using namespace testing;  // the optimizer test helpers

// A pipelined swapper with an in-memory reference, both past `steps` steps.
class ReadAhead : public ::testing::Test {
 protected:
  void SetUp() override {
    handle_ = make_handle(faults_);
    config_ = base_config(dir_);
    config_.pipeline_read = config_.pipeline_write = true;
    sw_ = std::move(OptimizerSwapper::create(config_, kParams, optim::Optimizer(adamw()), *handle_)).value();
    ref_ = std::make_unique<InMemory>(sw_->layout(), sw_->optimizer());
    ASSERT_TRUE(sw_->init_master(initial_source()).is_ok());
    for (const SubGroup& g : sw_->layout().subgroups) copies_.emplace_back(g.numel, 0);
    sink_ = host_sink(copies_);
    for (int t = 1; t <= 2; ++t) {
      ASSERT_TRUE(sw_->read_ahead().is_ok());
      ASSERT_TRUE(step(t).is_ok());
      ref_->step(inputs(t));
    }
  }

  StepArgs inputs(int t) {
    grads_ = make_grads(sw_->layout(), DType::kF32, 500 + t);
    StepArgs in;
    in.ctx.step = t;
    in.grads = views(grads_, DType::kF32);
    in.sink = &sink_;
    return in;
  }
  Status step(int t) { return sw_->step(inputs(t)); }
  // Step t retried with no fault, from a fresh read-ahead, matches the reference bit for bit.
  void expect_retry_matches(int t) {
    faults_->clear();
    ASSERT_TRUE(sw_->read_ahead().is_ok());
    const Status st = step(t);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ref_->step(inputs(t));
    EXPECT_EQ(sw_->committed_step(), t);
    expect_state_equal(*sw_, *ref_);
    EXPECT_LE(sw_->pool().high_water(), sw_->pool().capacity());  // no memory beyond the slots
  }

  TempDir dir_;
  std::shared_ptr<aio::FaultInjector> faults_ = std::make_shared<aio::FaultInjector>();
  std::unique_ptr<aio::Handle> handle_;
  OptimizerSwapConfig config_;
  std::unique_ptr<OptimizerSwapper> sw_;
  std::unique_ptr<InMemory> ref_;
  std::vector<std::vector<std::uint16_t>> copies_;
  HostParamSink sink_{{}, DType::kBF16};  // over copies_
  std::vector<std::vector<std::byte>> grads_;
};

// A read of the read-ahead fails: read_ahead() itself succeeds (the read is only submitted), the
// step that takes it over fails naming the read-ahead, and the previous step stays committed.
TEST_F(ReadAhead, ReadErrorFailsTheStepThatUsesIt) {
  faults_->add(fail_reads());  // every read chunk now is the read-ahead's
  ASSERT_TRUE(sw_->read_ahead().is_ok());
  EXPECT_GT(sw_->read_ahead_tiles(), 1u);
  const Status st = step(3);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(faults_->injected(), 1u);
  EXPECT_EQ(st.sys_errno(), 5) << st.to_string();
  EXPECT_NE(st.message().find("(read ahead of the step)"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("optimizer step 3 failed (the state of step 2 stays committed and intact)"),
            std::string::npos)
      << st.to_string();
  EXPECT_EQ(sw_->read_ahead_tiles(), 0u);
  EXPECT_EQ(sw_->committed_step(), 2);
  expect_state_equal(*sw_, *ref_);
  expect_retry_matches(3);
}

// A read-ahead dropped by cancel_read_ahead() reports its read error there, and the slots are
// idle afterwards: a step without a read-ahead then reads everything itself.
TEST_F(ReadAhead, CancelReportsItsReadErrorAndFreesTheSlots) {
  faults_->add(fail_reads());
  ASSERT_TRUE(sw_->read_ahead().is_ok());
  const Status st = sw_->cancel_read_ahead();
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.sys_errno(), 5) << st.to_string();
  EXPECT_NE(st.message().find("read ahead of the step (dropped)"), std::string::npos) << st.to_string();
  EXPECT_EQ(sw_->read_ahead_tiles(), 0u);
  EXPECT_TRUE(sw_->cancel_read_ahead().is_ok());  // nothing left to drop
  faults_->clear();
  ASSERT_TRUE(step(3).is_ok());  // no read-ahead: the serial start
  ref_->step(inputs(3));
  expect_state_equal(*sw_, *ref_);
}

// The step after a read-ahead fails in its writes: the read-ahead's reads are waited for, the
// previous state stays committed, and the retry (with a new read-ahead) gives the reference bits.
TEST_F(ReadAhead, FailedStepAfterReadAheadIsRetryable) {
  ASSERT_TRUE(sw_->read_ahead().is_ok());
  faults_->add(fail_writes(writes_per_step(*sw_) / 2));
  const Status st = step(3);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.sys_errno(), 5) << st.to_string();
  EXPECT_EQ(sw_->read_ahead_tiles(), 0u);
  EXPECT_EQ(sw_->committed_step(), 2);
  expect_state_equal(*sw_, *ref_);
  expect_retry_matches(3);
}

// A read-ahead of state that is then replaced (load_state, as a resume does) is dropped: the
// step reads the loaded state, not the stale read-ahead.
TEST_F(ReadAhead, LoadStateDropsAStaleReadAhead) {
  // Step 3's state from the reference, loaded tensor by tensor while a read-ahead of step 2's
  // state is pending.
  ref_->step(inputs(3));
  ASSERT_TRUE(sw_->read_ahead().is_ok());
  for (std::size_t g = 0; g < ref_->master.size(); ++g) {
    for (std::size_t w = 0; w <= ref_->opt.state_count(); ++w) {
      const std::vector<float>& v = w == 0 ? ref_->master[g] : ref_->states[g][w - 1];
      ASSERT_TRUE(sw_->load_state(g, w, v).is_ok());
      EXPECT_EQ(sw_->read_ahead_tiles(), 0u);
    }
  }
  expect_state_equal(*sw_, *ref_);
  ASSERT_TRUE(sw_->read_ahead().is_ok());
  ASSERT_TRUE(step(4).is_ok());
  ref_->step(inputs(4));
  expect_state_equal(*sw_, *ref_);
}

// Slow reads (delayed completions): the step and the destructor wait for the read-ahead before
// its buffers are reused or freed.
TEST_F(ReadAhead, SlowReadsAreWaitedForByTheStepAndTheDestructor) {
  aio::FaultRule slow;
  slow.action = aio::FaultAction::kDelay;
  slow.op = aio::FaultOp::kRead;
  slow.count = UINT64_MAX;
  slow.delay = std::chrono::milliseconds(5);
  faults_->add(slow);
  ASSERT_TRUE(sw_->read_ahead().is_ok());
  ASSERT_TRUE(step(3).is_ok());
  ref_->step(inputs(3));
  expect_state_equal(*sw_, *ref_);
  ASSERT_TRUE(sw_->read_ahead().is_ok());
  sw_.reset();  // with the reads in flight
  faults_->clear();
  auto reopened = OptimizerSwapper::create(config_, kParams, optim::Optimizer(adamw()), *handle_, OpenMode::kOpen);
  ASSERT_TRUE(reopened.is_ok()) << reopened.status().to_string();
  EXPECT_EQ((*reopened)->committed_step(), 3);
  expect_state_equal(**reopened, *ref_);
}

}  // namespace
}  // namespace zinf::swap
