// Internal: LlamaGpuModel, the Llama family on the GPU (LlamaGpu) behind model::Model, bridged to
// the engine's host parameters by BridgedGpuModel (model_bridge.h).
#pragma once

#include <memory>

#include "gpu/model_bridge.h"
#include "zinf/model/llama.h"
#include "zinf/status.h"

namespace zinf::gpu {

// The same model as model::LlamaModel (type "llama", params(), modules() and config_json() are
// LlamaModel's: HF names and shapes, so HF folders load and checkpoints move freely between
// --device cpu and cuda), computed by LlamaGpu.
class LlamaGpuModel final : public BridgedGpuModel {
 public:
  // invalid_argument for an invalid config (naming the field); unsupported when there is no CUDA
  // device or head_dim is above the attention kernels' 128; the CUDA error naming the step
  // otherwise.
  static Result<std::unique_ptr<LlamaGpuModel>> create(const model::LlamaConfig& config, GpuModelOptions options = {});

  const model::LlamaConfig& config() const;
  // As LlamaModel::reserve: also refuses T above a sliding window (zinf's attention is fully causal).
  Status reserve(int B, int T) override;

 private:
  LlamaGpuModel() = default;  // create() attaches
};

}  // namespace zinf::gpu
