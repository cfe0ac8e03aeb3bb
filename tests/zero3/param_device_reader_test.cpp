// The device reader on the host device: the bounce path (swap files -> pinned memory -> the H2D
// stream) gives every partition's bytes, under random stream delays and from the CPU tier; and
// every reason aio.use_gds does not get the direct path is one notice, not an error. The direct
// path itself runs against the fake libcufile in tests/gpu (gds_reader_test.cpp).
#include "zero3/param_device_reader.h"

#include <gtest/gtest.h>

#include <cstring>

#include "device/host_device.h"
#include "nvme_param_fixture.h"
#include "zero3/tier_factory.h"

namespace zinf::zero3 {
namespace {

using testing::NoticeCapture;
using testing::NvmeParamFixture;

// A GPUDirect Storage stand-in that opens nothing: only what create() decides is tested here.
class UnusableStorage final : public device::DirectStorage {
 public:
  explicit UnusableStorage(bool host_memory) : host_memory_(host_memory) {}
  std::string describe() const override { return "GPUDirect Storage (stand-in)"; }
  bool addresses_host_memory() const override { return host_memory_; }
  Result<std::unique_ptr<device::DirectFile>> open(const std::string& path, bool) override {
    return Status(ErrorCode::kIoError, "cuFileHandleRegister " + path + ": cuFile error 5027 (stand-in)");
  }

 private:
  bool host_memory_;
};

// use_gds with the stand-in, whose memory is host memory or not.
DirectPathRequest unusable_gds(bool host_memory) {
  return DirectPathRequest{.use_gds = true, .open_storage = [host_memory] {
    return Result<std::shared_ptr<device::DirectStorage>>(std::make_shared<UnusableStorage>(host_memory));
  }};
}

// Reads every partition into a fresh device block and compares it with what was written.
void expect_reads_all(ParamDeviceReader& reader, device::Device& dev, const NvmeParamFixture& f) {
  for (std::size_t p = 0; p < f.layout.params.size(); ++p) {
    ASSERT_EQ(reader.partition_bytes(p), f.contents[p].size());
    auto block = dev.allocate(f.contents[p].size(), device::StreamRole::kH2D, "partition");
    ASSERT_TRUE(block.is_ok()) << block.status().to_string();
    const Status s = reader.read(p, block->data());
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(std::memcmp(block->data(), f.contents[p].data(), f.contents[p].size()), 0) << f.layout.params[p].key;
  }
}

TEST(ParamDeviceReader, BouncesEveryPartitionIntoDeviceMemoryUnderRandomDelays) {
  NvmeParamFixture f;
  ASSERT_TRUE(f.make().is_ok());
  // Poisoned blocks and delayed copies: a copy not waited for leaves 0xFF bytes behind.
  auto dev = device::HostDevice::create(
      {.max_delay = std::chrono::microseconds(300), .seed = 11, .poison_new_blocks = true});
  NoticeCapture notices;
  auto reader = ParamDeviceReader::create(f.layout, *f.tier, *dev, DirectPathRequest{});
  ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
  EXPECT_FALSE((*reader)->direct());
  EXPECT_EQ((*reader)->why_bounce(), "");
  expect_reads_all(**reader, *dev, f);
  std::uint64_t total = 0;
  for (const auto& c : f.contents) total += c.size();
  EXPECT_EQ((*reader)->bytes_bounced(), total);
  EXPECT_EQ((*reader)->bytes_direct(), 0u);
  EXPECT_TRUE(notices.matching("use_gds").empty()) << "use_gds false says nothing";
}

TEST(ParamDeviceReader, ServesCpuTierPartitionsFromMemory) {
  NvmeParamFixture f;
  // The first three partitions (3000, 1, 45000 elements): the last comes to the sink in one call,
  // several staging buffers' worth, so a staging buffer is reused while its copy may be queued.
  ASSERT_TRUE(f.make(/*max_in_cpu=*/48001).is_ok());
  auto dev = device::HostDevice::create(
      {.max_delay = std::chrono::microseconds(300), .seed = 12, .poison_new_blocks = true});
  auto reader = ParamDeviceReader::create(f.layout, *f.tier, *dev, DirectPathRequest{});
  ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
  expect_reads_all(**reader, *dev, f);
}

TEST(ParamDeviceReader, ABuildWithoutTheGpuLayerBouncesWithOneNotice) {
  NvmeParamFixture f;
  ASSERT_TRUE(f.make().is_ok());
  auto dev = device::HostDevice::create({.seed = 13});
  NoticeCapture notices;
  for (int i = 0; i < 2; ++i) {  // a second engine in the process says nothing new
    auto reader = ParamDeviceReader::create(f.layout, *f.tier, *dev, DirectPathRequest{.use_gds = true, .open_storage = nullptr});
    ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
    EXPECT_FALSE((*reader)->direct());
    EXPECT_NE((*reader)->why_bounce().find("no GPU layer"), std::string::npos) << (*reader)->why_bounce();
    expect_reads_all(**reader, *dev, f);
  }
  const auto said = notices.matching("aio.use_gds is true, but this build has no GPU layer");
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("move through pinned host memory"), std::string::npos) << said[0];
}

TEST(ParamDeviceReader, NoGpuBouncesWithOneNoticeWhateverTheLibrarySays) {
  NvmeParamFixture f;
  ASSERT_TRUE(f.make().is_ok());
  auto dev = device::HostDevice::create({.seed = 14});
  NoticeCapture notices;
  // Where libcufile is present, and where it is not: on the host device the reason is the device.
  const DirectPathRequest present = unusable_gds(false);
  const DirectPathRequest absent{.use_gds = true, .open_storage = [] {
    return Result<std::shared_ptr<device::DirectStorage>>(
        Status::unsupported("GPUDirect Storage unavailable: cannot load libcufile.so.0"));
  }};
  for (const DirectPathRequest& request : {present, absent}) {
    auto reader = ParamDeviceReader::create(f.layout, *f.tier, *dev, request);
    ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
    EXPECT_FALSE((*reader)->direct());
    EXPECT_NE((*reader)->why_bounce().find("there is no GPU (the engine's device is the host device"),
              std::string::npos)
        << (*reader)->why_bounce();
  }
  EXPECT_EQ(notices.matching("aio.use_gds is true, but there is no GPU").size(), 1u);
}

TEST(ParamDeviceReader, ARefusedSwapFileBouncesNamingTheFileAndTheError) {
  NvmeParamFixture f;
  ASSERT_TRUE(f.make().is_ok());
  auto dev = device::HostDevice::create({.seed = 15});
  NoticeCapture notices;
  auto reader = ParamDeviceReader::create(f.layout, *f.tier, *dev, unusable_gds(true));
  ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
  EXPECT_FALSE((*reader)->direct());
  const std::string file = f.tier->nvme_swapper()->store().data_files()[0];
  const auto said = notices.matching("refused the swap file");
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("cuFileHandleRegister " + file + ": cuFile error 5027"), std::string::npos) << said[0];
  expect_reads_all(**reader, *dev, f);
}

