// The coordinator on a host device (device_gather_target.h): gathered values and gradients in
// device memory, moved through the copy streams under random delays. What no bit-identity test
// of the engine can see on its own: that uploads run ahead of use, that device memory stays
// within the budget, and that each wait the target makes is needed (removing one, through the
// target's test hook, gives wrong numbers under delays).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "chain_model.h"
#include "temp_dir.h"
#include "device/host_device.h"
#include "zero3/coordinator.h"
#include "zero3/device_gather_target.h"
#include "zero3/engine_impl.h"
#include "zero3/grad_store.h"
#include "zinf/config/ds_config.h"
#include "zinf/zero3/engine.h"

namespace zinf::zero3 {
namespace {

using testing::ChainModel;
using testing::kSize;
using testing::RecordingTier;
using SkipWait = DeviceGatherOptions::SkipWait;

constexpr int kModules = 10;  // m1..m10 between embed and head

CoordinatorOptions options() { return testing::chain_coordinator_options(); }

device::HostDeviceOptions delays(std::uint64_t seed) {
  device::HostDeviceOptions d;
  d.seed = seed;
  d.max_delay = std::chrono::microseconds(500);
  d.poison_new_blocks = true;
  return d;
}

struct DeviceHarness {
  std::unique_ptr<device::HostDevice> device;  // before the model, which may enqueue on it
  ChainModel model;
  PartitionPlan plan;
  swap::PartitionLayout layout;
  std::unique_ptr<Communicator> comm = make_local_communicator();
  std::unique_ptr<GradStore> grads;
  std::unique_ptr<RecordingTier> tier;
  std::unique_ptr<DeviceGatherTarget> target;
  std::unique_ptr<Coordinator> coordinator;

  DeviceHarness(const CoordinatorOptions& o, const device::HostDeviceOptions& d, DeviceGatherOptions g = {},
                bool pinned_bf16 = false)
      : device(device::HostDevice::create(d)),
        model(kModules, g.consumer == DeviceGatherOptions::Consumer::kComputeStream ? device.get() : nullptr,
              /*bf16_first=*/g.values == swap::DType::kBF16),
        plan(model_partition_plan(model.params(), model.modules().size(), 1).value()) {
    layout = swap::PartitionLayout::build(layout_partitions(model.params(), model.modules(), plan), 1 << 20);
    grads = std::move(make_memory_grad_store(layout)).value();
    EXPECT_TRUE(grads->begin_step().is_ok());
    tier = std::make_unique<RecordingTier>(plan.num_groups(), pinned_bf16);
    auto made = make_device_gather_target(*device, g);
    EXPECT_TRUE(made.is_ok()) << made.status().to_string();
    target = std::move(made).value();
    coordinator = std::make_unique<Coordinator>(model, plan, layout, *tier, *target, *comm, o, *grads);
  }
  ~DeviceHarness() {
    coordinator.reset();  // its blocks go back before the target and the device go
    target.reset();
  }

  // One training pass; its loss.
  Result<float> pass() {
    tier->new_pass();
    return testing::chain_pass(model, *coordinator);
  }

