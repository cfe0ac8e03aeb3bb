// GPT-2 configurations: presets, validation, parameter counts and the parameter/module layout.
#include "zinf/model/config.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cassert>
#include <cstdint>
#include <cmath>

#include "model/layout.h"

namespace zinf::model {

namespace {

struct Preset {
  std::string_view name;
  int n_layer;
  int n_embd;
  int n_head;
  int max_seq;
};

// Small ones train on a CPU in minutes; gpt2* are OpenAI's GPT-2 sizes; the rest follow the
// GPT-3 paper's shapes (heads of 64 or 128), which is what the ZeRO-Infinity papers scale.
constexpr Preset kPresets[] = {
    {"tiny", 2, 64, 4, 64},
    {"mini", 4, 128, 4, 128},
    {"small", 6, 384, 6, 256},
    {"gpt2", 12, 768, 12, 1024},
    {"gpt2-medium", 24, 1024, 16, 1024},
    {"gpt2-large", 36, 1280, 20, 1024},
    {"1.3b", 24, 2048, 16, 2048},
    {"gpt2-xl", 48, 1600, 25, 1024},
    {"2.7b", 32, 2560, 32, 2048},
    {"6.7b", 32, 4096, 32, 2048},
    {"13b", 40, 5120, 40, 2048},
};

constexpr int kMaxVocab = 1 << 24;
constexpr int kMaxSeq = 1 << 20;
constexpr int kMaxEmbd = 1 << 16;
constexpr int kMaxLayer = 1 << 12;

}  // namespace

namespace detail {

Status check_range(std::string_view field, int value, int lo, int hi) {
  if (value < lo || value > hi) {
    return Status::invalid_argument(fmt::format("{} ({}) must be between {} and {}", field, value, lo, hi));
  }
  return Status::ok();
}

Status check_decoder_dims(int vocab_size, int max_seq, int n_layer, int n_embd, int n_head) {
  ZINF_RETURN_IF_ERROR(check_range("vocab_size", vocab_size, 1, kMaxVocab));
  ZINF_RETURN_IF_ERROR(check_range("max_seq", max_seq, 1, kMaxSeq));
  ZINF_RETURN_IF_ERROR(check_range("n_layer", n_layer, 1, kMaxLayer));
  ZINF_RETURN_IF_ERROR(check_range("n_embd", n_embd, 1, kMaxEmbd));
  ZINF_RETURN_IF_ERROR(check_range("n_head", n_head, 1, n_embd));
  if (n_embd % n_head != 0) {
    return Status::invalid_argument(fmt::format("n_embd ({}) must be divisible by n_head ({})", n_embd, n_head));
  }
  return Status::ok();
}

}  // namespace detail

Status validate_config(const GptConfig& c) {
  return detail::check_decoder_dims(c.vocab_size, c.max_seq, c.n_layer, c.n_embd, c.n_head);
}

Result<GptConfig> gpt_preset(std::string_view name, int vocab_size) {
  for (const Preset& p : kPresets) {
    if (p.name != name) continue;
    GptConfig c;
    c.vocab_size = vocab_size;
    c.max_seq = p.max_seq;
    c.n_layer = p.n_layer;
    c.n_head = p.n_head;
    c.n_embd = p.n_embd;
    ZINF_RETURN_IF_ERROR(validate_config(c));
    return c;
  }
  std::string known;
  for (const Preset& p : kPresets) known += fmt::format("{}{}", known.empty() ? "" : ", ", p.name);
  return Status::invalid_argument(
      fmt::format("unknown model preset '{}' (known: {})", name, known));
}

std::vector<std::string> gpt_preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

std::string gpt_config_json(const GptConfig& c) {
  const nlohmann::json j = {{"type", "gpt"},          {"vocab_size", c.vocab_size}, {"max_seq", c.max_seq},
                            {"n_layer", c.n_layer},   {"n_head", c.n_head},         {"n_embd", c.n_embd}};
  return j.dump();
}

Result<GptConfig> gpt_config_from_json(std::string_view text, std::string_view source) {
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::invalid_argument(fmt::format("{}: the model configuration is not a JSON object", source));
  }
  if (j.contains("type") && j["type"] != "gpt") {
    return Status::invalid_argument(fmt::format("{}: model type {} is not \"gpt\"", source, j["type"].dump()));
  }
  GptConfig c;
  for (auto [key, field] : {std::pair{"vocab_size", &c.vocab_size}, std::pair{"max_seq", &c.max_seq},
                            std::pair{"n_layer", &c.n_layer}, std::pair{"n_head", &c.n_head},
                            std::pair{"n_embd", &c.n_embd}}) {
    const auto it = j.find(key);
    const bool fits = it != j.end() && it->is_number_integer() &&
                      (it->is_number_unsigned() ? it->get<uint64_t>() <= INT32_MAX
                                                : it->get<int64_t>() >= INT32_MIN && it->get<int64_t>() <= INT32_MAX);
    if (!fits) {
      return Status::invalid_argument(fmt::format("{}: model key \"{}\" must be an integer, found {}", source, key,
                                                  it == j.end() ? "nothing" : it->dump()));
    }
    *field = it->get<int>();
  }
  ZINF_RETURN_IF_ERROR(validate_config(c).with_context(source));
  return c;
}

