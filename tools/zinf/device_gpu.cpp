// --device in a build with the GPU layer: probes CUDA, and puts the GPT (GptGpuModel) or the Llama
// family (LlamaGpuModel) on GPU 0.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "device_choice.h"
#include "gpu/copy_engine.h"
#include "gpu/device.h"
#include "gpu/device_buffer.h"
#include "gpu/gpt_gpu.h"
#include "gpu/gpt_gpu_model.h"
#include "gpu/llama_gpu.h"
#include "gpu/llama_gpu_model.h"
#include "zinf/aio/pinned.h"
#include "zinf/model/gpt.h"
#include "zinf/model/llama.h"

namespace zinf::cli {

DeviceProbe probe_devices() {
  DeviceProbe p;
  p.build_has_gpu = true;
  Result<int> count = gpu::device_count();
  if (!count.is_ok()) {
    p.why_none = count.status().message();
    return p;
  }
  Result<gpu::DeviceInfo> info = gpu::device_info(0);
  if (!info.is_ok()) {
    p.why_none = fmt::format("GPU 0: {}", info.status().message());
    return p;
  }
  p.device_count = count.value();
  p.first_device = fmt::format("{}, {:.1f} GiB", info->name, static_cast<double>(info->total_memory) / (1u << 30));
  p.first_name = info->name;
  return p;
}

Result<std::uint64_t> gpu0_free_bytes() {
  ZINF_ASSIGN_OR_RETURN(const gpu::MemoryInfo mem, gpu::memory_info(0));
  return static_cast<std::uint64_t>(mem.free);
}

Result<std::uint64_t> gpu_workspace_bytes(const model::Model& cpu_model, int rows) {
  if (const auto* gpt = dynamic_cast<const model::GptModel*>(&cpu_model)) return gpu::GptGpu::workspace_bytes(gpt->config(), rows);
  if (const auto* llama = dynamic_cast<const model::LlamaModel*>(&cpu_model)) {
    return gpu::LlamaGpu::workspace_bytes(llama->config(), rows);
  }
  return Status::unsupported(fmt::format("{} has no GPU implementation: plan it with --device cpu", cpu_model.type()));
}

Result<std::unique_ptr<model::Model>> place_model(std::unique_ptr<model::Model> cpu_model, const DeviceChoice& choice) {
  if (choice.device == ComputeDevice::kCpu) return cpu_model;
  if (const auto* gpt = dynamic_cast<const model::GptModel*>(cpu_model.get())) {
    auto made = gpu::GptGpuModel::create(gpt->config(), gpu::GpuModelOptions{});
    if (!made.is_ok()) return made.status().with_context("--device cuda: the GPT on GPU 0");
    return std::unique_ptr<model::Model>(std::move(made).value());
  }
  if (const auto* llama = dynamic_cast<const model::LlamaModel*>(cpu_model.get())) {
    auto made = gpu::LlamaGpuModel::create(llama->config(), gpu::GpuModelOptions{});
    if (!made.is_ok()) return made.status().with_context(fmt::format("--device cuda: the {} on GPU 0", llama->type()));
    return std::unique_ptr<model::Model>(std::move(made).value());
  }
  return Status::unsupported(
      fmt::format("--device cuda: {} runs on the CPU only for now; use --device cpu", cpu_model->type()));
}

Result<double> probe_gpu_copy_gbps() {
  constexpr std::size_t kBytes = std::size_t{64} << 20;
  constexpr int kRounds = 5;
  ZINF_RETURN_IF_ERROR(gpu::select_device(0).status());
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<gpu::CopyEngine> engine, gpu::CopyEngine::create(0));
  ZINF_ASSIGN_OR_RETURN(aio::PinnedBuffer host, aio::PinnedBuffer::allocate(kBytes));
  if (!host.cuda_registered()) return Status::unsupported("the probe's pinned memory was not registered with CUDA");
  std::memset(host.data(), 1, kBytes);  // fault the pages in before timing
  ZINF_ASSIGN_OR_RETURN(gpu::DeviceBuffer dev, gpu::DeviceBuffer::allocate(0, kBytes, "zinf plan's copy probe"));
  auto seconds = [&](bool up) -> Result<double> {
    const auto t0 = std::chrono::steady_clock::now();
    if (up) {
      ZINF_RETURN_IF_ERROR(engine->copy_h2d(dev.data(), host.data(), kBytes, nullptr, "copy probe").status());
    } else {
      ZINF_RETURN_IF_ERROR(engine->copy_d2h(host.data(), dev.data(), kBytes, nullptr, "copy probe").status());
    }
    ZINF_RETURN_IF_ERROR(engine->synchronize());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double slowest = 0;
  for (const bool up : {true, false}) {
    ZINF_RETURN_IF_ERROR(seconds(up).status());  // warm-up
    std::vector<double> s;
    for (int i = 0; i < kRounds; ++i) {
      ZINF_ASSIGN_OR_RETURN(const double t, seconds(up));
      s.push_back(t);
    }
    std::sort(s.begin(), s.end());
    slowest = std::max(slowest, s[s.size() / 2]);
  }
  return static_cast<double>(kBytes) / slowest / 1e9;
}

// 6 N + 12 L W T, W the attention width: n_embd for the GPT, n_head * head_dim for Llama.
std::optional<DeviceTimes> device_times(const model::Model& model, int T) {
  const auto* gpu = dynamic_cast<const gpu::BridgedGpuModel*>(&model);
  if (gpu == nullptr) return std::nullopt;
  DeviceTimes d{gpu->times(), 0.0, ""};
  std::uint64_t n = 0;
  for (const model::ParamSpec& p : model.params()) n += p.numel;
  int L = 0, W = 0;
  const char* w_name = "C";
  if (const auto* gpt = dynamic_cast<const gpu::GptGpuModel*>(gpu)) {
    L = gpt->config().n_layer;
    W = gpt->config().n_embd;
  } else if (const auto* llama = dynamic_cast<const gpu::LlamaGpuModel*>(gpu)) {
    L = llama->config().n_layer;
    W = llama->config().n_head * llama->config().head_size();
    w_name = "Q";
  }
  d.flops_per_token = 6.0 * static_cast<double>(n) + 12.0 * L * W * static_cast<double>(T);
  d.flops_formula = fmt::format("6*N + 12*L*{0}*T, N = {1}, L = {2}, {0} = {3}, T = {4}", w_name, n, L, W, T);
  return d;
}

}  // namespace zinf::cli
