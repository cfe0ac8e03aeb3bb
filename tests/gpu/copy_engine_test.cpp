// The copy engine: H2D/D2H round trips from the existing pinned memory (PinnedBuffer, PinnedPool),
// event ordering held by a gate the host opens, and errors that name the copy.
#include "gpu/copy_engine.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "gate_kernel.h"
#include "gpu/device.h"
#include "gpu/device_buffer.h"
#include "gpu/host_staging.h"
#include "aio/pinned_cuda.h"
#include "gpu_test_util.h"
#include "zinf/aio/pinned.h"
#include "zinf/swap/pinned_pool.h"

namespace zinf::gpu {
namespace {

TEST(CopyEngineWithoutGpu, CreatingOneSaysThereIsNoDevice) {
  ZINF_REQUIRE_NO_GPU();
  const auto engine = CopyEngine::create(0);
  ASSERT_FALSE(engine.is_ok());
  EXPECT_EQ(engine.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(engine.status().message().find("no CUDA device"), std::string::npos) << engine.status().message();
  // Pinned memory stays usable without a GPU; it is just not registered.
  Result<aio::PinnedBuffer> host = aio::PinnedBuffer::allocate(4096);
  ASSERT_TRUE(host.is_ok());
  EXPECT_FALSE(host->cuda_registered());
}

class CopyEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ZINF_REQUIRE_GPU();
    auto engine = CopyEngine::create(0);
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    engine_ = std::move(engine).value();
  }
  static aio::PinnedBuffer pinned(std::size_t bytes) {
    Result<aio::PinnedBuffer> b = aio::PinnedBuffer::allocate(bytes);
    EXPECT_TRUE(b.is_ok()) << b.status().to_string();
    if (!b.is_ok()) return aio::PinnedBuffer();
    EXPECT_TRUE(b->cuda_registered()) << "PinnedBuffer memory is registered with CUDA when a GPU is present";
    return std::move(b).value();
  }
  static DeviceBuffer device(std::size_t bytes) {
    Result<DeviceBuffer> b = DeviceBuffer::allocate(0, bytes, "copy test buffer");
    EXPECT_TRUE(b.is_ok()) << b.status().to_string();
    return b.is_ok() ? std::move(b).value() : DeviceBuffer();
  }
  std::unique_ptr<CopyEngine> engine_;
};

TEST_F(CopyEngineTest, RoundTripFromPinnedBuffers) {
  constexpr std::size_t bytes = (8u << 20) + 12;  // not a multiple of anything convenient
  aio::PinnedBuffer src = pinned(bytes), dst = pinned(bytes);
  DeviceBuffer dev = device(bytes);
  ASSERT_TRUE(src.data() && dst.data() && dev.data());
  for (std::size_t i = 0; i < bytes; ++i) src.bytes()[i] = static_cast<std::byte>((i * 131) ^ (i >> 9));
  std::memset(dst.data(), 0, bytes);
  Result<Event> up = engine_->copy_h2d(dev.data(), src.data(), bytes, nullptr, "pattern up");
  ASSERT_TRUE(up.is_ok()) << up.status().to_string();
  // The download waits for the upload's event: the two run on different streams.
  Result<Event> down = engine_->copy_d2h(dst.data(), dev.data(), bytes, &up.value(), "pattern down");
  ASSERT_TRUE(down.is_ok()) << down.status().to_string();
  ASSERT_TRUE(down->synchronize().is_ok());
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), bytes), 0);
  const CopyStats s = engine_->stats();
  EXPECT_EQ(s.h2d_copies, 1u);
  EXPECT_EQ(s.h2d_bytes, bytes);
  EXPECT_EQ(s.d2h_copies, 1u);
  EXPECT_EQ(s.d2h_bytes, bytes);
  EXPECT_NE(engine_->h2d_stream().get(), engine_->d2h_stream().get());
}

