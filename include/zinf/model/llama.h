// LlamaModel: a Llama-architecture decoder (Hugging Face LlamaForCausalLM), forward and backward
// on the CPU in fp32, and its configuration.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>


#include "zinf/model/matmul.h"
#include "zinf/model/model.h"
#include "zinf/status.h"

namespace zinf::model {

// RoPE scaling (HF config.json `rope_scaling`, or `rope_parameters` in transformers 5): how the
// rotary frequencies are stretched for long contexts. The fields a type does not read keep their
// defaults; each is HF's key of the same name.
// rope_type: none ("default"), "linear", "dynamic" (NTK-aware, by the sequence length), "yarn",
// "llama3".
enum class RopeType { kDefault, kLinear, kDynamic, kYarn, kLlama3 };
std::string_view rope_type_name(RopeType type);  // HF's name

struct RopeScaling {
  RopeType type = RopeType::kDefault;
  double factor = 1.0;                      // factor (all but default)
  int original_max_position_embeddings = 0;  // llama3 (required), yarn (optional); 0: absent
  double low_freq_factor = 1.0;              // llama3
  double high_freq_factor = 4.0;             // llama3
  double beta_fast = 32.0;                   // yarn
  double beta_slow = 1.0;                    // yarn
  double attention_factor = 0.0;             // yarn: 0 = computed from factor (and mscale)
  double mscale = 0.0;                       // yarn: 0 = absent
  double mscale_all_dim = 0.0;               // yarn: 0 = absent
  bool truncate = true;                      // yarn: floor/ceil the correction range

  bool operator==(const RopeScaling&) const = default;
};

// The rotary frequencies a configuration uses at sequence length `seq_len` (only "dynamic"
// depends on it), as transformers' ROPE_INIT_FUNCTIONS compute them but in double:
// inv_freq[i] for i < head_dim/2, and the factor cos and sin are multiplied by (yarn; 1 else).
struct RopeFrequencies {
  std::vector<double> inv_freq;
  double attention_factor = 1.0;
};

// The dimensions of a Llama-family model. Each field is the HF config field in the comment, with
// the same meaning, so an HF config.json maps field by field. Field names double as the names
// in error messages and in config_json(). Mistral, Qwen2/Qwen2.5 and Qwen3 are this model with
// a difference (family and the fields marked so).
// The HF model_type a LlamaConfig is (and is written back as).
enum class LlamaFamily { kLlama, kMistral, kQwen2, kQwen3 };
std::string_view llama_family_name(LlamaFamily family);  // "llama", "mistral", "qwen2", "qwen3"
// The family of an HF model_type, or nullopt for another.
std::optional<LlamaFamily> llama_family_of(std::string_view model_type);

struct LlamaConfig {
  int vocab_size = 256;           // vocab_size
  int max_seq = 64;               // max_position_embeddings: the longest sequence T accepted
  int n_layer = 2;                // num_hidden_layers
  int n_head = 4;                 // num_attention_heads
  int n_kv_head = 2;              // num_key_value_heads: query head h reads kv head h / (n_head / n_kv_head)
  int n_embd = 64;                // hidden_size
  int head_dim = 0;               // head_dim (Qwen3, Mistral): 0 = n_embd / n_head; even (RoPE rotates pairs)
  int intermediate_size = 172;    // intermediate_size: the SwiGLU MLP width
  double rms_norm_eps = 1e-6;     // rms_norm_eps: x / sqrt(mean(x^2) + eps), eps added in fp32
  double rope_theta = 10000.0;    // rope_theta (rope_parameters.rope_theta in transformers 5)
  RopeScaling rope_scaling;       // rope_scaling / rope_parameters.rope_type and its keys
  bool tie_word_embeddings = false;  // the LM head reuses model.embed_tokens.weight
  bool qkv_bias = false;          // biases on q_proj, k_proj, v_proj (Qwen2; Llama's attention_bias)
  bool o_bias = false;            // a bias on o_proj (Llama's attention_bias; Qwen2 has none)
  bool qk_norm = false;           // Qwen3: RMSNorm over each head of q and k (q_norm, k_norm) before RoPE
  int sliding_window = 0;         // sliding_window when the attention uses it (Mistral v0.1); 0 = none.
                                  // zinf's attention is fully causal: T is limited to the window.
  LlamaFamily family = LlamaFamily::kLlama;  // the HF model_type written back
  // Keep only block inputs in forward; recompute each block in backward. A run-time choice:
  // not in config_json(), changes no bit of any result.
  bool activation_checkpointing = false;