// The gather targets make_tiers builds do not read through the reader yet: use_gds with NVMe
// parameters is one notice per target kind, naming why, and nothing with the parameters in memory.
TEST(ParamDeviceReader, TheTierFactorySaysOnceWhyUseGdsIsNotServed) {
  ::zinf::testing::TempDir dir("use_gds_");
  const swap::PartitionLayout layout = swap::PartitionLayout::build(testing::kReaderPartitions, 8192);
  auto host_device = device::HostDevice::create({.max_delay = std::chrono::microseconds(1), .seed = 16});
  NoticeCapture notices;
  for (device::Device* gather_device : {static_cast<device::Device*>(nullptr), static_cast<device::Device*>(host_device.get())}) {
    for (const config::OffloadDevice param : {config::OffloadDevice::kCpu, config::OffloadDevice::kNvme,
                                              config::OffloadDevice::kNvme}) {
      config::DsConfig ds;
      ds.aio.use_gds = true;
      ds.zero.offload_param.device = param;
      ds.zero.offload_param.nvme_path = dir.sub("params");
      ds.zero.offload_param.buffer_size = 16384;
      ds.zero.offload_param.buffer_count = 3;
      TierContext context{ds, layout, 0, swap::DType::kBF16, nullptr};
      context.device = gather_device;
      Result<Tiers> made = make_tiers(context, optim::Optimizer(optim::OptimizerConfig{optim::AdamParams{}}));
      ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    }
  }
  EXPECT_EQ(notices.matching("aio.use_gds is true, but this engine gathers parameters in host memory").size(), 1u);
  EXPECT_EQ(notices.matching("aio.use_gds is true, but there is no GPU (the engine's device is the host device (delays "
                             "up to 1 us, seed 16))").size(),
            1u);
}

TEST(ParamDeviceReader, OnlyAnNvmeTierIsRead) {
  const swap::PartitionLayout layout = swap::PartitionLayout::build(testing::kReaderPartitions, 8192);
  auto tier = make_memory_param_tier(layout, swap::DType::kBF16);
  ASSERT_TRUE(tier.is_ok());
  auto dev = device::HostDevice::create({});
  auto reader = ParamDeviceReader::create(layout, **tier, *dev, DirectPathRequest{});
  ASSERT_FALSE(reader.is_ok());
  EXPECT_EQ(reader.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(reader.status().message().find("this one is memory (bf16)"), std::string::npos)
      << reader.status().message();
}

TEST(ParamDeviceReader, BadArgumentsNameThePartition) {
  NvmeParamFixture f;
  ASSERT_TRUE(f.make().is_ok());
  auto dev = device::HostDevice::create({});
  auto reader = ParamDeviceReader::create(f.layout, *f.tier, *dev, DirectPathRequest{});
  ASSERT_TRUE(reader.is_ok());
  const Status past = (*reader)->read(5, nullptr);
  EXPECT_EQ(past.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(past.message().find("partition 5 into device memory: the layout has 5"), std::string::npos)
      << past.message();
  const Status null = (*reader)->read(0, nullptr);
  EXPECT_NE(null.message().find("'h.0.attn' into device memory: a null pointer"), std::string::npos)
      << null.message();
}

}  // namespace
}  // namespace zinf::zero3
