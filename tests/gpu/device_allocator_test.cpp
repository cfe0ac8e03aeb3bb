// The caching allocator on a real device: cudaMalloc'ed blocks, cudaEvent fences. The ordering tests
// hold work on a stream with a gate the host opens, so they need no timing assumptions.
#include "gpu/device_allocator.h"

#include <gtest/gtest.h>

#include <vector>

#include "gate_kernel.h"
#include "gpu/device.h"
#include "gpu/stream.h"
#include "gpu_test_util.h"

namespace zinf::gpu {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(DeviceAllocatorWithoutGpu, CreatingOneSaysThereIsNoDevice) {
  ZINF_REQUIRE_NO_GPU();
  const auto alloc = make_device_allocator(0, 0);
  ASSERT_FALSE(alloc.is_ok());
  EXPECT_EQ(alloc.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(alloc.status().message().find("no CUDA device"), std::string::npos) << alloc.status().message();
}

class DeviceAllocatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ZINF_REQUIRE_GPU();
    auto s1 = Stream::create(0, "allocator test s1");
    auto s2 = Stream::create(0, "allocator test s2");
    ASSERT_TRUE(s1.is_ok() && s2.is_ok()) << s1.status().to_string() << s2.status().to_string();
    s1_ = std::move(s1).value();
    s2_ = std::move(s2).value();
  }
  std::unique_ptr<CachingAllocator> make(std::size_t cap) {
    auto a = make_device_allocator(0, cap);
    EXPECT_TRUE(a.is_ok()) << a.status().to_string();
    return a.is_ok() ? std::move(a).value() : nullptr;
  }
  Stream s1_, s2_;
};

TEST_F(DeviceAllocatorTest, BlocksAreDeviceMemoryAndReusedOnTheirStream) {
  auto alloc = make(0);
  ASSERT_NE(alloc, nullptr);
  void* first = nullptr;
  {
    Result<DeviceBlock> b = alloc->allocate(3 * kMiB, s1_.key(), "weights");
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    const Result<PointerInfo> info = pointer_info(b->data());
    ASSERT_TRUE(info.is_ok());
    EXPECT_EQ(info->kind, PointerKind::kDevice);
    // The whole size class is usable.
    ASSERT_EQ(testing::launch_fill(s1_.get(), b->data(), b->capacity(), 7), cudaSuccess);
    first = b->data();
  }
  Result<DeviceBlock> again = alloc->allocate(3 * kMiB, s1_.key(), "weights");
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->data(), first);
  std::vector<unsigned char> host(again->capacity());
  ASSERT_EQ(cudaMemcpyAsync(host.data(), again->data(), host.size(), cudaMemcpyDeviceToHost, s1_.get()), cudaSuccess);
  ASSERT_TRUE(s1_.synchronize().is_ok());
  for (unsigned char c : host) ASSERT_EQ(c, 7);
  EXPECT_EQ(alloc->stats().backend_allocations, 1u);
}

TEST_F(DeviceAllocatorTest, ABlockUsedOnAnotherStreamWaitsForThatWork) {
  auto alloc = make(0);
  ASSERT_NE(alloc, nullptr);
  testing::Gate gate;
  ASSERT_TRUE(gate.error().empty()) << gate.error();
  void* first = nullptr;
  {
    Result<DeviceBlock> b = alloc->allocate(kMiB, s1_.key(), "activation");
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    // s2 holds at the gate, then writes the block: it is still in use after the lease ends.
    ASSERT_EQ(gate.launch(s2_.get()), cudaSuccess);
    ASSERT_EQ(testing::launch_fill(s2_.get(), b->data(), b->capacity(), 1), cudaSuccess);
    b->record_use(s2_.key());
    first = b->data();
  }
  // `during` stays held below, so that once s2's work is done the only cached block is `first`
  // (had it been returned, either of two idle blocks could serve the next request).
  Result<DeviceBlock> during = alloc->allocate(kMiB, s1_.key(), "activation");
  ASSERT_TRUE(during.is_ok()) << during.status().to_string();
  EXPECT_NE(during->data(), first) << "handed out while a kernel on another stream may still write it";
  gate.open();
  ASSERT_TRUE(s2_.synchronize().is_ok());
  EXPECT_FALSE(gate.timed_out());
  Result<DeviceBlock> after = alloc->allocate(kMiB, s1_.key(), "activation");
  ASSERT_TRUE(after.is_ok());
  EXPECT_EQ(after->data(), first);
}

TEST_F(DeviceAllocatorTest, TheCapAndTheDeviceLimitAreErrorsNamingTheRequest) {
  auto alloc = make(8 * kMiB);
  ASSERT_NE(alloc, nullptr);
  Result<DeviceBlock> a = alloc->allocate(6 * kMiB, s1_.key(), "a");
  ASSERT_TRUE(a.is_ok());
  Result<DeviceBlock> b = alloc->allocate(4 * kMiB, s1_.key(), "the second tensor");
  ASSERT_FALSE(b.is_ok());
  EXPECT_EQ(b.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("GPU 0 memory"), std::string::npos) << b.status().message();
  EXPECT_NE(b.status().message().find("the second tensor"), std::string::npos) << b.status().message();
  a.value().reset();
  Result<std::size_t> freed = alloc->release_cached();
  ASSERT_TRUE(freed.is_ok()) << freed.status().to_string();
  EXPECT_EQ(freed.value(), 6 * kMiB);
  EXPECT_EQ(alloc->stats().reserved, 0u);

  auto uncapped = make(0);
  ASSERT_NE(uncapped, nullptr);
  Result<DeviceBlock> huge = uncapped->allocate(std::size_t{1} << 50, s1_.key(), "a petabyte");
  ASSERT_FALSE(huge.is_ok());
  EXPECT_EQ(huge.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("a petabyte"), std::string::npos) << huge.status().message();
  EXPECT_NE(huge.status().message().find("cudaErrorMemoryAllocation"), std::string::npos) << huge.status().message();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace zinf::gpu
