// Llama configurations: validation, the recorded JSON, parameter counts and the parameter/module
// layout (Hugging Face LlamaForCausalLM names).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <climits>
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

namespace {

constexpr std::pair<LlamaFamily, std::string_view> kFamilies[] = {
    {LlamaFamily::kLlama, "llama"}, {LlamaFamily::kMistral, "mistral"}, {LlamaFamily::kQwen2, "qwen2"},
    {LlamaFamily::kQwen3, "qwen3"}};
constexpr std::pair<RopeType, std::string_view> kRopeTypes[] = {
    {RopeType::kDefault, "default"}, {RopeType::kLinear, "linear"}, {RopeType::kDynamic, "dynamic"},
    {RopeType::kYarn, "yarn"}, {RopeType::kLlama3, "llama3"}};

}  // namespace

std::string_view llama_family_name(LlamaFamily family) {
  for (auto [f, name] : kFamilies) {
    if (f == family) return name;
  }
  return "?";
}

std::optional<LlamaFamily> llama_family_of(std::string_view model_type) {
  for (auto [f, name] : kFamilies) {
    if (name == model_type) return f;
  }
  return std::nullopt;
}

std::string_view rope_type_name(RopeType type) {
  for (auto [t, name] : kRopeTypes) {
    if (t == type) return name;
  }
  return "?";
}

namespace {

Status validate_rope_scaling(const LlamaConfig& c) {
  const RopeScaling& s = c.rope_scaling;
  if (s.type == RopeType::kDefault) return Status::ok();
  ZINF_RETURN_IF_ERROR(check_positive("rope_scaling.factor", s.factor));
  if (s.type == RopeType::kLlama3) {
    if (s.original_max_position_embeddings < 1) {
      return Status::invalid_argument("rope_scaling.original_max_position_embeddings must be given (> 0) for llama3");
    }
    ZINF_RETURN_IF_ERROR(check_positive("rope_scaling.low_freq_factor", s.low_freq_factor));
    ZINF_RETURN_IF_ERROR(check_positive("rope_scaling.high_freq_factor", s.high_freq_factor));
    if (!(s.high_freq_factor > s.low_freq_factor)) {
      return Status::invalid_argument(fmt::format("rope_scaling.high_freq_factor ({}) must be above low_freq_factor ({})",
                                                  s.high_freq_factor, s.low_freq_factor));
    }
  }
  if (s.type == RopeType::kYarn) {
    ZINF_RETURN_IF_ERROR(check_positive("rope_scaling.beta_fast", s.beta_fast));
    ZINF_RETURN_IF_ERROR(check_positive("rope_scaling.beta_slow", s.beta_slow));
    for (auto [name, v] : {std::pair{"rope_scaling.attention_factor", s.attention_factor},
                           std::pair{"rope_scaling.mscale", s.mscale},
                           std::pair{"rope_scaling.mscale_all_dim", s.mscale_all_dim}}) {
      if (!(v >= 0.0) || !std::isfinite(v)) {
        return Status::invalid_argument(fmt::format("{} ({}) must be a finite number >= 0", name, v));
      }
    }
  }
  return Status::ok();
}

}  // namespace