uint64_t gpt_num_params(const GptConfig& c) {
  const uint64_t C = static_cast<uint64_t>(c.n_embd);
  const uint64_t per_layer = 12 * C * C + 13 * C;
  return static_cast<uint64_t>(c.vocab_size) * C + static_cast<uint64_t>(c.max_seq) * C +
         static_cast<uint64_t>(c.n_layer) * per_layer + 2 * C;
}

namespace detail {

void build_layout(const GptConfig& c, std::vector<ParamSpec>* params,
                  std::vector<ModuleSpec>* modules) {
  params->clear();
  modules->clear();
  const int64_t C = c.n_embd;
  const float kStd = 0.02f;
  // GPT-2 scales the residual projections by 1/sqrt(2 * n_layer): two per block add to the stream.
  const float proj_std = kStd / std::sqrt(2.0f * static_cast<float>(c.n_layer));
  LayoutBuilder b(params, modules);
  b.begin_module("wte_wpe", /*backward_reads_values=*/false);
  b.add("wte.weight", {c.vocab_size, C}, ParamInit::kNormal, kStd);
  b.add("wpe.weight", {c.max_seq, C}, ParamInit::kNormal, 0.01f);
  for (int l = 0; l < c.n_layer; l++) {
    const std::string h = fmt::format("h.{}.", l);
    b.begin_module(h + "ln_1");
    b.add(h + "ln_1.weight", {C}, ParamInit::kOnes);
    b.add(h + "ln_1.bias", {C}, ParamInit::kZeros);
    b.begin_module(h + "attn");
    b.add(h + "attn.c_attn.weight", {3 * C, C}, ParamInit::kNormal, kStd);
    b.add(h + "attn.c_attn.bias", {3 * C}, ParamInit::kZeros);
    b.add(h + "attn.c_proj.weight", {C, C}, ParamInit::kNormal, proj_std);
    b.add(h + "attn.c_proj.bias", {C}, ParamInit::kZeros);
    b.begin_module(h + "ln_2");
    b.add(h + "ln_2.weight", {C}, ParamInit::kOnes);
    b.add(h + "ln_2.bias", {C}, ParamInit::kZeros);
    b.begin_module(h + "mlp");
    b.add(h + "mlp.c_fc.weight", {4 * C, C}, ParamInit::kNormal, kStd);
    b.add(h + "mlp.c_fc.bias", {4 * C}, ParamInit::kZeros);
    b.add(h + "mlp.c_proj.weight", {C, 4 * C}, ParamInit::kNormal, proj_std);
    b.add(h + "mlp.c_proj.bias", {C}, ParamInit::kZeros);
  }
  b.begin_module("ln_f");
  b.add("ln_f.weight", {C}, ParamInit::kOnes);
  b.add("ln_f.bias", {C}, ParamInit::kZeros);
  b.begin_module("lm_head");
  b.reuse(0);  // tied to wte
  assert(static_cast<int>(modules->size()) == 4 * c.n_layer + 3);
}

}  // namespace detail

}  // namespace zinf::model