  // What `passes` passes must give: the chain's loss, and backward adds each use's value into
  // its gradient.
  static float expected_loss() { return testing::chain_expected_loss(kModules); }
  // The first mismatch of the accumulated gradients after `passes` passes, or "".
  std::string gradient_mismatch(int passes) const {
    for (std::size_t p = 0; p < plan.num_groups(); ++p) {
      const float uses = p == 0 ? 2.0f : 1.0f;
      const float want = static_cast<float>(passes) * uses * static_cast<float>(p + 1);
      const float* acc =
          static_cast<const float*>(grads->step_views()[layout.subgroup_of[p]].data) + layout.offset_in_subgroup[p];
      for (std::size_t i = 0; i < kSize; ++i) {
        if (acc[i] != want) return fmt::format("partition {} element {}: {} instead of {}", p, i, acc[i], want);
      }
    }
    return "";
  }
};

TEST(DeviceCoordinatorTest, ResultsAreExactUnderRandomDelays) {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    DeviceHarness h(options(), delays(seed));
    for (int pass = 1; pass <= 3; ++pass) {
      auto loss = h.pass();
      ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
      EXPECT_EQ(loss.value(), DeviceHarness::expected_loss()) << "seed " << seed << " pass " << pass;
    }
    EXPECT_EQ(h.gradient_mismatch(3), "") << "seed " << seed;
  }
}

TEST(DeviceCoordinatorTest, UploadsRunAheadAlongTheTraceAndGradientsComeBackThroughTheCopyStream) {
  DeviceHarness h(options(), delays(4));
  ASSERT_TRUE(h.pass().is_ok());
  EXPECT_EQ(h.coordinator->stats().gathers_ahead, 0u) << "no trace yet: nothing to run ahead of";
  ASSERT_TRUE(h.pass().is_ok());
  const CoordinatorStats& s = h.coordinator->stats();
  // 24 acquires a pass; all but the pass's first (and head's backward, which reuses forward's p0
  // copy) are served by a gather started while the module before computed.
  EXPECT_EQ(s.ahead_hits, 22u);
  EXPECT_EQ(s.gathers_ahead, 22u);
  // Every gradient partition's download: 11 a pass.
  EXPECT_EQ(s.grad_downloads, 22u);
  const DeviceGatherStats& d = h.target->device_stats();
  EXPECT_EQ(d.d2h_bytes, 22u * kSize * sizeof(float));
  EXPECT_EQ(d.h2d_bytes, d.uploads * kSize * sizeof(float));
}

// Gathered and gradient blocks are device memory: at most three gathered parameters and the two
// gradients one rank holds at once (p0's, waiting for embed, and the module's), each a 512-byte
// size class, whatever the delays.
TEST(DeviceCoordinatorTest, DeviceMemoryStaysWithinTheLiveBudget) {
  CoordinatorOptions o = options();
  o.max_live_parameters = 3 * kSize + 50;
  o.max_reuse_distance = 1000000000;
  DeviceHarness h(o, delays(5));
  for (int pass = 1; pass <= 3; ++pass) ASSERT_TRUE(h.pass().is_ok());
  EXPECT_LE(h.coordinator->stats().live_high_water, o.max_live_parameters);
  EXPECT_GT(h.coordinator->stats().evictions, 0u) << "the budget never bound: the test would prove nothing";
  EXPECT_LE(h.device->allocator_stats().peak_in_use, 5u * 512u);
  EXPECT_EQ(h.gradient_mismatch(3), "");
}

TEST(DeviceCoordinatorTest, ADeviceMemoryCapTooSmallIsAClearError) {
  device::HostDeviceOptions d = delays(6);
  d.memory_cap = 1024;  // two blocks
  DeviceHarness h(options(), d);
  auto loss = h.pass();
  ASSERT_FALSE(loss.is_ok());
  EXPECT_NE(loss.status().message().find("device memory"), std::string::npos) << loss.status().to_string();
}

// Each wait the target makes, left out: the results go wrong under the same delays that give
// exact results with it (ResultsAreExactUnderRandomDelays).
TEST(DeviceCoordinatorTest, EachWaitIsNeeded) {
  for (SkipWait skip : {SkipWait::kUploadBeforeUse, SkipWait::kDownloadBeforeRead}) {
    DeviceGatherOptions g;
    g.skip_wait = skip;
    g.staging_buffers = 1;  // one buffer shared by uploads and downloads: reuse comes at once
    DeviceHarness h(options(), delays(7), g);
    bool wrong = false;
    for (int pass = 1; pass <= 3 && !wrong; ++pass) {
      auto loss = h.pass();
      ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
      wrong = loss.value() != DeviceHarness::expected_loss() || std::isnan(loss.value());
      if (!wrong) wrong = !h.gradient_mismatch(pass).empty();
    }
    EXPECT_TRUE(wrong) << "wait " << static_cast<int>(skip) << " left out, and nothing noticed";
  }
}

// A consumer on the compute stream (a GPU model: the host only enqueues, model::Model::
// compute_device()): exact under random delays, and each ordering the target adds for it is
// needed: without the compute stream's wait for the upload, or without the copy streams' wait for
// the compute work enqueued before a block was released (a reused block overwritten while
// still read) or before grads_ready (a gradient downloaded before it was written), results go wrong.
DeviceGatherOptions on_stream(SkipWait skip = SkipWait::kNone) {
  DeviceGatherOptions g;
  g.consumer = DeviceGatherOptions::Consumer::kComputeStream;
  g.skip_wait = skip;
  return g;
}

TEST(DeviceCoordinatorTest, AComputeStreamConsumerGetsExactResultsUnderRandomDelays) {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    DeviceHarness h(options(), delays(seed), on_stream());
    for (int pass = 1; pass <= 3; ++pass) {
      auto loss = h.pass();
      ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
      EXPECT_EQ(loss.value(), DeviceHarness::expected_loss()) << "seed " << seed << " pass " << pass;
    }
    EXPECT_EQ(h.gradient_mismatch(3), "") << "seed " << seed;
    EXPECT_EQ(h.target->device_stats().ready_wait_s, 0.0) << "the host never waits for an upload";
  }
}

