// --device in a build with the GPU layer: probes CUDA, and puts the GPT on GPU 0 (GptGpuModel).
#include <fmt/format.h>

#include "device_choice.h"
#include "gpu/device.h"
#include "gpu/gpt_gpu_model.h"
#include "zinf/model/gpt.h"

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
  return p;
}

Result<std::unique_ptr<model::Model>> place_model(std::unique_ptr<model::Model> cpu_model, const DeviceChoice& choice) {
  if (choice.device == ComputeDevice::kCpu) return cpu_model;
  const auto* gpt = dynamic_cast<const model::GptModel*>(cpu_model.get());
  if (gpt == nullptr) {
    return Status::unsupported(fmt::format("--device cuda: {} runs on the CPU only for now; use --device cpu",
                                           cpu_model->type()));
  }
  auto made = gpu::GptGpuModel::create(gpt->config(), gpu::GptGpuModelOptions{});
  if (!made.is_ok()) return made.status().with_context("--device cuda: the GPT on GPU 0");
  return std::unique_ptr<model::Model>(std::move(made).value());
}

std::optional<DeviceTimes> device_times(const model::Model& model) {
  const auto* gpu = dynamic_cast<const gpu::GptGpuModel*>(&model);
  if (gpu == nullptr) return std::nullopt;
  DeviceTimes d{gpu->times(), 0.0, ""};
  std::uint64_t n = 0;
  for (const model::ParamSpec& p : model.params()) n += p.numel;
  const model::GptConfig& c = gpu->config();
  d.flops_per_token = 6.0 * static_cast<double>(n) + 12.0 * c.n_layer * c.n_embd * static_cast<double>(c.max_seq);
  d.flops_formula = fmt::format("6*N + 12*L*C*T, N = {}, L = {}, C = {}, T = {}", n, c.n_layer, c.n_embd, c.max_seq);
  return d;
}

}  // namespace zinf::cli