  int head_size() const { return head_dim > 0 ? head_dim : (n_head > 0 ? n_embd / n_head : 0); }
  bool operator==(const LlamaConfig&) const = default;
};

// The rotary frequencies of `config` at sequence length seq_len (see RopeFrequencies).
RopeFrequencies rope_frequencies(const LlamaConfig& config, int seq_len);

// A RopeScaling as the JSON object HF writes ({"rope_type": ..., "factor": ..., and the keys
// its type reads}), and read back from HF's `rope_scaling` / `rope_parameters` object (transformers
// 4's "type" is accepted for "rope_type"; keys of other types, such as rope_theta, are ignored).
// Errors name `where` and the key; the type itself is checked by validate_llama_config.
std::string rope_scaling_json_text(const RopeScaling& scaling);
Result<RopeScaling> rope_scaling_from_json_text(std::string_view text, std::string_view where);

// Checks every field; the error names the offending field and its value, e.g.
// "n_head (4) must be divisible by n_kv_head (3)" or "head_dim (n_embd / n_head = 5) must be
// even for rotary embeddings".
Status validate_llama_config(const LlamaConfig& config);

// The architecture as JSON text: {"type": "llama", every field above except
// activation_checkpointing}. Doubles are written so that they read back to the same bits. The
// fields added for the other families (head_dim, rope_scaling, qkv_bias, o_bias, qk_norm,
// sliding_window, family) are written only when they differ from Llama's defaults, so a Llama
// checkpoint records what it recorded before them; reading takes them as optional.
std::string llama_config_json(const LlamaConfig& config);
// Reads that object back (every key required, "type" must be "llama") and validates it; errors
// name `source` and the key.
Result<LlamaConfig> llama_config_from_json(std::string_view text, std::string_view source);

// Parameter elements of a model with this configuration (a tied head counted once).
uint64_t llama_num_params(const LlamaConfig& config);

struct LlamaActivations;  // internal: the model's activation and scratch buffers

// Token embedding; n_layer pre-norm blocks
//   x = x + o_proj(attention(rope(q_proj(h)), rope(k_proj(h)), v_proj(h))),  h = input_layernorm(x)
//   x = x + down_proj(silu(gate_proj(h)) * up_proj(h)),                      h = post_attention_layernorm(x)
// with causal grouped-query attention (biases on the projections and q_norm/k_norm before RoPE as
// the configuration says: Qwen2, Qwen3, Llama's attention_bias); final RMSNorm (model.norm); LM head
// (lm_head.weight, or embed_tokens.weight when tied); mean cross-entropy loss.
//
// Parameter names, shapes ([out, in], as torch Linear stores them) and order follow HF
// LlamaForCausalLM, so HF weights load by name with no transpose. Modules, in forward order:
// "model.embed_tokens"; per layer i "model.layers.i.input_layernorm", ".self_attn" (q, k, v
// (each weight then bias when present), o (weight, bias), q_norm, k_norm), ".post_attention_layernorm",
// ".mlp" (gate, up, down); "model.norm"; "lm_head" (owns
// lm_head.weight, or lists embed_tokens.weight again when tied; the embedding module owns it
// and its backward reads no values). The ParamAccess trace is GptModel's (gpt.h), module for
// module.
//
// Deterministic like GptModel: the same inputs and parameter values give bit-identical loss and
// gradients, with or without activation checkpointing. Not thread-safe: one pass at a time.
class LlamaModel final : public Model {
 public:
  // Fails with the validate_llama_config() error (naming the field) for an invalid configuration.
  static Result<std::unique_ptr<LlamaModel>> create(LlamaConfig config);
  LlamaModel(LlamaModel&&) noexcept;
  LlamaModel& operator=(LlamaModel&&) noexcept;
  ~LlamaModel() override;

  const LlamaConfig& config() const { return config_; }

  std::string_view type() const override { return "llama"; }
  std::string describe() const override;
  std::string config_json() const override { return llama_config_json(config_); }
  std::span<const ParamSpec> params() const override { return params_; }
  std::span<const ModuleSpec> modules() const override { return modules_; }
  int vocab_size() const override { return config_.vocab_size; }
  int max_seq() const override { return config_.max_seq; }
  int hidden_size() const override { return config_.n_embd; }

  Result<float> forward_backward(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B, int T,
                                 ParamAccess& access, float loss_scale) override;
  Result<float> forward_loss(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B, int T,
                             ParamAccess& access) override;
  // Inference: writes the (B, T, vocab_size) logits of `inputs` to `logits` (Phase::kEval).
  Status forward_logits(std::span<const int32_t> inputs, int B, int T, ParamAccess& access,
                        std::span<float> logits);

  Status reserve(int B, int T) override;

  // Matrix products: fp32 OpenBLAS until told otherwise. set_compute_precision() resolves the
  // kind for the run (resolve_matmul); use_matmul() sets it directly (tests, benchmarks).
  Status set_compute_precision(ComputePrecision precision) override;
  Status use_matmul(MatmulKind kind) { return matmul_.use(kind); }
  MatmulKind matmul_kind() const { return matmul_.kind(); }
  uint64_t activation_bytes(int B, int T) const override;
  uint64_t weight_copy_bytes() const override;
  void limit_weight_copies(uint64_t bytes) override;

 private:
  explicit LlamaModel(LlamaConfig config);
  Status forward_to_logits(const int32_t* inputs, int B, int T, ParamAccess& access, Phase phase);
  Status block_forward(int layer, int slot, int B, int T, ParamAccess& access, Phase phase, const float* pending);
  Status backward_pass(const int32_t* inputs, int B, int T, ParamAccess& access);
  Status block_backward(int layer, int slot, int B, int T, ParamAccess& access);
  int embed_module() const { return 0; }
  int block_module(int layer, int k) const { return 1 + 4 * layer + k; }  // k: 0 ln, 1 attn, 2 ln, 3 mlp
  int norm_module() const { return 1 + 4 * config_.n_layer; }
  int head_module() const { return 2 + 4 * config_.n_layer; }

  LlamaConfig config_;
  std::vector<ParamSpec> params_;
  std::vector<ModuleSpec> modules_;
  std::unique_ptr<LlamaActivations> acts_;
  Matmul matmul_;
  uint64_t weight_copy_limit_ = UINT64_MAX;  // limit_weight_copies()
};

}  // namespace zinf::model