// Gradients held across passes (Coordinator::set_hold_gradients: the micro-batches of a step) stay
// in device memory, summed there (on the host thread or on the compute stream), and come back
// once as their sums with the first pass that does not hold; within a limit, the groups past it
// come back every pass. Exact under random delays either way.
TEST(DeviceCoordinatorTest, HeldGradientsComeBackOnceAsTheirSums) {
  for (const bool stream : {false, true}) {
    for (const std::uint64_t limit : {UINT64_MAX, std::uint64_t{3} * kSize}) {
      for (std::uint64_t seed : {1u, 2u, 3u}) {
        const std::string what = fmt::format("{}, limit {}, seed {}", stream ? "compute stream" : "host thread",
                                             limit, seed);
        CoordinatorOptions o = options();
        o.hold_gradient_elements = limit;
        DeviceHarness h(o, delays(seed), stream ? on_stream() : DeviceGatherOptions{});
        h.coordinator->set_hold_gradients(true);
        for (int pass = 1; pass <= 2; ++pass) ASSERT_TRUE(h.pass().is_ok()) << what;
        const std::uint64_t held_downloads = h.coordinator->stats().grad_downloads;
        if (limit == UINT64_MAX) {
          EXPECT_EQ(held_downloads, 0u) << what << ": nothing came back while held";
          EXPECT_EQ(h.gradient_mismatch(0), "") << what;
        } else {
          EXPECT_EQ(h.coordinator->stats().held_high_water, 3 * kSize) << what;
          EXPECT_EQ(held_downloads, 2 * (h.plan.num_groups() - 3)) << what << ": the groups past the limit";
        }
        h.coordinator->set_hold_gradients(false);
        auto loss = h.pass();
        ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
        EXPECT_EQ(loss.value(), DeviceHarness::expected_loss()) << what;
        EXPECT_EQ(h.coordinator->stats().grad_downloads - held_downloads, h.plan.num_groups()) << what;
        EXPECT_EQ(h.gradient_mismatch(3), "") << what;
      }
    }
  }
}

// Dropped sums (a step that failed) never come back.
TEST(DeviceCoordinatorTest, DroppedHeldGradientsNeverComeBack) {
  CoordinatorOptions o = options();
  o.hold_gradient_elements = UINT64_MAX;
  DeviceHarness h(o, delays(4), on_stream());
  h.coordinator->set_hold_gradients(true);
  ASSERT_TRUE(h.pass().is_ok());
  h.coordinator->drop_held_gradients();
  h.coordinator->set_hold_gradients(false);
  ASSERT_TRUE(h.pass().is_ok());
  EXPECT_EQ(h.gradient_mismatch(1), "");
}