TEST_F(CopyEngineTest, PinnedPoolBlocksAreRegisteredAndCopy) {
  swap::PinnedPoolOptions o;
  o.budget = swap::PoolBudget{"offload_param", 2, 1 << 20, 2};
  o.pin_memory = true;
  Result<std::unique_ptr<swap::PinnedPool>> pool = swap::PinnedPool::create(o);
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  EXPECT_TRUE(pool.value()->cuda_registered());
  Result<swap::PinnedBlock> a = pool.value()->acquire(1 << 20);
  Result<swap::PinnedBlock> b = pool.value()->acquire(1 << 20);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  const Result<PointerInfo> info = pointer_info(a->data());
  ASSERT_TRUE(info.is_ok());
  EXPECT_EQ(info->kind, PointerKind::kPinnedHost);
  for (std::size_t i = 0; i < a->size(); ++i) a->data()[i] = static_cast<std::byte>(i * 7);
  DeviceBuffer dev = device(a->size());
  Result<Event> up = engine_->copy_h2d(dev.data(), a->data(), a->size(), nullptr, "pool block up");
  ASSERT_TRUE(up.is_ok()) << up.status().to_string();
  Result<Event> down = engine_->copy_d2h(b->data(), dev.data(), a->size(), &up.value(), "pool block down");
  ASSERT_TRUE(down.is_ok()) << down.status().to_string();
  ASSERT_TRUE(engine_->synchronize().is_ok());
  EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size()), 0);
}

