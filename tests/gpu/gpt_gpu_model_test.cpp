// GptGpuModel through the ZeRO-3 engine: 20 training steps of a small GPT on the GPU against the
// same run of model::GptModel on the CPU (bf16, CPU offload), every step's loss within 2e-2
// relative (issue #13's figure); a checkpoint the GPU run saves resumes on the CPU, and the
// CPU-resumed run goes on as the GPU run does. Skipped without a GPU.
// At lr 1e-3: at the harness's 1e-2 the first GPU run (H100, docs/gpu.md) drifted 2.4% from the
// CPU by step 15 and 3.4% after the resume. The GPU rounds every activation to bf16 and the CPU
// does not, and at that rate those differences grow from step to step, so the trajectories
// stop measuring the kernels. The kernels themselves are checked at equal parameters in
// gpu_kernels_test (GpuGptTest).
#include "gpu/gpt_gpu_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "engine_harness.h"
#include "gpu_model_test_util.h"
#include "gpu_test_util.h"
#include "temp_dir.h"
#include "zinf/model/gpt.h"

namespace zinf::gpu {
namespace {

using testing::expect_close;
using zero3::testing::EngineRun;

model::GptConfig small_config() {
  model::GptConfig c;
  c.vocab_size = 96;
  c.max_seq = zero3::testing::kT;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 64;
  return c;
}

std::unique_ptr<model::Model> cpu_model() {
  auto m = model::GptModel::create(small_config());
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? std::move(m).value() : nullptr;
}

std::unique_ptr<model::Model> gpu_model(GptGpuModelOptions options = {}) {
  auto m = GptGpuModel::create(small_config(), options);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? std::move(m).value() : nullptr;
}

// Without a device (this test's only host part): create() fails with unsupported, naming CUDA's reason.
TEST(GptGpuModelWithoutGpu, CreateSaysWhy) {
  ZINF_REQUIRE_NO_GPU();
  auto m = GptGpuModel::create(small_config());
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), ErrorCode::kUnsupported) << m.status().to_string();
}

TEST(GptGpuModel, SameListsAsTheCpuModel) {
  ZINF_REQUIRE_GPU();
  auto cpu = model::GptModel::create(small_config());
  auto gpu = GptGpuModel::create(small_config());
  ASSERT_TRUE(cpu.is_ok() && gpu.is_ok()) << gpu.status().to_string();
  EXPECT_EQ(gpu.value()->type(), "gpt");
  EXPECT_EQ(gpu.value()->config_json(), cpu.value()->config_json());
  ASSERT_EQ(gpu.value()->params().size(), cpu.value()->params().size());
  for (std::size_t i = 0; i < cpu.value()->params().size(); ++i) {
    EXPECT_EQ(gpu.value()->params()[i].name, cpu.value()->params()[i].name);
    EXPECT_EQ(gpu.value()->params()[i].numel, cpu.value()->params()[i].numel);
  }
  EXPECT_EQ(gpu.value()->modules().size(), cpu.value()->modules().size());
  EXPECT_GT(gpu.value()->activation_bytes(2, 8), 0u);
  EXPECT_TRUE(gpu.value()->reserve(2, 8).is_ok());
}

TEST(GptGpuModel, TrainsLikeTheCpuModelAndResumesOnTheCpu) {
  ZINF_REQUIRE_GPU();
  constexpr int kSteps = 20, kMore = 3;
  const int V = small_config().vocab_size;
  zinf::testing::TempDir nvme, ckpt;
  const config::DsConfig ds = zero3::testing::ds_config("cpu", nvme.path(), true, 300, 1e-3);

  EngineRun cpu(cpu_model(), ds);
  ASSERT_TRUE(cpu.engine);
  auto cpu_losses = zero3::testing::train(*cpu.engine, 0, kSteps + kMore, V);
  ASSERT_TRUE(cpu_losses.is_ok()) << cpu_losses.status().to_string();

  EngineRun gpu(gpu_model(), ds);
  ASSERT_TRUE(gpu.engine);
  auto gpu_losses = zero3::testing::train(*gpu.engine, 0, kSteps, V);
  ASSERT_TRUE(gpu_losses.is_ok()) << gpu_losses.status().to_string();
  const std::vector<double> cpu_first(cpu_losses->begin(), cpu_losses->begin() + kSteps);
  expect_close(*gpu_losses, cpu_first, "GPU vs CPU");
  EXPECT_LT(gpu_losses->back(), gpu_losses->front()) << "the GPU run did not learn";

  Status saved = gpu.engine->save_checkpoint(ckpt.path(), "global_step20", "{}");
  ASSERT_TRUE(saved.is_ok()) << saved.to_string();
  EngineRun resumed(cpu_model(), ds);
  ASSERT_TRUE(resumed.engine);
  auto loaded = resumed.engine->load_checkpoint(ckpt.path(), "");
  ASSERT_TRUE(loaded.is_ok()) << "a GPU checkpoint on the CPU: " << loaded.status().to_string();
  EXPECT_EQ(resumed.engine->counters().steps, kSteps);
  auto more = zero3::testing::train(*resumed.engine, kSteps, kSteps + kMore, V);
  ASSERT_TRUE(more.is_ok()) << more.status().to_string();
  const std::vector<double> cpu_more(cpu_losses->begin() + kSteps, cpu_losses->end());
  expect_close(*more, cpu_more, "resumed on the CPU from the GPU's checkpoint vs the CPU run");
}