// Whether some seed of [first, first + 5) gives a wrong loss or gradient within 3 passes, for a
// compute-stream consumer with `skip` left out (and one staging buffer: reuse comes at once).
bool goes_wrong_without(SkipWait skip, std::uint64_t first, bool pinned_bf16,
                        swap::DType values = swap::DType::kF32) {
  for (std::uint64_t seed = first; seed < first + 5; ++seed) {
    DeviceGatherOptions g = on_stream(skip);
    g.staging_buffers = 1;
    g.values = values;
    DeviceHarness h(options(), delays(seed), g, pinned_bf16);
    for (int pass = 1; pass <= 3; ++pass) {
      auto loss = h.pass();
      EXPECT_TRUE(loss.is_ok()) << loss.status().to_string();
      if (!loss.is_ok()) return false;
      if (loss.value() != DeviceHarness::expected_loss() || std::isnan(loss.value())) return true;
      if (!h.gradient_mismatch(pass).empty()) return true;
    }
  }
  return false;
}

TEST(DeviceCoordinatorTest, EachComputeStreamOrderingIsNeeded) {
  for (SkipWait skip : {SkipWait::kUploadBeforeUse, SkipWait::kComputeBeforeCopy}) {
    EXPECT_TRUE(goes_wrong_without(skip, 11, false)) << "ordering " << static_cast<int>(skip) << " left out, and nothing noticed";
  }
}

// The engine with EngineDevice kModelDevice: it gathers into the memory of the model's own device
// (here a host device on whose compute stream the chain model runs) and trains to the same bits
// as the host path, with one micro-batch a step and with three (whose gradients are summed on
// the device's compute stream and come back once a step).
TEST(DeviceCoordinatorTest, TheEngineGathersIntoTheModelsOwnDeviceWithTheSameResults) {
  // offload none: the whole state on the model's device (device_state.h), nothing uploaded;
  // offload cpu: each module's values uploaded through the copy stream.
  for (const int micro_batches : {1, 3}) {
    for (const char* where : {"none", "cpu"}) {
      const std::string text = fmt::format(R"({{"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
        "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-2}}}},
        "zero_optimization": {{"stage": 3, "stage3_param_persistence_threshold": 0, "reduce_bucket_size": 1,
          "offload_param": {{"device": "{0}"}}, "offload_optimizer": {{"device": "{0}"}}}}}})",
                                           where);
      auto ds = config::parse_ds_config(text, "model_device_test", config::AutoContext{});
      ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
      auto comm = make_local_communicator();
      const std::vector<std::int32_t> tokens = {0};
      const MicroBatch mb{tokens, tokens, 1, 1};
      const std::vector<MicroBatch> micro(static_cast<std::size_t>(micro_batches), mb);
      EngineOptions o{ds.value(), 3, ""};
      auto host = testing::train_chain(kModules, nullptr, false, o, *comm, micro, 3);
      ASSERT_TRUE(host.is_ok()) << host.status().to_string();
      auto device = device::HostDevice::create(delays(5));
      o.device.kind = EngineDevice::Kind::kModelDevice;
      auto on_device = testing::train_chain(kModules, device.get(), false, o, *comm, micro, 3);
      ASSERT_TRUE(on_device.is_ok()) << on_device.status().to_string();
      EXPECT_EQ(on_device->losses, host->losses) << where << ", micro-batches " << micro_batches;
      EXPECT_EQ(on_device->weights, host->weights) << where << ", micro-batches " << micro_batches;
      std::uint64_t host_h2d = 0, device_h2d = 0;
      for (const StepReport& r : host->reports) host_h2d += r.h2d_bytes;
      for (const StepReport& r : on_device->reports) {
        device_h2d += r.h2d_bytes;
        if (std::string(where) == "cpu") {
          // Each gradient comes down once a step, whatever the number of micro-batches.
          EXPECT_EQ(r.d2h_bytes, (kModules + 1) * kSize * sizeof(float)) << micro_batches;
        }
      }
      EXPECT_EQ(host_h2d, 0u);
      if (std::string(where) == "none") {
        EXPECT_EQ(device_h2d, 0u) << "the state lives on the device: nothing is uploaded";
      } else {
        EXPECT_GT(device_h2d, 0u) << "the values went through the device's copy stream";
      }
    }
  }
}

