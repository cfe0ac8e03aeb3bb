// Internal: the GPT-2 forward and backward on the GPU over device parameters, module by module,
// mirroring model::GptModel: the same parameters, modules, module order, phases, loss and
// activation checkpointing, with bf16 activations and fp32 statistics and gradients.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "gpu/blas.h"
#include "gpu/gpu_pass.h"
#include "gpu/launch_geometry.h"
#include "gpu/numerics.h"
#include "zinf/model/config.h"
#include "zinf/model/params.h"
#include "zinf/status.h"

namespace zinf::gpu {

struct GptGpuOptions {
  // true: cuBLASLt's GELU_AUX_BIAS / DGELU epilogues for the MLP's GELU and the residual adds
  // folded into the projections (beta = 1 onto the block input). false: the gelu_* and
  // residual_forward kernels after plain products (bias epilogue only). A GELU epilogue that
  // cuBLASLt turns down (unsupported) switches that direction to the kernels for good, with a
  // notice.
  bool fuse_epilogues = true;
};

struct GptGpuActivations;  // internal: views into the workspace

// Numerics: token ids and targets are int32; activations, logits and their gradients bf16;
// LayerNorm statistics, the attention log-sum-exp, losses and parameter gradients fp32; the
// residual stream's gradient fp32 (cast to bf16 only as a product's input). Every kernel is
// deterministic and each product shape keeps its cuBLASLt algorithm, so the same inputs give
// the same bits on the same GPU and library, and activation checkpointing changes no bit.
//
// Not thread-safe: one pass at a time. Everything runs on `stream`; a pass returns after the
// loss has been copied back (one stream synchronisation at its end).
class GptGpu final : public GpuPassNet {
 public:
  // invalid_argument for an invalid config (validate_config) or a null blas; unsupported when
  // the head size is above the attention kernels' 128. `blas` must outlive the model.
  static Result<std::unique_ptr<GptGpu>> create(const model::GptConfig& config, Blas* blas, cudaStream_t stream,
                                                GptGpuOptions options = {});
  ~GptGpu();

  const model::GptConfig& config() const { return config_; }
  std::span<const model::ParamSpec> params() const { return params_; }
  std::span<const model::ModuleSpec> modules() const { return modules_; }

  // Bytes of device workspace for passes of up to max_bt = B*T positions (activations,
  // scratch, token ids); views are 256-byte aligned.
  static uint64_t workspace_bytes(const model::GptConfig& config, int max_bt);
  uint64_t workspace_bytes_for(int max_bt) const override { return workspace_bytes(config_, max_bt); }
  // GpuNet's contract (gpu_pass.h).
  Status bind_workspace(void* base, uint64_t bytes, int max_bt) override;

 private:
  GptGpu(const model::GptConfig& config, Blas* blas, cudaStream_t stream, GptGpuOptions options);
  PassTokens* pass_tokens() override;
  const float* pass_loss() const override;
  Status forward_pass(int B, int T, GpuParamAccess& access, model::Phase phase, float loss_scale) override;
  Status block_forward(int layer, int slot, int B, int T, GpuParamAccess& access, model::Phase phase,
                       bool need_output);
  Status mlp_forward(int slot, int N, bf16* y, const bf16* const* v, bool need_output);
  Status backward_pass(int B, int T, GpuParamAccess& access) override;
  Status block_backward(int layer, int slot, int B, int T, GpuParamAccess& access);

  model::GptConfig config_;
  Blas* blas_;
  bool fuse_residual_;
  bool fuse_gelu_;
  bool fuse_dgelu_;
  std::vector<model::ParamSpec> params_;
  std::vector<model::ModuleSpec> modules_;
  std::unique_ptr<GptGpuActivations> acts_;
};

}  // namespace zinf::gpu
