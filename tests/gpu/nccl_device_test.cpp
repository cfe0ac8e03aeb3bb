// The NCCL communicator's device-buffer collectives at world size 1 (local bootstrap): results are
// checked against the inputs and against the host-buffer path. Skips without a CUDA device.
#include "zero3/comm_nccl_device.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "zinf/aio/pinned.h"
#include "gpu/cuda_device.h"
#include "gpu/device_buffer.h"
#include "gpu/stream.h"
#include "gpu_test_util.h"
#include "zero3/device_collectives.h"
#include "zinf/zero3/comm_nccl.h"

namespace zinf::zero3 {
namespace {

TEST(NcclDeviceCollectives, OtherCommunicatorsHaveNone) {
  std::unique_ptr<Communicator> local = make_local_communicator();
  EXPECT_EQ(nccl_device_collectives(*local), nullptr);
}

class NcclDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ZINF_REQUIRE_GPU();
    auto c = make_nccl_communicator(make_local_communicator(), std::chrono::seconds(60));
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    comm_ = std::move(c).value();
    dc_ = nccl_device_collectives(*comm_);
    ASSERT_NE(dc_, nullptr);
    EXPECT_EQ(dc_->device(), 0);
    auto s = gpu::Stream::create(dc_->device(), "nccl test");
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    stream_ = std::move(s).value();
  }
  gpu::DeviceBuffer upload(const std::vector<float>& host) {
    auto b = gpu::DeviceBuffer::allocate(dc_->device(), host.size() * sizeof(float), "nccl test input");
    EXPECT_TRUE(b.is_ok()) << b.status().to_string();
    if (!b.is_ok()) return {};
    // On the stream the collectives use, then waited for: a pageable cudaMemcpy on the legacy
    // stream may return before its DMA lands, and a non-blocking stream does not wait for it.
    EXPECT_EQ(cudaMemcpyAsync(b->data(), host.data(), b->size(), cudaMemcpyHostToDevice, stream_.get()), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
    return std::move(b).value();
  }
  std::vector<float> download(const gpu::DeviceBuffer& b) {
    std::vector<float> host(b.size() / sizeof(float));
    EXPECT_EQ(cudaMemcpyAsync(host.data(), b.data(), b.size(), cudaMemcpyDeviceToHost, stream_.get()), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
    return host;
  }
  static std::vector<float> pattern(std::size_t n) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 1000) * 0.001f - static_cast<float>(i % 7);
    return v;
  }
  std::unique_ptr<Communicator> comm_;
  NcclDeviceCollectives* dc_ = nullptr;
  gpu::Stream stream_;
};

TEST_F(NcclDeviceTest, ReduceScatterAtWorldSizeOneIsAnExactCopyAndMatchesTheHostPath) {
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{1} << 22}) {
    const std::vector<float> in = pattern(n);
    gpu::DeviceBuffer send = upload(in);
    auto recv = gpu::DeviceBuffer::allocate(0, n * sizeof(float), "nccl test output");
    ASSERT_TRUE(recv.is_ok());
    ASSERT_EQ(cudaMemsetAsync(recv->data(), 0xFF, recv->size(), stream_.get()), cudaSuccess);  // ordered before the collective
    ASSERT_TRUE(dc_->reduce_scatter_device(send.as<float>(), recv->as<float>(), n, stream_.get()).is_ok());
    const Status waited = dc_->wait_device(stream_.get(), "reduce_scatter_device");
    ASSERT_TRUE(waited.is_ok()) << waited.to_string();
    const std::vector<float> out = download(recv.value());
    ASSERT_EQ(std::memcmp(out.data(), in.data(), n * sizeof(float)), 0) << "n = " << n;
    // The host path (staged, rank-order sum) gives the same bits at W = 1.
    std::vector<float> host_out(n, -1.0f);
    ASSERT_TRUE(comm_->reduce_scatter(in, host_out).is_ok());
    EXPECT_EQ(std::memcmp(host_out.data(), out.data(), n * sizeof(float)), 0) << "n = " << n;
  }
}