// A model that asks for bf16 values in place (acquire_bf16, as the GPU models do) gets pointers
// into the device-resident state's bf16 copy with offload none: nothing is gathered, and it trains
// to the host path's bits (the copy holds the bits the fp32 values round to). With offload cpu
// the engine gathers the values as bf16 (DeviceGatherOptions::values) and hands out those blocks:
// the same bits again, since the tier's values are the bf16 copies' own.
TEST(DeviceCoordinatorTest, Bf16ValuesInPlaceTrainToTheSameBits) {
  const zinf::testing::TempDir dir("bf16_in_place_");
  for (const char* where : {"none", "cpu", "nvme"}) {
    const std::string nvme = std::string(where) == "nvme" ? fmt::format(R"(, "nvme_path": "{}")", dir.path()) : "";
    const std::string text = fmt::format(R"({{"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
      "bf16": {{"enabled": true}}, "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-2}}}},
      "zero_optimization": {{"stage": 3, "stage3_param_persistence_threshold": 0,
        "offload_param": {{"device": "{0}"{1}}}, "offload_optimizer": {{"device": "{0}"{1}}}}}}})",
                                         where, nvme);
    auto ds = config::parse_ds_config(text, "bf16_in_place_test", config::AutoContext{});
    ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
    auto comm = make_local_communicator();
    const std::vector<std::int32_t> tokens = {0};
    const std::vector<MicroBatch> micro(2, MicroBatch{tokens, tokens, 1, 1});
    EngineOptions o{ds.value(), 3, ""};
    auto host = testing::train_chain(kModules, nullptr, true, o, *comm, micro, 3);
    ASSERT_TRUE(host.is_ok()) << host.status().to_string();
    auto device = device::HostDevice::create(delays(6));
    o.device.kind = EngineDevice::Kind::kModelDevice;
    auto on_device = testing::train_chain(kModules, device.get(), true, o, *comm, micro, 3);
    ASSERT_TRUE(on_device.is_ok()) << on_device.status().to_string();
    EXPECT_EQ(on_device->losses, host->losses) << where;
    EXPECT_EQ(on_device->weights, host->weights) << where;
    std::uint64_t live_high_water = 0;
    for (const StepReport& r : on_device->reports) live_high_water = std::max(live_high_water, r.live_high_water);
    if (std::string(where) == "none") {
      EXPECT_GT(on_device->in_place, 0u);
      EXPECT_EQ(live_high_water, 0u) << "nothing gathered";
    } else {
      EXPECT_GT(on_device->in_place, 0u) << "bf16 values gathered with offload " << where;
      EXPECT_GT(live_high_water, 0u);
    }
  }
}

TEST(DeviceCoordinatorTest, AModelWithoutADeviceOfItsOwnIsRefusedForModelDevice) {
  auto ds = config::parse_ds_config(R"({"train_micro_batch_size_per_gpu": 1})", "model_device_test",
                                    config::AutoContext{});
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  auto comm = make_local_communicator();
  EngineOptions o{ds.value(), 3, ""};
  o.device.kind = EngineDevice::Kind::kModelDevice;
  auto engine = Engine::create(std::make_unique<ChainModel>(kModules), o, *comm);
  ASSERT_FALSE(engine.is_ok());
  EXPECT_EQ(engine.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("computes on the host"), std::string::npos) << engine.status().to_string();
}

