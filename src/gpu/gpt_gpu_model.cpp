// GptGpuModel: GptModel's lists and GptGpu's passes behind BridgedGpuModel.
#include "gpu/gpt_gpu_model.h"

#include "gpu/gpt_gpu.h"
#include "zinf/model/gpt.h"

namespace zinf::gpu {

Result<std::unique_ptr<GptGpuModel>> GptGpuModel::create(const model::GptConfig& config, GptGpuModelOptions options) {
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<model::GptModel> cpu, model::GptModel::create(config));
  std::unique_ptr<GptGpuModel> m(new GptGpuModel());
  ZINF_RETURN_IF_ERROR(m->attach(std::move(cpu), "GPT", options, net_of<GptGpu>(config)));
  return m;
}

const model::GptConfig& GptGpuModel::config() const {
  return static_cast<const model::GptModel&>(cpu_model()).config();
}

}  // namespace zinf::gpu