Status validate_llama_config(const LlamaConfig& c) {
  // What each family's HF class has, so that an export is that class's model.
  struct Shape {
    LlamaFamily family;
    bool qkv_bias, o_bias_is_qkv_bias, o_bias, qk_norm;
    const char* what;
  };
  for (const Shape& f :
       {Shape{LlamaFamily::kLlama, false, true, false, false, "q/k/v and o_proj biases together (attention_bias) and no q/k norms"},
        Shape{LlamaFamily::kMistral, false, false, false, false, "no biases and no q/k norms"},
        Shape{LlamaFamily::kQwen2, true, false, false, false, "q/k/v biases, no o_proj bias and no q/k norms"},
        Shape{LlamaFamily::kQwen3, false, true, false, true, "q/k norms, and q/k/v and o_proj biases together (attention_bias)"}}) {
    if (c.family != f.family) continue;
    const bool ok = f.o_bias_is_qkv_bias ? c.o_bias == c.qkv_bias
                                         : (c.qkv_bias == f.qkv_bias && c.o_bias == f.o_bias);
    if (!ok || c.qk_norm != f.qk_norm) {
      return Status::invalid_argument(fmt::format("family {} has {}: qkv_bias {}, o_bias {}, qk_norm {} is not one",
                                                  llama_family_name(c.family), f.what, c.qkv_bias, c.o_bias, c.qk_norm));
    }
  }
  if (c.head_dim == 0) {
    ZINF_RETURN_IF_ERROR(detail::check_decoder_dims(c.vocab_size, c.max_seq, c.n_layer, c.n_embd, c.n_head));
  } else {
    // An explicit head_dim (Qwen3, Mistral): hidden need not be n_head * head_dim.
    ZINF_RETURN_IF_ERROR(detail::check_decoder_dims(c.vocab_size, c.max_seq, c.n_layer, c.n_embd, 1));
    ZINF_RETURN_IF_ERROR(check_range("n_head", c.n_head, 1, 1 << 12));
    ZINF_RETURN_IF_ERROR(check_range("head_dim", c.head_dim, 2, 1 << 12));
  }
  if (const int hd = c.head_size(); hd % 2 != 0) {
    return Status::invalid_argument(
        c.head_dim == 0 ? fmt::format("head_dim (n_embd / n_head = {}) must be even for rotary embeddings", hd)
                        : fmt::format("head_dim ({}) must be even for rotary embeddings", hd));
  }
  ZINF_RETURN_IF_ERROR(check_range("n_kv_head", c.n_kv_head, 1, c.n_head));
  if (c.n_head % c.n_kv_head != 0) {
    return Status::invalid_argument(
        fmt::format("n_head ({}) must be divisible by n_kv_head ({})", c.n_head, c.n_kv_head));
  }
  ZINF_RETURN_IF_ERROR(check_range("intermediate_size", c.intermediate_size, 1, kMaxIntermediate));
  ZINF_RETURN_IF_ERROR(check_range("sliding_window", c.sliding_window, 0, INT32_MAX));
  ZINF_RETURN_IF_ERROR(check_positive("rms_norm_eps", c.rms_norm_eps));
  ZINF_RETURN_IF_ERROR(check_positive("rope_theta", c.rope_theta));
  return validate_rope_scaling(c);
}

namespace {

nlohmann::json rope_scaling_json(const RopeScaling& s) {
  nlohmann::json j = {{"rope_type", rope_type_name(s.type)}, {"factor", s.factor}};
  if (s.original_max_position_embeddings > 0) j["original_max_position_embeddings"] = s.original_max_position_embeddings;
  if (s.type == RopeType::kLlama3) {
    j["low_freq_factor"] = s.low_freq_factor;
    j["high_freq_factor"] = s.high_freq_factor;
  }
  if (s.type == RopeType::kYarn) {
    j["beta_fast"] = s.beta_fast;
    j["beta_slow"] = s.beta_slow;
    j["truncate"] = s.truncate;
    if (s.attention_factor > 0) j["attention_factor"] = s.attention_factor;
    if (s.mscale > 0) j["mscale"] = s.mscale;
    if (s.mscale_all_dim > 0) j["mscale_all_dim"] = s.mscale_all_dim;
  }
  return j;
}

}  // namespace

