// The host device: the device contract (device_conformance.h) without and with random delays on
// every stream, and what only the host device does (failures naming the item, poisoned blocks).
#include "device/host_device.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "device/step_times.h"
#include "device_conformance.h"

namespace zinf::device {
namespace {

using testing::DeviceCase;
using testing::DeviceConformance;

class HostOps final : public testing::TestOps {
 public:
  Work axpb(float* p, std::size_t n, float mul, float add) override {
    return [=](const StreamContext&) {
      for (std::size_t i = 0; i < n; ++i) p[i] = p[i] * mul + add;
      return Status::ok();
    };
  }
  Work gate() override {
    return [this](const StreamContext&) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return open_; });
      return Status::ok();
    };
  }
  void open() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

DeviceCase host_case(std::string name, HostDeviceOptions o) {
  return DeviceCase{std::move(name), [o] { return std::unique_ptr<Device>(HostDevice::create(o)); },
                    [] { return std::unique_ptr<testing::TestOps>(std::make_unique<HostOps>()); }, nullptr};
}

HostDeviceOptions delayed(std::uint64_t seed, bool poison) {
  HostDeviceOptions o;
  o.max_delay = std::chrono::microseconds(300);
  o.seed = seed;
  o.poison_new_blocks = poison;
  return o;
}

HostDeviceOptions poisoned() {
  HostDeviceOptions o;
  o.poison_new_blocks = true;
  return o;
}

INSTANTIATE_TEST_SUITE_P(HostDevice, DeviceConformance,
                         ::testing::Values(host_case("plain", {}), host_case("poisoned", poisoned()),
                                           host_case("delays_seed1", delayed(1, true)),
                                           host_case("delays_seed2", delayed(2, true)),
                                           host_case("delays_seed3", delayed(3, false))),
                         testing::case_name);

TEST(HostDevice, AFailedItemFailsItsStreamNamingTheItem) {
  auto dev = HostDevice::create();
  HostOps gate;
  std::atomic<int> ran{0};
  ASSERT_TRUE(dev->enqueue(StreamRole::kCompute, gate.gate(), "gate").is_ok());
  ASSERT_TRUE(dev->enqueue(StreamRole::kCompute, [](const StreamContext&) { return Status::internal("boom"); },
                           "layer 7 backward").is_ok());
  ASSERT_TRUE(dev->enqueue(StreamRole::kCompute, [&](const StreamContext&) { ++ran; return Status::ok(); }, "after")
                  .is_ok());
  gate.open();
  const Status st = dev->synchronize_all();
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("layer 7 backward"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("compute stream"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("boom"), std::string::npos) << st.message();
  EXPECT_EQ(ran.load(), 0) << "an item after the failure ran";
  // Sticky: later work on that stream is refused with the same failure; other streams still run.
  const Status again = dev->enqueue(StreamRole::kCompute, [](const StreamContext&) { return Status::ok(); }, "later");
  EXPECT_NE(again.message().find("layer 7 backward"), std::string::npos) << again.message();
  EXPECT_FALSE(dev->record(StreamRole::kCompute).is_ok());
  Result<Event> d2h = dev->record(StreamRole::kD2H);
  ASSERT_TRUE(d2h.is_ok());
  EXPECT_TRUE(dev->synchronize(*d2h).is_ok());
}

TEST(HostDevice, AWaitOnAFailedItemFailsTheWaitingStream) {
  auto dev = HostDevice::create();
  HostOps gate;
  ASSERT_TRUE(dev->enqueue(StreamRole::kH2D, gate.gate(), "gate").is_ok());
  ASSERT_TRUE(dev->enqueue(StreamRole::kH2D, [](const StreamContext&) { return Status::internal("upload broke"); },
                           "upload").is_ok());
  Result<Event> uploaded = dev->record(StreamRole::kH2D);
  ASSERT_TRUE(uploaded.is_ok());
  ASSERT_TRUE(dev->wait(StreamRole::kCompute, *uploaded).is_ok());
  Result<Event> computed = dev->record(StreamRole::kCompute);
  ASSERT_TRUE(computed.is_ok());
  gate.open();
  const Status st = dev->synchronize(*computed);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("upload broke"), std::string::npos) << st.message();
  EXPECT_FALSE(dev->synchronize_all().is_ok());
}

TEST(HostDevice, PoisonedBlocksReadAsNaN) {
  HostDeviceOptions o;
  o.poison_new_blocks = true;
  auto dev = HostDevice::create(o);
  Result<DeviceBlock> b = dev->allocate(4096, StreamRole::kCompute, "activations");
  ASSERT_TRUE(b.is_ok());
  EXPECT_TRUE(std::isnan(b->as<float>()[0]));
  EXPECT_TRUE(std::isnan(b->as<float>()[b->capacity() / sizeof(float) - 1]));
  b->as<float>()[0] = 1.0f;
  b->reset();
  Result<DeviceBlock> again = dev->allocate(4096, StreamRole::kCompute, "activations");
  ASSERT_TRUE(again.is_ok());
  EXPECT_TRUE(std::isnan(again->as<float>()[0])) << "a reused block is poisoned again";
}

TEST(HostDevice, DescribeNamesTheDelays) {
  EXPECT_EQ(HostDevice::create()->describe(), "host device");
  EXPECT_EQ(HostDevice::create(delayed(9, false))->describe(), "host device (delays up to 300 us, seed 9)");
}

TEST(HostDevice, TheCapIsAnErrorNamingTheRequest) {
  HostDeviceOptions o;
  o.memory_cap = 4 << 20;
  auto dev = HostDevice::create(o);
  Result<DeviceBlock> a = dev->allocate(3 << 20, StreamRole::kCompute, "a");
  ASSERT_TRUE(a.is_ok());
  Result<DeviceBlock> b = dev->allocate(3 << 20, StreamRole::kCompute, "layer 2 gathered weights");
  ASSERT_FALSE(b.is_ok());
  EXPECT_EQ(b.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("layer 2 gathered weights"), std::string::npos) << b.status().message();
}

}  // namespace
}  // namespace zinf::device

namespace zinf::device {
namespace {

// The step times' table drives their arithmetic and the JSON log: every field goes through it.
TEST(StepTimes, SumAndDifferenceGoFieldByField) {
  StepTimes a, b;
  double x = 1.0;
  for (const auto& f : kStepTimeSeconds) a.*f.member = (x += 1.0);
  std::uint64_t k = 10;
  for (const auto& f : kStepTimeCounts) a.*f.member = (k += 7);
  b += a;
  b += a;
  const StepTimes d = b - a;
  for (const auto& f : kStepTimeSeconds) EXPECT_EQ(d.*f.member, a.*f.member) << f.json_key;
  for (const auto& f : kStepTimeCounts) EXPECT_EQ(d.*f.member, a.*f.member) << f.json_key;
  EXPECT_EQ(b.upload_bytes, 2 * a.upload_bytes);
  EXPECT_EQ(b.gpu_compute_s, 2 * a.gpu_compute_s);
}

}  // namespace
}  // namespace zinf::device
