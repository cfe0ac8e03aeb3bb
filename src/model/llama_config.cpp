// Llama configurations: validation, the recorded JSON, parameter counts and the parameter/module
// layout (Hugging Face LlamaForCausalLM names).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>

#include "model/layout.h"
#include "zinf/model/llama.h"

namespace zinf::model {

namespace {

constexpr int kMaxIntermediate = 1 << 20;

using detail::check_range;

Status check_positive(std::string_view field, double value) {
  if (!(value > 0.0) || !std::isfinite(value)) {
    return Status::invalid_argument(fmt::format("{} ({}) must be a finite number > 0", field, value));
  }
  return Status::ok();
}

}  // namespace

Status validate_llama_config(const LlamaConfig& c) {
  ZINF_RETURN_IF_ERROR(detail::check_decoder_dims(c.vocab_size, c.max_seq, c.n_layer, c.n_embd, c.n_head));
  if (const int hd = c.n_embd / c.n_head; hd % 2 != 0) {
    return Status::invalid_argument(
        fmt::format("head_dim (n_embd / n_head = {}) must be even for rotary embeddings", hd));
  }
  ZINF_RETURN_IF_ERROR(check_range("n_kv_head", c.n_kv_head, 1, c.n_head));
  if (c.n_head % c.n_kv_head != 0) {
    return Status::invalid_argument(
        fmt::format("n_head ({}) must be divisible by n_kv_head ({})", c.n_head, c.n_kv_head));
  }
  ZINF_RETURN_IF_ERROR(check_range("intermediate_size", c.intermediate_size, 1, kMaxIntermediate));
  ZINF_RETURN_IF_ERROR(check_positive("rms_norm_eps", c.rms_norm_eps));
  return check_positive("rope_theta", c.rope_theta);
}

std::string llama_config_json(const LlamaConfig& c) {
  const nlohmann::json j = {{"type", "llama"},
                            {"vocab_size", c.vocab_size},
                            {"max_seq", c.max_seq},
                            {"n_layer", c.n_layer},
                            {"n_head", c.n_head},
                            {"n_kv_head", c.n_kv_head},
                            {"n_embd", c.n_embd},
                            {"intermediate_size", c.intermediate_size},
                            {"rms_norm_eps", c.rms_norm_eps},
                            {"rope_theta", c.rope_theta},
                            {"tie_word_embeddings", c.tie_word_embeddings}};
  return j.dump();
}

Result<LlamaConfig> llama_config_from_json(std::string_view text, std::string_view source) {
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::invalid_argument(fmt::format("{}: the model configuration is not a JSON object", source));
  }
  const auto type = j.find("type");
  if (type == j.end() || *type != "llama") {
    return Status::invalid_argument(fmt::format("{}: model type {} is not \"llama\"", source,
                                                type == j.end() ? "(none)" : type->dump()));
  }
  auto missing = [&](const char* key, const char* what, const nlohmann::json* found) {
    return Status::invalid_argument(fmt::format("{}: model key \"{}\" must be {}, found {}", source, key, what,
                                                found == nullptr ? "nothing" : found->dump()));
  };
  LlamaConfig c;
  for (auto [key, field] : {std::pair{"vocab_size", &c.vocab_size}, std::pair{"max_seq", &c.max_seq},
                            std::pair{"n_layer", &c.n_layer}, std::pair{"n_head", &c.n_head},
                            std::pair{"n_kv_head", &c.n_kv_head}, std::pair{"n_embd", &c.n_embd},
                            std::pair{"intermediate_size", &c.intermediate_size}}) {
    const auto it = j.find(key);
    const bool fits = it != j.end() && it->is_number_integer() &&
                      (it->is_number_unsigned() ? it->get<uint64_t>() <= INT32_MAX
                                                : it->get<int64_t>() >= INT32_MIN && it->get<int64_t>() <= INT32_MAX);
    if (!fits) return missing(key, "an integer", it == j.end() ? nullptr : &*it);
    *field = it->get<int>();
  }
  for (auto [key, field] : {std::pair{"rms_norm_eps", &c.rms_norm_eps}, std::pair{"rope_theta", &c.rope_theta}}) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number()) return missing(key, "a number", it == j.end() ? nullptr : &*it);
    *field = it->get<double>();
  }
  const auto tie = j.find("tie_word_embeddings");
  if (tie == j.end() || !tie->is_boolean()) {
    return missing("tie_word_embeddings", "true or false", tie == j.end() ? nullptr : &*tie);
  }
  c.tie_word_embeddings = tie->get<bool>();
  ZINF_RETURN_IF_ERROR(validate_llama_config(c).with_context(source));
  return c;
}

uint64_t llama_num_params(const LlamaConfig& c) {
  const uint64_t C = static_cast<uint64_t>(c.n_embd);
  const uint64_t kv = C / static_cast<uint64_t>(c.n_head) * static_cast<uint64_t>(c.n_kv_head);
  const uint64_t I = static_cast<uint64_t>(c.intermediate_size);
  const uint64_t per_layer = 2 * C * C + 2 * kv * C + 3 * I * C + 2 * C;
  const uint64_t embed = static_cast<uint64_t>(c.vocab_size) * C;
  return embed * (c.tie_word_embeddings ? 1 : 2) + static_cast<uint64_t>(c.n_layer) * per_layer + C;
}

namespace detail {

void build_llama_layout(const LlamaConfig& c, std::vector<ParamSpec>* params, std::vector<ModuleSpec>* modules) {
  params->clear();
  modules->clear();
  const int64_t C = c.n_embd;
  const int64_t KV = C / c.n_head * c.n_kv_head;
  const int64_t I = c.intermediate_size;
  const float kStd = 0.02f;  // HF LlamaConfig.initializer_range, for every Linear and the embedding
  LayoutBuilder b(params, modules);
  b.begin_module("model.embed_tokens", /*backward_reads_values=*/false);
  b.add("model.embed_tokens.weight", {c.vocab_size, C}, ParamInit::kNormal, kStd);
  for (int l = 0; l < c.n_layer; l++) {
    const std::string p = fmt::format("model.layers.{}.", l);
    b.begin_module(p + "input_layernorm");
    b.add(p + "input_layernorm.weight", {C}, ParamInit::kOnes);
    b.begin_module(p + "self_attn");
    b.add(p + "self_attn.q_proj.weight", {C, C}, ParamInit::kNormal, kStd);
    b.add(p + "self_attn.k_proj.weight", {KV, C}, ParamInit::kNormal, kStd);
    b.add(p + "self_attn.v_proj.weight", {KV, C}, ParamInit::kNormal, kStd);
    b.add(p + "self_attn.o_proj.weight", {C, C}, ParamInit::kNormal, kStd);
    b.begin_module(p + "post_attention_layernorm");
    b.add(p + "post_attention_layernorm.weight", {C}, ParamInit::kOnes);
    b.begin_module(p + "mlp");
    b.add(p + "mlp.gate_proj.weight", {I, C}, ParamInit::kNormal, kStd);
    b.add(p + "mlp.up_proj.weight", {I, C}, ParamInit::kNormal, kStd);
    b.add(p + "mlp.down_proj.weight", {C, I}, ParamInit::kNormal, kStd);
  }
  b.begin_module("model.norm");
  b.add("model.norm.weight", {C}, ParamInit::kOnes);
  b.begin_module("lm_head");
  if (c.tie_word_embeddings) {
    b.reuse(0);
  } else {
    b.add("lm_head.weight", {c.vocab_size, C}, ParamInit::kNormal, kStd);
  }
}

}  // namespace detail

}  // namespace zinf::model