namespace {

Result<RopeScaling> rope_scaling_from_object(const nlohmann::json& j, std::string_view where) {
  RopeScaling s;
  if (!j.is_object()) {
    return Status::invalid_argument(fmt::format("{} must be an object, found {}", where, j.dump()));
  }
  // transformers 4 wrote "type" before "rope_type"; either names it.
  const nlohmann::json* type = j.contains("rope_type") ? &j["rope_type"] : j.contains("type") ? &j["type"] : nullptr;
  if (type == nullptr || !type->is_string()) {
    return Status::invalid_argument(fmt::format("{}: \"rope_type\" must be a string, found {}", where,
                                                type == nullptr ? "nothing" : type->dump()));
  }
  const std::string name = type->get<std::string>();
  bool known = false;
  for (auto [t, n] : kRopeTypes) {
    if (n == name) {
      s.type = t;
      known = true;
    }
  }
  if (!known) {
    return Status::unsupported(fmt::format(
        "{}: \"rope_type\" is \"{}\"; zinf computes default, linear, dynamic, yarn and llama3 rotary embeddings", where,
        name));
  }
  auto number = [&](const char* key, double* out) -> Status {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return Status::ok();
    if (!it->is_number()) {
      return Status::invalid_argument(fmt::format("{}: \"{}\" must be a number, found {}", where, key, it->dump()));
    }
    *out = it->get<double>();
    return Status::ok();
  };
  ZINF_RETURN_IF_ERROR(number("factor", &s.factor));
  ZINF_RETURN_IF_ERROR(number("low_freq_factor", &s.low_freq_factor));
  ZINF_RETURN_IF_ERROR(number("high_freq_factor", &s.high_freq_factor));
  ZINF_RETURN_IF_ERROR(number("beta_fast", &s.beta_fast));
  ZINF_RETURN_IF_ERROR(number("beta_slow", &s.beta_slow));
  ZINF_RETURN_IF_ERROR(number("attention_factor", &s.attention_factor));
  ZINF_RETURN_IF_ERROR(number("mscale", &s.mscale));
  ZINF_RETURN_IF_ERROR(number("mscale_all_dim", &s.mscale_all_dim));
  double original = 0;
  ZINF_RETURN_IF_ERROR(number("original_max_position_embeddings", &original));
  if (original != 0 && !(original >= 1 && original <= INT32_MAX && original == std::floor(original))) {
    return Status::invalid_argument(
        fmt::format("{}: \"original_max_position_embeddings\" must be a positive integer, found {}", where, original));
  }
  s.original_max_position_embeddings = static_cast<int>(original);
  if (const auto it = j.find("truncate"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      return Status::invalid_argument(fmt::format("{}: \"truncate\" must be true or false, found {}", where, it->dump()));
    }
    s.truncate = it->get<bool>();
  }
  return s;
}

}  // namespace

std::string rope_scaling_json_text(const RopeScaling& s) { return rope_scaling_json(s).dump(); }

Result<RopeScaling> rope_scaling_from_json_text(std::string_view text, std::string_view where) {
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::invalid_argument(fmt::format("{}: not JSON", where));
  return rope_scaling_from_object(j, where);
}