// Where cudaHostRegister is refused, the staging comes from cudaHostAlloc: the same training,
// bit for bit, since only where the bytes wait between copies changes.
TEST(GptGpuModel, CudaHostAllocStagingTrainsBitForBitLikeRegisteredStaging) {
  ZINF_REQUIRE_GPU();
  constexpr int kSteps = 3;
  const int V = small_config().vocab_size;
  zinf::testing::TempDir nvme;
  const config::DsConfig ds = zero3::testing::ds_config("cpu", nvme.path());
  EngineRun registered(gpu_model(), ds);
  ASSERT_TRUE(registered.engine);
  auto want = zero3::testing::train(*registered.engine, 0, kSteps, V);
  ASSERT_TRUE(want.is_ok()) << want.status().to_string();
  EngineRun host_alloc(gpu_model(GptGpuModelOptions{.staging_host_alloc = true}), ds);
  ASSERT_TRUE(host_alloc.engine);
  auto got = zero3::testing::train(*host_alloc.engine, 0, kSteps, V);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(*got, *want);
}

// The engine gathering into the GPU model's own memory (EngineDevice kModelDevice: uploads on the
// copy stream, the compute stream waiting for them, the bf16 cast on the GPU, gradients downloaded
// after their kernels) trains bit for bit as the bridge does (the host cast, uploads and
// downloads): the same values reach the same kernels in the same order. For each offload device;
// with offload none the state lives on the GPU and its norm and AdamW are the CPU's bits.
TEST(GptGpuModel, GatheringIntoGpuMemoryTrainsBitForBitLikeTheBridge) {
  ZINF_REQUIRE_GPU();
  constexpr int kSteps = 3;
  const int V = small_config().vocab_size;
  for (const char* offload : {"none", "cpu", "nvme"}) {
    zinf::testing::TempDir nvme, nvme2;  // each engine its own swap folder (they are locked)
    const config::DsConfig ds = zero3::testing::ds_config(offload, nvme.path());
    EngineRun bridge(gpu_model(), ds);
    ASSERT_TRUE(bridge.engine);
    auto want = zero3::testing::train(*bridge.engine, 0, kSteps, V);
    ASSERT_TRUE(want.is_ok()) << want.status().to_string();
    EngineRun on_device(gpu_model(), zero3::testing::ds_config(offload, nvme2.path()),
                        zero3::EngineDevice::Kind::kModelDevice);
    ASSERT_TRUE(on_device.engine);
    auto got = zero3::testing::train(*on_device.engine, 0, kSteps, V);
    ASSERT_TRUE(got.is_ok()) << offload << ": " << got.status().to_string();
    EXPECT_EQ(*got, *want) << "offload " << offload;
    // offload none: the whole state in GPU memory (device_state.h), stepped by the GPU's Adam.
    EXPECT_EQ(on_device.engine->describe().find("in device memory") != std::string::npos,
              std::string(offload) == "none")
        << on_device.engine->describe();
    std::vector<float> a(small_config().n_embd), b(small_config().n_embd);
    const std::size_t last = bridge.engine->model().params().size() - 1;  // the final LayerNorm's bias
    ASSERT_TRUE(bridge.engine->read_full_param(last, a).is_ok());
    ASSERT_TRUE(on_device.engine->read_full_param(last, b).is_ok());
    EXPECT_EQ(a, b) << "offload " << offload;
  }
}

// The whole state in GPU memory (offload none): a checkpoint saved from it (the master weights and
// AdamW states downloaded through staging) resumes into a new engine's GPU memory and goes on bit
// for bit as the run that never stopped.
TEST(GptGpuModel, AStateInGpuMemoryResumesBitForBit) {
  ZINF_REQUIRE_GPU();
  const int V = small_config().vocab_size;
  zinf::testing::TempDir nvme, ckpt;
  const config::DsConfig ds = zero3::testing::ds_config("none", nvme.path());
  const auto on_gpu = zero3::EngineDevice::Kind::kModelDevice;
  EngineRun full(gpu_model(), ds, on_gpu);
  ASSERT_TRUE(full.engine);
  auto want = zero3::testing::train(*full.engine, 0, 5, V);
  ASSERT_TRUE(want.is_ok()) << want.status().to_string();
  std::vector<double> got;
  {
    EngineRun first(gpu_model(), ds, on_gpu);
    ASSERT_TRUE(first.engine);
    auto a = zero3::testing::train(*first.engine, 0, 3, V);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    got = *a;
    Status saved = first.engine->save_checkpoint(ckpt.path(), "global_step3", "{}");
    ASSERT_TRUE(saved.is_ok()) << saved.to_string();
  }
  EngineRun resumed(gpu_model(), ds, on_gpu);
  ASSERT_TRUE(resumed.engine);
  auto loaded = resumed.engine->load_checkpoint(ckpt.path(), "");
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  auto b = zero3::testing::train(*resumed.engine, 3, 5, V);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  got.insert(got.end(), b->begin(), b->end());
  EXPECT_EQ(got, *want);
}

}  // namespace
}  // namespace zinf::gpu
