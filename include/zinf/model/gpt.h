// GptModel: a GPT-2 style decoder-only transformer, forward and backward on the CPU in fp32.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/model/config.h"
#include "zinf/model/matmul.h"
#include "zinf/model/model.h"
#include "zinf/status.h"

namespace zinf::model {

struct GptActivations;  // internal: the model's activation and scratch buffers

// Token + position embeddings, n_layer pre-LayerNorm blocks (causal multi-head self-attention,
// GELU MLP), final LayerNorm, LM head tied to wte; mean cross-entropy loss.
//
// The model owns no parameters: it describes them (params(), modules()) and reads them through a
// ParamAccess, module by module. It owns its activations, allocated for (B, T) at the first pass
// and again only when B*T or T grows.
//
// Deterministic: the same inputs and parameter values give bit-identical loss and gradients
// (all reductions run in a fixed order; matrix products are OpenBLAS sgemm or oneDNN bf16 calls of
// fixed shape, see matmul.h).
// Activation checkpointing changes memory and time, not a single bit of the results.
// Not thread-safe: one pass at a time. Matrix products use OpenBLAS's (or oneDNN's) own threads.
class GptModel final : public Model {
 public:
  // Fails with the validate_config() error (naming the field) for an invalid configuration.
  static Result<std::unique_ptr<GptModel>> create(GptConfig config);
  GptModel(GptModel&&) noexcept;
  GptModel& operator=(GptModel&&) noexcept;
  ~GptModel() override;

  const GptConfig& config() const { return config_; }

  std::string_view type() const override { return "gpt"; }
  std::string describe() const override;
  // {"type": "gpt", "vocab_size", "max_seq", "n_layer", "n_head", "n_embd"}.
  std::string config_json() const override;
  std::span<const ParamSpec> params() const override { return params_; }
  std::span<const ModuleSpec> modules() const override { return modules_; }
  int vocab_size() const override { return config_.vocab_size; }
  int max_seq() const override { return config_.max_seq; }
  int hidden_size() const override { return config_.n_embd; }

  // One training micro-batch: inputs and targets are (B, T) token ids in [0, vocab_size), with
  // 1 <= T <= max_seq. Returns the mean cross-entropy over B*T positions and ADDS the gradients of
  // (loss * loss_scale) to the buffers given by access.grad_buffers().
  Result<float> forward_backward(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B, int T,
                                 ParamAccess& access, float loss_scale) override;
  Result<float> forward_backward(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B, int T,
                                 ParamAccess& access) {
    return forward_backward(inputs, targets, B, T, access, 1.0f);
  }
  // Evaluation: the same loss, no gradients (Phase::kEval, no recompute, no backward).
  Result<float> forward_loss(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B, int T,
                             ParamAccess& access) override;

  // Allocates activations for (B, T) now (a pass does it on demand). Fails with
  // resource_exhausted when the memory is not there.
  Status reserve(int B, int T) override;

  // Matrix products: fp32 OpenBLAS until told otherwise. set_compute_precision() resolves the
  // kind for the run (resolve_matmul); use_matmul() sets it directly (tests, benchmarks).
  Status set_compute_precision(ComputePrecision precision) override;
  Status use_matmul(MatmulKind kind) { return matmul_.use(kind); }
  MatmulKind matmul_kind() const { return matmul_.kind(); }
  // Bytes of activations and scratch a pass with (B, T) needs under this configuration.
  uint64_t activation_bytes(int B, int T) const override;
  uint64_t weight_copy_bytes() const override;
  void limit_weight_copies(uint64_t bytes) override;

 private:
  explicit GptModel(GptConfig config);
  // Phase::kForward also turns the logits into d(loss)/dlogits scaled by dloss (one fused pass).
  Result<float> forward_pass(const int32_t* inputs, const int32_t* targets, int B, int T,
                             ParamAccess& access, Phase phase, float dloss);
  Status block_forward(int layer, int slot, int B, int T, ParamAccess& access, Phase phase,
                       const float* pending);
  Status backward_pass(const int32_t* inputs, int B, int T, ParamAccess& access);
  Status block_backward(int layer, int slot, int B, int T, ParamAccess& access);

  GptConfig config_;
  std::vector<ParamSpec> params_;
  std::vector<ModuleSpec> modules_;
  std::unique_ptr<GptActivations> acts_;
  Matmul matmul_;
  uint64_t weight_copy_limit_ = UINT64_MAX;  // limit_weight_copies()
};

// Module ids of GptModel::modules(), for engines and tests that want to name one.
inline int module_wte_wpe() { return 0; }
inline int module_ln_1(int layer) { return 1 + 4 * layer; }
inline int module_attn(int layer) { return 2 + 4 * layer; }
inline int module_ln_2(int layer) { return 3 + 4 * layer; }
inline int module_mlp(int layer) { return 4 + 4 * layer; }
inline int module_ln_f(int n_layer) { return 1 + 4 * n_layer; }
inline int module_lm_head(int n_layer) { return 2 + 4 * n_layer; }

}  // namespace zinf::model
