// Internal: GptGpuModel, the GPT on the GPU (GptGpu) behind model::Model, bridged to the engine's
// host parameters by BridgedGpuModel (model_bridge.h).
#pragma once

#include <memory>

#include "gpu/model_bridge.h"
#include "zinf/model/config.h"
#include "zinf/status.h"

namespace zinf::gpu {

using GptGpuModelOptions = GpuModelOptions;
using GptGpuTimes = GpuModelTimes;

// The same model as model::GptModel (type "gpt", params(), modules() and config_json() are
// GptModel's, so checkpoints move freely between --device cpu and cuda), computed by GptGpu.
class GptGpuModel final : public BridgedGpuModel {
 public:
  // invalid_argument for an invalid config; unsupported when there is no CUDA device or the
  // head size is above the attention kernels' 128; the CUDA error naming the step otherwise.
  static Result<std::unique_ptr<GptGpuModel>> create(const model::GptConfig& config, GptGpuModelOptions options = {});

  const model::GptConfig& config() const;

 private:
  GptGpuModel() = default;  // create() attaches
};

}  // namespace zinf::gpu
