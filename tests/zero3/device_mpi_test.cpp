// The device-resident path across ranks, run by meson under `mpirun -np 2` and `-np 3`: device
// collectives (device_collectives.h) on host devices, the coordinator gathering for a model that
// computes on the device's compute stream (what a GPU model does) with W > 1, and the engine doing
// so, each under random stream delays that differ between ranks.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "chain_model.h"
#include "device/host_device.h"
#include "mpi_test_env.h"
#include "zero3/coordinator.h"
#include "zero3/device_collectives.h"
#include "zero3/device_gather_target.h"
#include "zero3/engine_impl.h"
#include "zero3/grad_store.h"
#include "zinf/config/ds_config.h"
#include "zinf/zero3/engine.h"

namespace zinf::zero3 {
namespace {

using device::StreamRole;
using testing::ChainModel;
using testing::comm;
using testing::kSize;
using testing::RecordingTier;
using SkipWait = DeviceGatherOptions::SkipWait;

constexpr int kModules = 10;

std::size_t rank() { return static_cast<std::size_t>(comm().rank()); }
std::size_t world() { return static_cast<std::size_t>(comm().world_size()); }

// Delays that differ between ranks, so that ranks reach each collective at different times.
device::HostDeviceOptions delays(std::uint64_t seed) {
  device::HostDeviceOptions d;
  d.seed = seed * 101 + rank();
  d.max_delay = std::chrono::microseconds(500);
  d.poison_new_blocks = true;
  return d;
}

// Whether any rank saw `wrong`: every rank returns the same answer (and keeps the same collectives).
bool any_rank(bool wrong) {
  std::array<std::uint64_t, 1> n = {wrong ? 1u : 0u};
  EXPECT_TRUE(comm().all_reduce_sum_u64(n).is_ok());
  return n[0] != 0;
}

// The host device's collectives run where the stream is when they are called: after work queued
// on it (here a slow item that writes the block), and before work queued after.
TEST(DeviceMpiTest, HostDeviceCollectivesRunAtTheStreamsPoint) {
  auto dev = device::HostDevice::create(delays(1));
  auto made = make_device_collectives(*dev, comm());
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  DeviceCollectives& coll = *made.value();
  constexpr std::size_t n = 37;
  auto block = dev->allocate(world() * n * sizeof(float), StreamRole::kD2H, "test block");
  ASSERT_TRUE(block.is_ok()) << block.status().to_string();
  float* b = block.value().as<float>();
  const float me = static_cast<float>(rank());

  // All-gather: this rank's slice is written by a late item on the stream.
  ASSERT_TRUE(dev->enqueue(StreamRole::kD2H, [b, me](const device::StreamContext&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    for (std::size_t i = 0; i < n; ++i) b[static_cast<std::size_t>(me) * n + i] = 1000 * me + static_cast<float>(i);
    return Status::ok();
  }, "write my slice").is_ok());
  ASSERT_TRUE(coll.all_gather(StreamRole::kD2H, b, n).is_ok());
  ASSERT_TRUE(dev->synchronize(dev->record(StreamRole::kD2H).value()).is_ok());
  for (std::size_t r = 0; r < world(); ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(b[r * n + i], 1000.0f * static_cast<float>(r) + static_cast<float>(i)) << "slice " << r << " element " << i;
    }
  }

  // Reduce-scatter: every slice written late; slice `rank` becomes the sum over ranks.
  ASSERT_TRUE(dev->enqueue(StreamRole::kD2H, [b, me](const device::StreamContext&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    for (std::size_t i = 0; i < n * world(); ++i) b[i] = (me + 1) * static_cast<float>(i);
    return Status::ok();
  }, "write every slice").is_ok());
  ASSERT_TRUE(coll.reduce_scatter(StreamRole::kD2H, b, n).is_ok());
  ASSERT_TRUE(coll.finish().is_ok());
  const float ranks_sum = static_cast<float>(world() * (world() + 1) / 2);  // sum of (r + 1)
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t at = rank() * n + i;
    ASSERT_EQ(b[at], ranks_sum * static_cast<float>(at)) << "element " << i;
  }
}