// Values gathered as bf16 (DeviceGatherOptions::values) for a model that reads them in place:
// exact under random delays, from a tier's pinned bf16 partitions (uploaded as they are) and from
// its fp32 values (rounded in the staging buffer), with half the upload bytes of fp32; acquire()
// refuses such a target by name. Each wait is needed: without the compute stream's wait for the
// upload the model reads poison, without the staging buffer's wait for its upload the next
// gather overwrites it first, without the upload's wait for the compute stream a reused block is
// overwritten while queued kernels still read it.
TEST(DeviceCoordinatorTest, Bf16GathersAreExactWithHalfTheUploadBytes) {
  for (const bool pinned : {false, true}) {
    DeviceGatherOptions g = on_stream();
    g.values = swap::DType::kBF16;
    DeviceHarness h(options(), delays(31), g, pinned);
    for (int pass = 1; pass <= 3; ++pass) {
      auto loss = h.pass();
      ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
      EXPECT_EQ(loss.value(), DeviceHarness::expected_loss()) << "pinned " << pinned << " pass " << pass;
    }
    EXPECT_EQ(h.gradient_mismatch(3), "") << "pinned " << pinned;
    const DeviceGatherStats& d = h.target->device_stats();
    EXPECT_GT(d.uploads, 0u);
    EXPECT_EQ(d.h2d_bytes, d.uploads * kSize * 2) << "bf16: 2 bytes a value";
    EXPECT_GT(h.model.in_place_acquires(), 0u);
    EXPECT_EQ(h.tier->pinned_reads > 0, pinned) << "the pinned partitions go up as they are";
  }
  // A model that asks for fp32 values is told what this target holds.
  DeviceGatherOptions g = on_stream();
  g.values = swap::DType::kBF16;
  DeviceHarness h(options(), delays(32), g);
  h.coordinator->begin_pass(false);
  std::vector<const float*> values(1);
  const Status s = h.coordinator->acquire(0, model::Phase::kForward, values);
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported) << s.to_string();
  EXPECT_NE(s.message().find("bf16"), std::string::npos) << s.to_string();
}

TEST(DeviceCoordinatorTest, EachBf16GatherWaitIsNeeded) {
  for (SkipWait skip : {SkipWait::kUploadBeforeUse, SkipWait::kStagingReuse, SkipWait::kComputeBeforeCopy}) {
    EXPECT_TRUE(goes_wrong_without(skip, 41, false, swap::DType::kBF16))
        << "ordering " << static_cast<int>(skip) << " left out, and nothing noticed";
  }
  EXPECT_TRUE(goes_wrong_without(SkipWait::kUploadBeforeUse, 46, true, swap::DType::kBF16));
}

// A bf16 target is for a model on the compute stream only.
TEST(DeviceCoordinatorTest, Bf16ValuesNeedAComputeStreamConsumer) {
  auto device = device::HostDevice::create(delays(1));
  DeviceGatherOptions g;
  g.values = swap::DType::kBF16;
  auto made = make_device_gather_target(*device, g);
  ASSERT_FALSE(made.is_ok());
  EXPECT_EQ(made.status().code(), ErrorCode::kInvalidArgument);
  g.consumer = DeviceGatherOptions::Consumer::kComputeStream;
  g.values = swap::DType::kF16;
  EXPECT_FALSE(make_device_gather_target(*device, g).is_ok()) << "fp16 values: no model reads them";
}