std::string llama_config_json(const LlamaConfig& c) {
  nlohmann::json j = {{"type", "llama"},
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
  // Written only where they differ from Llama's defaults (a Llama's record is what it was).
  if (c.family != LlamaFamily::kLlama) j["family"] = llama_family_name(c.family);
  if (c.head_dim > 0 && c.head_dim * c.n_head != c.n_embd) j["head_dim"] = c.head_dim;
  if (c.rope_scaling.type != RopeType::kDefault) j["rope_scaling"] = rope_scaling_json(c.rope_scaling);
  if (c.qkv_bias) j["qkv_bias"] = true;
  if (c.o_bias) j["o_bias"] = true;
  if (c.qk_norm) j["qk_norm"] = true;
  if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
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
  auto int_fits = [](const nlohmann::json& v) {
    return v.is_number_integer() && (v.is_number_unsigned() ? v.get<uint64_t>() <= INT32_MAX
                                                            : v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX);
  };
  LlamaConfig c;
  for (auto [key, field] : {std::pair{"vocab_size", &c.vocab_size}, std::pair{"max_seq", &c.max_seq},
                            std::pair{"n_layer", &c.n_layer}, std::pair{"n_head", &c.n_head},
                            std::pair{"n_kv_head", &c.n_kv_head}, std::pair{"n_embd", &c.n_embd},
                            std::pair{"intermediate_size", &c.intermediate_size}}) {
    const auto it = j.find(key);
    if (it == j.end() || !int_fits(*it)) return missing(key, "an integer", it == j.end() ? nullptr : &*it);
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
  // The optional keys (absent in records of plain Llamas).
  for (auto [key, field] : {std::pair{"head_dim", &c.head_dim}, std::pair{"sliding_window", &c.sliding_window}}) {
    if (const auto it = j.find(key); it != j.end()) {
      if (!int_fits(*it)) return missing(key, "an integer", &*it);
      *field = it->get<int>();
    }
  }
  for (auto [key, field] : {std::pair{"qkv_bias", &c.qkv_bias}, std::pair{"o_bias", &c.o_bias},
                            std::pair{"qk_norm", &c.qk_norm}}) {
    if (const auto it = j.find(key); it != j.end()) {
      if (!it->is_boolean()) return missing(key, "true or false", &*it);
      *field = it->get<bool>();
    }
  }
  if (const auto it = j.find("family"); it != j.end()) {
    const auto family = it->is_string() ? llama_family_of(it->get<std::string>()) : std::nullopt;
    if (!family) return missing("family", "one of \"llama\", \"mistral\", \"qwen2\", \"qwen3\"", &*it);
    c.family = *family;
  }
  if (const auto it = j.find("rope_scaling"); it != j.end()) {
    ZINF_ASSIGN_OR_RETURN(c.rope_scaling,
                          rope_scaling_from_object(*it, fmt::format("{}: model key \"rope_scaling\"", source)));
  }
  ZINF_RETURN_IF_ERROR(validate_llama_config(c).with_context(source));
  return c;
}

uint64_t llama_num_params(const LlamaConfig& c) {
  const uint64_t C = static_cast<uint64_t>(c.n_embd);
  const uint64_t hd = static_cast<uint64_t>(c.head_size());
  const uint64_t q = hd * static_cast<uint64_t>(c.n_head);
  const uint64_t kv = hd * static_cast<uint64_t>(c.n_kv_head);
  const uint64_t I = static_cast<uint64_t>(c.intermediate_size);
  uint64_t per_layer = 2 * q * C + 2 * kv * C + 3 * I * C + 2 * C;
  if (c.qkv_bias) per_layer += q + 2 * kv;
  if (c.o_bias) per_layer += C;
  if (c.qk_norm) per_layer += 2 * hd;
  const uint64_t embed = static_cast<uint64_t>(c.vocab_size) * C;
  return embed * (c.tie_word_embeddings ? 1 : 2) + static_cast<uint64_t>(c.n_layer) * per_layer + C;
}

namespace detail {

void build_llama_layout(const LlamaConfig& c, std::vector<ParamSpec>* params, std::vector<ModuleSpec>* modules) {
  params->clear();
  modules->clear();
  const int64_t C = c.n_embd;
  const int64_t hd = c.head_size();
  const int64_t Q = hd * c.n_head;
  const int64_t KV = hd * c.n_kv_head;
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
    // HF's order within the module: each projection's weight then bias, o_proj, the q/k norms.
    for (auto [name, rows] : {std::pair{"q_proj", Q}, std::pair{"k_proj", KV}, std::pair{"v_proj", KV}}) {
      b.add(p + "self_attn." + name + ".weight", {rows, C}, ParamInit::kNormal, kStd);
      if (c.qkv_bias) b.add(p + "self_attn." + name + ".bias", {rows}, ParamInit::kZeros);
    }
    b.add(p + "self_attn.o_proj.weight", {C, Q}, ParamInit::kNormal, kStd);
    if (c.o_bias) b.add(p + "self_attn.o_proj.bias", {C}, ParamInit::kZeros);
    if (c.qk_norm) {
      b.add(p + "self_attn.q_norm.weight", {hd}, ParamInit::kOnes);
      b.add(p + "self_attn.k_norm.weight", {hd}, ParamInit::kOnes);
    }
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
