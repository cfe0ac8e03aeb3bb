// Device discovery, streams, events and device buffers. Tests that need a device skip, naming why,
// without one; the no-device behaviour is tested on machines without one.
#include "gpu/device.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "gate_kernel.h"
#include "gpu/device_buffer.h"
#include "gpu/stream.h"
#include "gpu_test_util.h"

namespace zinf::gpu {
namespace {

TEST(DeviceWithoutGpu, NoDeviceIsUnsupportedNamingCudasReason) {
  ZINF_REQUIRE_NO_GPU();
  const Result<int> count = device_count();
  ASSERT_FALSE(count.is_ok());
  EXPECT_EQ(count.status().code(), ErrorCode::kUnsupported);
  EXPECT_EQ(count.status().message().rfind("no CUDA device: ", 0), 0u) << count.status().message();
  const Result<DeviceInfo> info = select_device(0);
  ASSERT_FALSE(info.is_ok());
  EXPECT_EQ(info.status().code(), ErrorCode::kUnsupported) << info.status().to_string();
  EXPECT_EQ(device_info(-1).status().code(), ErrorCode::kInvalidArgument);
  const Result<DeviceBuffer> buffer = DeviceBuffer::allocate(0, 4096, "a test buffer");
  EXPECT_FALSE(buffer.is_ok());
  const Result<Stream> stream = Stream::create(0, "test");
  EXPECT_FALSE(stream.is_ok());
}

TEST(Device, PropertiesOfEveryDevice) {
  ZINF_REQUIRE_GPU();
  const Result<int> count = device_count();
  ASSERT_TRUE(count.is_ok()) << count.status().to_string();
  ASSERT_GT(count.value(), 0);
  for (int d = 0; d < count.value(); ++d) {
    const Result<DeviceInfo> info = device_info(d);
    ASSERT_TRUE(info.is_ok()) << info.status().to_string();
    EXPECT_EQ(info->ordinal, d);
    EXPECT_FALSE(info->name.empty());
    EXPECT_FALSE(info->pci_bus_id.empty());
    EXPECT_GT(info->sm_count, 0);
    EXPECT_GE(info->cc_major, 8) << "zinf's kernels are built for sm_80 and sm_90: " << info->to_string();
    EXPECT_GT(info->total_memory, 0u);
    EXPECT_TRUE(info->unified_addressing);
    EXPECT_NE(info->to_string().find(info->name), std::string::npos);
    const Result<MemoryInfo> mem = memory_info(d);
    ASSERT_TRUE(mem.is_ok()) << mem.status().to_string();
    EXPECT_EQ(mem->total, info->total_memory);
    EXPECT_LE(mem->free, mem->total);
  }
  const Status beyond = device_info(count.value()).status();
  EXPECT_EQ(beyond.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(beyond.message().find("does not exist"), std::string::npos) << beyond.message();
  EXPECT_EQ(select_device(-1).status().code(), ErrorCode::kInvalidArgument);
}

TEST(Device, SelectDeviceMakesItCurrentAndTheGuardRestores) {
  ZINF_REQUIRE_GPU();
  const Result<int> count = device_count();
  ASSERT_TRUE(count.is_ok());
  const int last = count.value() - 1;
  ASSERT_TRUE(select_device(0).is_ok());
  {
    Result<DeviceGuard> guard = DeviceGuard::enter(last);
    ASSERT_TRUE(guard.is_ok()) << guard.status().to_string();
    int current = -1;
    ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
    EXPECT_EQ(current, last);
  }
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0);
}

TEST(Device, PointerKinds) {
  ZINF_REQUIRE_GPU();
  std::vector<int> pageable(16);
  const Result<PointerInfo> host = pointer_info(pageable.data());
  ASSERT_TRUE(host.is_ok()) << host.status().to_string();
  EXPECT_EQ(host->kind, PointerKind::kPageableHost);
  Result<DeviceBuffer> dev = DeviceBuffer::allocate(0, 4096, "pointer kind probe");
  ASSERT_TRUE(dev.is_ok()) << dev.status().to_string();
  const Result<PointerInfo> d = pointer_info(dev->data());
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(d->kind, PointerKind::kDevice);
  EXPECT_EQ(d->device, 0);
}

TEST(DeviceBuffer, RoundTripAndOutOfMemoryNamesTheRequest) {
  ZINF_REQUIRE_GPU();
  constexpr std::size_t n = 1 << 20;
  Result<DeviceBuffer> buf = DeviceBuffer::allocate(0, n * sizeof(std::uint32_t), "round trip");
  ASSERT_TRUE(buf.is_ok()) << buf.status().to_string();
  EXPECT_EQ(buf->size(), n * sizeof(std::uint32_t));
  std::vector<std::uint32_t> in(n), out(n, 0);
  for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<std::uint32_t>(i * 2654435761u);
  ASSERT_EQ(cudaMemcpy(buf->data(), in.data(), buf->size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(out.data(), buf->data(), buf->size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(in, out);
  DeviceBuffer moved = std::move(buf).value();
  EXPECT_NE(moved.data(), nullptr);

  const Result<DeviceBuffer> huge = DeviceBuffer::allocate(0, std::size_t{1} << 60, "an impossible tensor");
  ASSERT_FALSE(huge.is_ok());
  EXPECT_EQ(huge.status().code(), ErrorCode::kResourceExhausted) << huge.status().to_string();
  EXPECT_NE(huge.status().message().find("an impossible tensor"), std::string::npos) << huge.status().message();
  EXPECT_NE(huge.status().message().find("cudaMalloc of 1152921504606846976 bytes"), std::string::npos);
  // The failure left no error behind for the next launch to report.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  const Result<DeviceBuffer> empty = DeviceBuffer::allocate(0, 0, "empty");
  ASSERT_TRUE(empty.is_ok());
  EXPECT_EQ(empty->data(), nullptr);
}

TEST(StreamEvent, AnEventCompletesOnlyAfterTheWorkBeforeIt) {
  ZINF_REQUIRE_GPU();
  Result<Stream> s = Stream::create(0, "compute");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  Result<Event> e = Event::create(0, "after gate");
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  testing::Gate gate;
  ASSERT_TRUE(gate.error().empty()) << gate.error();
  ASSERT_EQ(gate.launch(s->get()), cudaSuccess);
  ASSERT_TRUE(e->record(*s).is_ok());
  Result<bool> done = e->query();
  ASSERT_TRUE(done.is_ok()) << done.status().to_string();
  EXPECT_FALSE(done.value()) << "the event completed while the gate kernel before it still waits";
  // A second stream ordered after the event does not run ahead of the gate either.
  Result<Stream> s2 = Stream::create(0, "consumer");
  ASSERT_TRUE(s2.is_ok());
  ASSERT_TRUE(s2->wait(*e).is_ok());
  Result<Event> e2 = Event::create(0, "consumer done");
  ASSERT_TRUE(e2.is_ok());
  ASSERT_TRUE(e2->record(*s2).is_ok());
  Result<bool> done2 = e2->query();
  ASSERT_TRUE(done2.is_ok());
  EXPECT_FALSE(done2.value());
  gate.open();
  ASSERT_TRUE(e2->synchronize().is_ok());
  EXPECT_FALSE(gate.timed_out());
  done = e->query();
  ASSERT_TRUE(done.is_ok());
  EXPECT_TRUE(done.value());
  EXPECT_TRUE(s->synchronize().is_ok());
}

TEST(StreamEvent, TimingEventsMeasureAndOthersRefuse) {
  ZINF_REQUIRE_GPU();
  Result<Stream> s = Stream::create(0, "timed");
  ASSERT_TRUE(s.is_ok());
  Result<Event> a = Event::create(0, "start", true), b = Event::create(0, "stop", true);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  ASSERT_TRUE(a->record(*s).is_ok());
  ASSERT_TRUE(b->record(*s).is_ok());
  ASSERT_TRUE(b->synchronize().is_ok());
  const Result<float> ms = b->elapsed_ms_since(*a);
  ASSERT_TRUE(ms.is_ok()) << ms.status().to_string();
  EXPECT_GE(ms.value(), 0.0f);
  Result<Event> plain = Event::create(0, "untimed");
  ASSERT_TRUE(plain.is_ok());
  ASSERT_TRUE(plain->record(*s).is_ok());
  ASSERT_TRUE(plain->synchronize().is_ok());
  const Result<float> bad = plain->elapsed_ms_since(*a);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("'untimed'"), std::string::npos) << bad.status().message();
  (void)cudaGetLastError();
}

}  // namespace
}  // namespace zinf::gpu
