// Internal: the Llama-family forward and backward on the GPU over device parameters, module by
// module, mirroring model::LlamaModel: the same parameters, modules, module order, phases, loss
// and activation checkpointing, with bf16 activations and fp32 statistics and gradients.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "gpu/blas.h"
#include "gpu/gpu_pass.h"
#include "zinf/model/llama.h"
#include "zinf/model/params.h"
#include "zinf/status.h"

namespace zinf::gpu {

struct LlamaGpuActivations;  // internal: views into the workspace
struct LlamaGpuLayerActs;    // internal: one block's activations

// Every family the CPU LlamaModel takes (llama.h: Llama, Mistral, Qwen2, Qwen3): RMSNorm, rotary
// embeddings (with the configuration's RoPE scaling: the tables are model::rope_frequencies'),
// SwiGLU, causal grouped-query attention, q/k/v and o_proj biases, per-head q/k norms, head_dim
// apart from hidden, tied or untied head. Limits beyond the CPU model's: head_dim <= 128 and
// B * n_head <= 65535 (the attention kernels'; unsupported otherwise); a sliding window limits T
// as on the CPU.
//
// Numerics (docs/gpu-kernels.md): token ids and targets int32; activations, logits and their
// gradients bf16; RMSNorm rstd, the attention log-sum-exp, losses and parameter gradients fp32;
// the residual stream's gradient fp32 (cast to bf16 only as a product's input), as are the q/k
// norms' input gradients. The residual adds are cuBLASLt's C (beta = 1) on o_proj and down_proj.
// Deterministic: the same inputs give the same bits on the same GPU and library, and activation
// checkpointing changes no bit.
//
// Not thread-safe: one pass at a time. Everything runs on `stream`; a pass returns after the
// loss has been copied back (one stream synchronisation at its end).
class LlamaGpu final : public GpuPassNet {
 public:
  // invalid_argument for an invalid config (validate_llama_config) or a null blas; unsupported
  // when the head size is above the attention kernels' 128. `blas` must outlive the model.
  static Result<std::unique_ptr<LlamaGpu>> create(const model::LlamaConfig& config, Blas* blas, cudaStream_t stream);
  // create()'s checks without a Blas: OK when this configuration runs on the GPU.
  static Status check_config(const model::LlamaConfig& config);
  // As LlamaModel::reserve: T above a sliding window is invalid_argument (zinf's attention is
  // fully causal, so a longer window would compute another model).
  static Status check_seq_len(const model::LlamaConfig& config, int T);
  ~LlamaGpu() override;

  const model::LlamaConfig& config() const { return config_; }
  std::span<const model::ParamSpec> params() const { return params_; }
  std::span<const model::ModuleSpec> modules() const { return modules_; }

  // Bytes of device workspace for passes of up to max_bt = B*T positions (activations, scratch,
  // token ids, the RoPE tables for min(max_seq, max_bt) positions); views are 256-byte aligned.
  static uint64_t workspace_bytes(const model::LlamaConfig& config, int max_bt);
  uint64_t workspace_bytes_for(int max_bt) const override { return workspace_bytes(config_, max_bt); }
  // GpuNet's contract (gpu_pass.h). bind_workspace also uploads the RoPE tables (and waits).
  Status bind_workspace(void* base, uint64_t bytes, int max_bt) override;

  // Where each self_attn parameter sits in that module's list, found by its HF name; -1 when the
  // configuration has none.
  struct AttnSlots {
    int q = -1, qb = -1, k = -1, kb = -1, v = -1, vb = -1, o = -1, ob = -1, qn = -1, kn = -1;
  };
  static AttnSlots attn_slots(std::span<const model::ParamSpec> params, const model::ModuleSpec& attn);

  // LlamaModel's module numbering (llama.h): embed_tokens, 4 per layer, norm, lm_head.
  static int embed_module() { return 0; }
  static int block_module(int layer, int k) { return 1 + 4 * layer + k; }  // k: 0 ln, 1 attn, 2 ln, 3 mlp
  static int norm_module(int n_layer) { return 1 + 4 * n_layer; }
  static int head_module(int n_layer) { return 2 + 4 * n_layer; }

 private:
  LlamaGpu(const model::LlamaConfig& config, Blas* blas, cudaStream_t stream);
  PassTokens* pass_tokens() override;
  Status check_seq(int T) const override { return check_seq_len(config_, T); }
  const float* pass_loss() const override;
  Status forward_pass(int B, int T, GpuParamAccess& access, model::Phase phase, float loss_scale) override;
  Status block_forward(int layer, int slot, int B, int T, GpuParamAccess& access, model::Phase phase,
                       bool need_output);
  Status backward_pass(int B, int T, GpuParamAccess& access) override;
  Status block_backward(int layer, int slot, int B, int T, GpuParamAccess& access);
  Status attention_backward_body(const LlamaGpuLayerActs& la, int B, int T, const bf16* const* v, float* const* g);

  model::LlamaConfig config_;
  Blas* blas_;
  std::vector<model::ParamSpec> params_;
  std::vector<model::ModuleSpec> modules_;
  std::unique_ptr<LlamaGpuActivations> acts_;
  AttnSlots ix_;
  int rope_rows_ = 0;  // rows of the uploaded RoPE tables
};

}  // namespace zinf::gpu