// The coordinator on W ranks, each with its own host device, for a model on the compute stream.
// Each rank's tier serves its slice of partition p as p + 1 + 64 * rank (exact in bf16 too), so a
// slice in the wrong place shows. With bf16 values (DeviceGatherOptions::values) the model asks
// for them as a GPU model does (acquire_bf16) and the all-gathers move 16-bit values.
struct RankHarness {
  std::unique_ptr<device::HostDevice> device;
  ChainModel model;
  PartitionPlan plan;
  swap::PartitionLayout layout;
  std::unique_ptr<GradStore> grads;
  std::unique_ptr<RecordingTier> tier;
  std::unique_ptr<DeviceGatherTarget> target;
  std::unique_ptr<Coordinator> coordinator;

  RankHarness(std::uint64_t seed, SkipWait skip, std::size_t staging_buffers,
              swap::DType values = swap::DType::kF32)
      : device(device::HostDevice::create(delays(seed))),
        model(kModules, device.get(), /*bf16_first=*/values == swap::DType::kBF16),
        plan(model_partition_plan(model.params(), model.modules().size(), comm().world_size()).value()) {
    layout = swap::PartitionLayout::build(layout_partitions(model.params(), model.modules(), plan), 1 << 20);
    grads = std::move(make_memory_grad_store(layout)).value();
    EXPECT_TRUE(grads->begin_step().is_ok());
    tier = std::make_unique<RecordingTier>(plan.num_groups());
    tier->value_offset = 64.0f * static_cast<float>(rank());
    DeviceGatherOptions g;
    g.values = values;
    g.consumer = DeviceGatherOptions::Consumer::kComputeStream;
    g.skip_wait = skip;
    g.staging_buffers = staging_buffers;
    auto collectives = make_device_collectives(*device, comm());
    EXPECT_TRUE(collectives.is_ok()) << collectives.status().to_string();
    g.collectives = std::move(collectives).value();
    auto made = make_device_gather_target(*device, g);
    EXPECT_TRUE(made.is_ok()) << made.status().to_string();
    target = std::move(made).value();
    coordinator = std::make_unique<Coordinator>(model, plan, layout, *tier, *target, comm(),
                                                testing::chain_coordinator_options(), *grads);
  }
  ~RankHarness() {
    coordinator.reset();
    target.reset();
  }

  Result<float> pass() { return testing::chain_pass(model, *coordinator); }

  // A forward reads element 0 of each module's values: rank 0's slice, p + 1.
  static float expected_loss() { return testing::chain_expected_loss(kModules); }
  // Backward adds each use's values into the gradient on every rank; the reduce-scatter sums W
  // such gradients. This rank's partition of p after `passes`: W * uses * (p + 1 + 64 * rank)
  // over the model's elements, zero over the padding.
  std::string gradient_mismatch(int passes) const {
    for (std::size_t p = 0; p < plan.num_groups(); ++p) {
      const std::size_t per_rank = plan.group(p).per_rank;
      const float uses = p == 0 ? 2.0f : 1.0f;
      const float value = static_cast<float>(p + 1) + 64.0f * static_cast<float>(rank());
      const float* acc =
          static_cast<const float*>(grads->step_views()[layout.subgroup_of[p]].data) + layout.offset_in_subgroup[p];
      for (std::size_t i = 0; i < per_rank; ++i) {
        const bool padding = rank() * per_rank + i >= kSize;
        const float want = padding ? 0.0f : static_cast<float>(passes) * static_cast<float>(world()) * uses * value;
        if (acc[i] != want) return fmt::format("rank {} partition {} element {}: {} instead of {}", rank(), p, i, acc[i], want);
      }
    }
    return "";
  }
};