// A refused cudaHostRegister is tolerated (the buffer stays usable, unregistered); it must not
// stay behind as the thread's last error, or the next kernel launch would be reported as failing
// with it. Registering the same pages twice is refused by every driver.
TEST_F(CopyEngineTest, ARefusedRegistrationIsNotTheNextLaunchsError) {
  aio::PinnedBuffer b = pinned(1 << 16);
  ASSERT_TRUE(b.cuda_registered());
  EXPECT_FALSE(aio::detail::cuda_host_register(b.data(), b.size()));  // already registered
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  DeviceBuffer dev = device(4096);
  ASSERT_EQ(testing::launch_fill(engine_->h2d_stream().get(), dev.data(), 4096, 0x5a), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_TRUE(engine_->synchronize().is_ok());
}

// GPU staging: a registered PinnedBuffer where CUDA accepts it, cudaHostAlloc where registration
// is refused; both are pinned host memory that the copy engine takes, and round trips agree.
TEST_F(CopyEngineTest, HostStagingFromEitherSourceIsPinnedAndCopies) {
  for (bool force_host_alloc : {false, true}) {
    constexpr std::size_t bytes = (1u << 20) + 40;
    Result<HostStaging> up = HostStaging::allocate(bytes, "test staging up", force_host_alloc);
    Result<HostStaging> down = HostStaging::allocate(bytes, "test staging down", force_host_alloc);
    ASSERT_TRUE(up.is_ok() && down.is_ok()) << up.status().to_string() << " " << down.status().to_string();
    EXPECT_EQ(up->source(), force_host_alloc ? HostStaging::Source::kCudaHostAlloc
                                             : HostStaging::Source::kRegisteredPinnedBuffer);
    const Result<PointerInfo> info = pointer_info(up->data());
    ASSERT_TRUE(info.is_ok());
    EXPECT_EQ(info->kind, PointerKind::kPinnedHost) << host_staging_source_name(up->source());
    for (std::size_t i = 0; i < bytes; ++i) up->bytes()[i] = static_cast<std::byte>(i * 29 + force_host_alloc);
    std::memset(down->data(), 0, bytes);
    DeviceBuffer dev = device(bytes);
    Result<Event> e1 = engine_->copy_h2d(dev.data(), up->data(), bytes, nullptr, "staging up");
    ASSERT_TRUE(e1.is_ok()) << e1.status().to_string();
    Result<Event> e2 = engine_->copy_d2h(down->data(), dev.data(), bytes, &e1.value(), "staging down");
    ASSERT_TRUE(e2.is_ok()) << e2.status().to_string();
    ASSERT_TRUE(e2->synchronize().is_ok());
    EXPECT_EQ(std::memcmp(up->data(), down->data(), bytes), 0) << host_staging_source_name(up->source());
  }
}

TEST_F(CopyEngineTest, ACopyWaitsForItsEvent) {
  constexpr std::size_t bytes = 1 << 20;
  aio::PinnedBuffer host = pinned(bytes);
  DeviceBuffer dev = device(bytes);
  ASSERT_TRUE(host.data() && dev.data());
  std::memset(host.data(), 0, bytes);
  auto compute = Stream::create(0, "compute");
  ASSERT_TRUE(compute.is_ok());
  testing::Gate gate;
  ASSERT_TRUE(gate.error().empty()) << gate.error();
  // compute: [gate] -> fill dev with 9 -> event `filled`.
  ASSERT_EQ(gate.launch(compute->get()), cudaSuccess);
  ASSERT_EQ(testing::launch_fill(compute->get(), dev.data(), bytes, 9), cudaSuccess);
  auto filled = Event::create(0, "filled");
  ASSERT_TRUE(filled.is_ok());
  ASSERT_TRUE(filled->record(*compute).is_ok());
  Result<Event> down = engine_->copy_d2h(host.data(), dev.data(), bytes, &filled.value(), "gradient");
  ASSERT_TRUE(down.is_ok()) << down.status().to_string();
  Result<bool> done = down->query();
  ASSERT_TRUE(done.is_ok());
  EXPECT_FALSE(done.value()) << "the copy completed before the kernel it waits for";
  gate.open();
  ASSERT_TRUE(down->synchronize().is_ok());
  EXPECT_FALSE(gate.timed_out());
  for (std::size_t i = 0; i < bytes; ++i) ASSERT_EQ(static_cast<int>(host.bytes()[i]), 9) << "byte " << i;
}

TEST_F(CopyEngineTest, PageableHostMemoryIsRefusedUnlessAllowed) {
  std::vector<std::byte> pageable(4096, std::byte{3});
  DeviceBuffer dev = device(4096);
  const Result<Event> refused = engine_->copy_h2d(dev.data(), pageable.data(), 4096, nullptr, "pageable tensor");
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kInvalidArgument);
  const std::string& m = refused.status().message();
  EXPECT_NE(m.find("H2D copy 'pageable tensor' of 4096 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("pageable"), std::string::npos) << m;
  EXPECT_EQ(engine_->stats().h2d_copies, 0u);

  CopyEngineOptions o;
  o.require_pinned_host = false;
  auto lenient = CopyEngine::create(0, o);
  ASSERT_TRUE(lenient.is_ok());
  Result<Event> ok = lenient.value()->copy_h2d(dev.data(), pageable.data(), 4096, nullptr, "pageable tensor");
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  ASSERT_TRUE(ok->synchronize().is_ok());
}

TEST_F(CopyEngineTest, WrongPointersAndRangesAreErrorsNamingTheCopy) {
  aio::PinnedBuffer host = pinned(4096);
  DeviceBuffer dev = device(8192);
  ASSERT_TRUE(host.data() && dev.data());
  // Device and host swapped.
  Result<Event> swapped = engine_->copy_h2d(host.data(), dev.data(), 4096, nullptr, "swapped");
  ASSERT_FALSE(swapped.is_ok());
  EXPECT_EQ(swapped.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(swapped.status().message().find("H2D copy 'swapped'"), std::string::npos) << swapped.status().message();
  // A range that runs past the registered host buffer.
  Result<Event> past = engine_->copy_h2d(dev.data(), host.data(), 8192, nullptr, "too long");
  ASSERT_FALSE(past.is_ok());
  EXPECT_EQ(past.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(past.status().message().find("H2D copy 'too long' of 8192 bytes"), std::string::npos)
      << past.status().message();
  Result<Event> null = engine_->copy_d2h(nullptr, dev.data(), 16, nullptr, "null");
  ASSERT_FALSE(null.is_ok());
  EXPECT_EQ(null.status().code(), ErrorCode::kInvalidArgument);
  // Nothing to copy: still an event, which completes.
  Result<Event> empty = engine_->copy_d2h(nullptr, nullptr, 0, nullptr, "nothing");
  ASSERT_TRUE(empty.is_ok()) << empty.status().to_string();
  EXPECT_TRUE(empty->synchronize().is_ok());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace zinf::gpu
