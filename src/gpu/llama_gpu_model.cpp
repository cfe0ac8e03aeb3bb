// LlamaGpuModel: LlamaModel's lists and LlamaGpu's passes behind BridgedGpuModel.
#include "gpu/llama_gpu_model.h"

#include "gpu/llama_gpu.h"

namespace zinf::gpu {

Result<std::unique_ptr<LlamaGpuModel>> LlamaGpuModel::create(const model::LlamaConfig& config,
                                                             GpuModelOptions options) {
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<model::LlamaModel> cpu, model::LlamaModel::create(config));
  // Before any device work: a configuration the kernels cannot run fails the same with or without a GPU.
  ZINF_RETURN_IF_ERROR(LlamaGpu::check_config(config));
  std::unique_ptr<LlamaGpuModel> m(new LlamaGpuModel());
  ZINF_RETURN_IF_ERROR(m->attach(std::move(cpu), "Llama", options, net_of<LlamaGpu>(config)));
  return m;
}

const model::LlamaConfig& LlamaGpuModel::config() const {
  return static_cast<const model::LlamaModel&>(cpu_model()).config();
}

Status LlamaGpuModel::reserve(int B, int T) {
  ZINF_RETURN_IF_ERROR(LlamaGpu::check_seq_len(config(), T));
  return BridgedGpuModel::reserve(B, T);
}

}  // namespace zinf::gpu