TEST(DeviceMpiTest, TheCoordinatorIsExactAcrossRanksUnderRandomDelays) {
  for (std::uint64_t seed : {1u, 2u, 3u, 4u}) {
    const swap::DType values = seed % 2 == 0 ? swap::DType::kBF16 : swap::DType::kF32;
    RankHarness h(seed, SkipWait::kNone, 4, values);
    for (int pass = 1; pass <= 3; ++pass) {
      auto loss = h.pass();
      ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
      EXPECT_EQ(loss.value(), RankHarness::expected_loss()) << "seed " << seed << " pass " << pass;
    }
    EXPECT_EQ(h.gradient_mismatch(3), "") << "seed " << seed;
    // Every gather all-gathers on the device, every gradient is reduce-scattered there, and only
    // this rank's slice of each comes down: 1/W of the gradient bytes.
    const DeviceGatherStats& d = h.target->device_stats();
    EXPECT_EQ(d.all_gathers, d.uploads);
    EXPECT_EQ(d.reduce_scatters, 3 * h.plan.num_groups());
    std::uint64_t slices = 0;
    for (std::size_t p = 0; p < h.plan.num_groups(); ++p) slices += h.plan.group(p).per_rank * sizeof(float);
    EXPECT_EQ(d.d2h_bytes, 3 * slices);
    if (values == swap::DType::kBF16) {
      EXPECT_GT(h.model.in_place_acquires(), 0u);
      EXPECT_EQ(d.h2d_bytes, d.uploads * h.plan.group(1).per_rank * 2) << "a rank's bf16 slice: 2 bytes a value";
    }
  }
}

// Each new ordering is needed: without the D2H stream's wait for the upload, the all-gather sends
// a slice that has not landed (poison); without the wait for the compute stream, the
// reduce-scatter reads gradients the kernels have not finished.
TEST(DeviceMpiTest, EachCollectiveOrderingIsNeeded) {
  for (const auto& [skip, values] : {std::pair{SkipWait::kUploadBeforeCollective, swap::DType::kF32},
                                     std::pair{SkipWait::kComputeBeforeCopy, swap::DType::kF32},
                                     std::pair{SkipWait::kUploadBeforeCollective, swap::DType::kBF16}}) {
    bool wrong = false;
    for (std::uint64_t seed = 11; seed < 16; ++seed) {
      RankHarness h(seed, skip, 1, values);
      for (int pass = 1; pass <= 3; ++pass) {  // every rank runs every pass: the collectives stay matched
        auto loss = h.pass();
        ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
        wrong = wrong || loss.value() != RankHarness::expected_loss() || std::isnan(loss.value()) ||
                !h.gradient_mismatch(pass).empty();
      }
    }
    EXPECT_TRUE(any_rank(wrong)) << "ordering " << static_cast<int>(skip) << " left out (" << swap::dtype_name(values)
                                 << " values), and nothing noticed";
  }
}