TEST_F(NcclDeviceTest, AllGatherOutOfPlaceAndInPlace) {
  const std::size_t n = 12345;
  const std::vector<float> in = pattern(n);
  gpu::DeviceBuffer send = upload(in);
  auto recv = gpu::DeviceBuffer::allocate(0, n * sizeof(float), "all_gather output");
  ASSERT_TRUE(recv.is_ok());
  ASSERT_TRUE(dc_->all_gather_device(send.as<float>(), recv->as<float>(), n, stream_.get()).is_ok());
  ASSERT_TRUE(dc_->wait_device(stream_.get(), "all_gather_device").is_ok());
  EXPECT_EQ(download(recv.value()), in);
  // In place: rank 0's block is the start of recv.
  gpu::DeviceBuffer both = upload(in);
  ASSERT_TRUE(dc_->all_gather_device(both.as<float>(), both.as<float>(), n, stream_.get()).is_ok());
  ASSERT_TRUE(dc_->wait_device(stream_.get(), "all_gather_device in place").is_ok());
  EXPECT_EQ(download(both), in);
  // The host-buffer collectives still work after device ones were waited for.
  std::vector<float> host_out(n);
  ASSERT_TRUE(comm_->all_gather(in, host_out).is_ok());
  EXPECT_EQ(host_out, in);
}

TEST_F(NcclDeviceTest, EmptyIsANoOpAndNullIsAnError) {
  EXPECT_TRUE(dc_->reduce_scatter_device(nullptr, nullptr, 0, stream_.get()).is_ok());
  EXPECT_TRUE(dc_->all_gather_device(nullptr, nullptr, 0, stream_.get()).is_ok());
  const Status st = dc_->reduce_scatter_device(nullptr, nullptr, 16, stream_.get());
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("reduce_scatter_device"), std::string::npos) << st.message();
  EXPECT_TRUE(dc_->wait_device(stream_.get(), "nothing").is_ok());
}

// What the device-resident engine all-gathers and reduce-scatters with at W > 1
// (device_collectives.h), on a CUDA device: NCCL's collectives enqueued through the device's work
// items on its D2H stream. At W = 1 both are in-place identities, which checks the plumbing (the
// native stream, the in-place pointers, finish()) on a GPU; W > 1 needs two GPUs.
TEST_F(NcclDeviceTest, DeviceCollectivesOnACudaDeviceAreNcclsInPlace) {
  auto dev = gpu::make_cuda_device({.device = dc_->device()});
  ASSERT_TRUE(dev.is_ok()) << dev.status().to_string();
  auto made = make_device_collectives(*dev.value(), *comm_);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  EXPECT_NE(made.value()->describe().find("NCCL"), std::string::npos) << made.value()->describe();
  constexpr std::size_t n = 1000;
  const std::vector<float> in = pattern(n);
  auto block = dev.value()->allocate(n * sizeof(float), device::StreamRole::kD2H, "collectives test");
  ASSERT_TRUE(block.is_ok()) << block.status().to_string();
  auto host = aio::PinnedBuffer::allocate(n * sizeof(float));
  ASSERT_TRUE(host.is_ok()) << host.status().to_string();
  std::memcpy(host->data(), in.data(), n * sizeof(float));
  device::Device& d = *dev.value();
  ASSERT_TRUE(d.copy_h2d(block->data(), host->data(), n * sizeof(float), "collectives test").is_ok());
  ASSERT_TRUE(d.wait(device::StreamRole::kD2H, d.record(device::StreamRole::kH2D).value()).is_ok());
  ASSERT_TRUE(made.value()->all_gather(device::StreamRole::kD2H, block->as<float>(), n).is_ok());
  ASSERT_TRUE(made.value()->reduce_scatter(device::StreamRole::kD2H, block->as<float>(), n).is_ok());
  std::memset(host->data(), 0xFF, n * sizeof(float));
  ASSERT_TRUE(d.copy_d2h(host->data(), block->data(), n * sizeof(float), "collectives test").is_ok());
  const Status finished = made.value()->finish();
  ASSERT_TRUE(finished.is_ok()) << finished.to_string();
  ASSERT_TRUE(d.synchronize(d.record(device::StreamRole::kD2H).value()).is_ok());
  EXPECT_EQ(std::memcmp(host->data(), in.data(), n * sizeof(float)), 0);
}

}  // namespace
}  // namespace zinf::zero3