// A memory tier's bf16 partitions in pinned memory go up as they are and are widened on the
// device when the module is acquired (not when its gather starts ahead): exact under random
// delays for both consumers, and each ordering is needed: without the compute stream's wait for
// the 16-bit upload the widening reads a poisoned scratch block, and without the upload's wait for
// queued widenings a reused scratch block is overwritten before it is read.
TEST(DeviceCoordinatorTest, SixteenBitPartitionsGoUpAsTheyAreAndAreWidenedOnTheDevice) {
  for (const bool stream_consumer : {false, true}) {
    DeviceGatherOptions g = stream_consumer ? on_stream() : DeviceGatherOptions{};
    DeviceHarness h(options(), delays(21), g, /*pinned_bf16=*/true);
    for (int pass = 1; pass <= 3; ++pass) {
      auto loss = h.pass();
      ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
      EXPECT_EQ(loss.value(), DeviceHarness::expected_loss()) << "pass " << pass;
    }
    EXPECT_EQ(h.gradient_mismatch(3), "");
    EXPECT_TRUE(h.tier->reads.empty()) << "no fp32 reads through staging";
    EXPECT_GT(h.tier->pinned_reads, 0);
    EXPECT_EQ(h.target->device_stats().h2d_bytes, h.target->device_stats().uploads * kSize * sizeof(std::uint16_t));
  }
  for (SkipWait skip : {SkipWait::kUploadBeforeUse, SkipWait::kComputeBeforeCopy}) {
    EXPECT_TRUE(goes_wrong_without(skip, 31, /*pinned_bf16=*/true))
        << "ordering " << static_cast<int>(skip) << " left out, and nothing noticed";
  }
}

// With one group a module, the coordinator has one upload in flight at a time, so the staging
// rule is checked on the target itself: ten gathers started back to back through one staging
// buffer, then read.
TEST(DeviceCoordinatorTest, AStagingBufferIsReusedOnlyAfterItsUploadLanded) {
  for (SkipWait skip : {SkipWait::kNone, SkipWait::kStagingReuse}) {
    DeviceGatherOptions g;
    g.skip_wait = skip;
    g.staging_buffers = 1;
    DeviceHarness h(options(), delays(8), g);
    std::vector<GatherBlock> blocks;
    for (std::size_t p = 1; p <= kModules; ++p) {
      blocks.push_back(h.target->allocate(kSize));
      ASSERT_TRUE(h.target->gather(*h.tier, p, kSize, *h.comm, blocks.back()).is_ok());
    }
    int wrong = 0;
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      ASSERT_TRUE(h.target->ready(blocks[i]).is_ok());
      for (float v : blocks[i].span()) wrong += v != static_cast<float>(i + 2);
    }
    if (skip == SkipWait::kNone) {
      EXPECT_EQ(wrong, 0);
    } else {
      EXPECT_GT(wrong, 0) << "the staging wait left out, and nothing noticed";
    }
  }
}

// The host enqueues a compute-stream model's backward far ahead of the device: the gradient
// downloads it starts must not each take a new staging buffer (the whole model's gradients in
// pinned memory). At most staging_buffers exist, each of one slice, and the results stay exact.
TEST(DeviceCoordinatorTest, GradientDownloadsInFlightStayWithinTheStagingBuffers) {
  for (std::uint64_t seed : {31u, 32u, 33u}) {
    DeviceGatherOptions g = on_stream();
    g.staging_buffers = 2;
    device::HostDeviceOptions d = delays(seed);
    d.max_delay = std::chrono::microseconds(2000);  // the compute stream falls well behind
    DeviceHarness h(options(), d, g);
    for (int pass = 1; pass <= 3; ++pass) {
      auto loss = h.pass();
      ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
      EXPECT_EQ(loss.value(), DeviceHarness::expected_loss());
    }
    EXPECT_EQ(h.gradient_mismatch(3), "") << "seed " << seed;
    EXPECT_LE(h.target->device_stats().staging_bytes, g.staging_buffers * kSize * sizeof(float)) << "seed " << seed;
  }
}

TEST(DeviceCoordinatorTest, OneStagingBufferStillGivesExactResults) {
  DeviceGatherOptions g;
  g.staging_buffers = 1;
  DeviceHarness h(options(), delays(7), g);
  for (int pass = 1; pass <= 3; ++pass) {
    auto loss = h.pass();
    ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
    EXPECT_EQ(loss.value(), DeviceHarness::expected_loss());
  }
  EXPECT_EQ(h.gradient_mismatch(3), "");
}

}  // namespace
}  // namespace zinf::zero3