// The engine with EngineDevice kModelDevice on W ranks (a chain model on its host device's compute
// stream, as a GPU model on its GPU) trains to the same bits as the host path on W ranks, with
// the state in memory, on the CPU and on NVMe, with one micro-batch a step and with three, in fp32
// and in bf16 (whose values are gathered as bf16 and read in place, as a GPU model reads them).
TEST(DeviceMpiTest, TheEngineGathersIntoTheModelsDeviceAcrossRanksWithTheSameResults) {
  const char* base = std::getenv("ZINF_TEST_TMPDIR");
  std::string dir = std::string(base != nullptr ? base : "/tmp") + "/device_mpi.XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  for (const int micro_batches : {1, 3}) {
    for (const char* where : {"none", "cpu", "nvme"}) {
      for (const bool bf16 : {false, true}) {
        const std::string nvme = std::string(where) == "nvme" ? fmt::format(R"(, "nvme_path": "{}")", dir) : "";
        const std::string text = fmt::format(R"({{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": {0},
          "gradient_clipping": 1.0, "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-2}}}}, "bf16": {{"enabled": {3}}},
          "zero_optimization": {{"stage": 3, "stage3_param_persistence_threshold": 0, "reduce_bucket_size": 1,
            "offload_param": {{"device": "{1}"{2}}}, "offload_optimizer": {{"device": "{1}"{2}}}}}}})",
                                             micro_batches, where, nvme, bf16 ? "true" : "false");
        config::AutoContext ctx;
        ctx.world_size = comm().world_size();
        auto ds = config::parse_ds_config(text, "device_mpi_test", ctx);
        ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
        const std::vector<std::int32_t> tokens = {0};
        const std::vector<MicroBatch> micro(static_cast<std::size_t>(micro_batches), MicroBatch{tokens, tokens, 1, 1});
        EngineOptions o{ds.value(), 3, ""};
        auto host = testing::train_chain(kModules, nullptr, bf16, o, comm(), micro, 3);
        ASSERT_TRUE(host.is_ok()) << host.status().to_string();
        auto device = device::HostDevice::create(delays(7));
        o.device.kind = EngineDevice::Kind::kModelDevice;
        auto on_device = testing::train_chain(kModules, device.get(), bf16, o, comm(), micro, 3);
        ASSERT_TRUE(on_device.is_ok()) << on_device.status().to_string();
        EXPECT_EQ(on_device->losses, host->losses) << where << ", micro-batches " << micro_batches << ", bf16 " << bf16;
        EXPECT_EQ(on_device->weights, host->weights) << where << ", micro-batches " << micro_batches << ", bf16 " << bf16;
        EXPECT_EQ(on_device->in_place > 0, bf16) << where << ": bf16 values are read in place";
        std::uint64_t h2d = 0, d2h = 0;
        for (const StepReport& r : on_device->reports) {
          h2d += r.h2d_bytes;
          d2h += r.d2h_bytes;
        }
        EXPECT_GT(h2d, 0u) << where;
        // Only this rank's slice of each gradient comes down, each micro-batch (no sums are held
        // on the device with W > 1).
        ChainModel shape(kModules);
        const PartitionPlan plan = model_partition_plan(shape.params(), shape.modules().size(), comm().world_size()).value();
        std::uint64_t slices = 0;
        for (std::size_t p = 0; p < plan.num_groups(); ++p) slices += plan.group(p).per_rank * sizeof(float);
        EXPECT_EQ(d2h, 3 * static_cast<std::uint64_t>(micro_batches) * slices) << where;
      }
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// A GPU-like device whose memory the host cannot read gets device collectives from NCCL only: with
// another communicator the engine says what it needs instead of gathering.
TEST(DeviceMpiTest, CollectivesOnDeviceMemoryNeedNcclOffTheHostDevice) {
  class OpaqueDevice final : public device::Device {
   public:
    explicit OpaqueDevice(device::Device& inner) : inner_(inner) {}
    std::string describe() const override { return "opaque test device"; }
    bool host_addressable() const override { return false; }
    device::StreamKey stream_key(StreamRole r) const override { return inner_.stream_key(r); }
    Result<device::DeviceBlock> allocate(std::size_t b, StreamRole r, std::string_view w) override { return inner_.allocate(b, r, w); }
    device::AllocatorStats allocator_stats() const override { return inner_.allocator_stats(); }
    Result<std::uint64_t> memory_room() const override { return inner_.memory_room(); }
    Status copy_h2d(void* d, const void* s, std::size_t b, std::string_view w) override { return inner_.copy_h2d(d, s, b, w); }
    Status copy_d2h(void* d, const void* s, std::size_t b, std::string_view w) override { return inner_.copy_d2h(d, s, b, w); }
    Status enqueue(StreamRole r, device::Work work, std::string_view w) override { return inner_.enqueue(r, std::move(work), w); }
    Status fill_zero(StreamRole r, void* p, std::size_t b, std::string_view w) override { return inner_.fill_zero(r, p, b, w); }
    Result<device::Event> record(StreamRole r) override { return inner_.record(r); }
    Status wait(StreamRole r, const device::Event& e) override { return inner_.wait(r, e); }
    Status synchronize(const device::Event& e) override { return inner_.synchronize(e); }
    Result<bool> query(const device::Event& e) override { return inner_.query(e); }
    Status synchronize_all() override { return inner_.synchronize_all(); }

   private:
    device::Device& inner_;
  };
  auto host = device::HostDevice::create(delays(2));
  OpaqueDevice opaque(*host);
  auto made = make_device_collectives(opaque, comm());
  ASSERT_FALSE(made.is_ok());
  EXPECT_EQ(made.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(made.status().message().find("NCCL"), std::string::npos) << made.status().to_string();
  EXPECT_NE(made.status().message().find("mpi"), std::string::npos) << made.status().to_string();
}

}  // namespace
}  // namespace zinf::zero3
