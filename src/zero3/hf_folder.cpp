// Hugging Face folders: config.json <-> a built-in model's configuration, HF tensor names and
// layouts <-> zinf's parameters, single or sharded safetensors files.
#include "zinf/zero3/hf_folder.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/json_check.h"

#include "zero3/file_util.h"
#include "zinf/model/config.h"
#include "zinf/model/llama.h"
#include "zinf/model/registry.h"
#include "zinf/zero3/safetensors.h"

namespace zinf::zero3 {
namespace {

using json = nlohmann::json;

// ---- GPT-2 -----------------------------------------------------------------------------------

// A dimension of config.json, in [1, 2^30], or `fallback` when absent (when fallback >= 0).
// InvalidArgument naming the file and key (jsonck's checked reads).
Result<int> int_key(const json& c, const char* key, const std::string& source, int fallback = -1) {
  const jsonck::Where w{source, ""};
  auto v = fallback >= 0 ? jsonck::int_key_or(c, key, fallback, 1, 1 << 30, w) : jsonck::int_key(c, key, 1, 1 << 30, w);
  if (!v.is_ok()) return Status::invalid_argument(v.status().message());
  return static_cast<int>(v.value());
}

// What zinf's GPT computes, checked against what the file asks for.
Result<std::string> gpt2_config_from_hf(const json& c, const std::string& source) {
  model::GptConfig g;
  ZINF_ASSIGN_OR_RETURN(g.vocab_size, int_key(c, "vocab_size", source));
  ZINF_ASSIGN_OR_RETURN(const int n_ctx, int_key(c, "n_ctx", source, 1024));
  ZINF_ASSIGN_OR_RETURN(g.max_seq, int_key(c, "n_positions", source, n_ctx));
  ZINF_ASSIGN_OR_RETURN(g.n_embd, int_key(c, "n_embd", source));
  ZINF_ASSIGN_OR_RETURN(g.n_layer, int_key(c, "n_layer", source));
  ZINF_ASSIGN_OR_RETURN(g.n_head, int_key(c, "n_head", source));
  const auto refuse = [&](const char* key, const std::string& zinf_does) {
    return Status::unsupported(fmt::format("{}: \"{}\" is {}; zinf's GPT-2 {}", source, key, c[key].dump(), zinf_does));
  };
  if (c.contains("activation_function") && c["activation_function"] != "gelu_new" &&
      c["activation_function"] != "gelu_pytorch_tanh") {
    return refuse("activation_function", "uses the tanh GELU (gelu_new)");
  }
  if (c.contains("n_inner") && !c["n_inner"].is_null() && c["n_inner"] != 4 * g.n_embd) {
    return refuse("n_inner", fmt::format("has an MLP of 4 x n_embd = {}", 4 * g.n_embd));
  }
  if (c.contains("layer_norm_epsilon") &&
      !(c["layer_norm_epsilon"].is_number() && c["layer_norm_epsilon"].get<double>() == 1e-5)) {
    return refuse("layer_norm_epsilon", "uses 1e-5");
  }
  if (c.contains("tie_word_embeddings") && c["tie_word_embeddings"] != true) {
    return refuse("tie_word_embeddings", "ties the LM head to wte");
  }
  if (c.contains("scale_attn_weights") && c["scale_attn_weights"] != true) {
    return refuse("scale_attn_weights", "scales attention by 1/sqrt(head_dim)");
  }
  if (c.contains("scale_attn_by_inverse_layer_idx") && c["scale_attn_by_inverse_layer_idx"] != false) {
    return refuse("scale_attn_by_inverse_layer_idx", "does not scale by layer");
  }
  ZINF_RETURN_IF_ERROR(model::validate_config(g).with_context(source));
  return model::gpt_config_json(g);
}

Result<json> gpt2_config_to_hf(const json& z) {
  return json{{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", z["vocab_size"]},
          {"n_positions", z["max_seq"]},
          {"n_ctx", z["max_seq"]},
          {"n_embd", z["n_embd"]},
          {"n_layer", z["n_layer"]},
          {"n_head", z["n_head"]},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", 1e-5},
          {"scale_attn_weights", true},
          {"tie_word_embeddings", true},
          {"torch_dtype", "float32"}};
}

// HF's GPT-2 keeps these linear weights as Conv1D, [in, out]; zinf stores [out, in].
bool gpt2_transposed(std::string_view name) {
  for (std::string_view end : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    if (name.size() >= end.size() && name.substr(name.size() - end.size()) == end) return true;
  }
  return false;
}

// ---- the Llama family: Llama, Mistral, Qwen2/Qwen2.5, Qwen3 -----------------------------------

// A number key, or `fallback` when absent or null.
Result<double> number_key(const json& c, const char* key, const std::string& source, double fallback) {
  const auto it = c.find(key);
  if (it == c.end() || it->is_null()) return fallback;
  if (!it->is_number()) return Status::invalid_argument(fmt::format("{}: \"{}\" must be a number, found {}", source, key, it->dump()));
  return it->get<double>();
}

// A key that is absent, null or false.
bool absent_or_false(const json& c, const char* key) {
  return !c.contains(key) || c[key].is_null() || c[key] == false;
}

// rope_theta and the scaling: transformers 5 nests both in rope_parameters ({"rope_type", "rope_theta",
// and the type's keys}); transformers 4 has rope_theta at the top and rope_scaling (null or an
// object with "rope_type" or "type"). rope_parameters wins where both are given.
Status read_rope(const json& c, const std::string& source, model::LlamaConfig* l) {
  const bool nested = c.contains("rope_parameters") && c["rope_parameters"].is_object();
  ZINF_ASSIGN_OR_RETURN(l->rope_theta, number_key(nested ? c["rope_parameters"] : c, "rope_theta", source, 10000.0));
  const json* scaling = nullptr;
  std::string where;
  if (nested) {
    scaling = &c["rope_parameters"];
    where = fmt::format("{}: \"rope_parameters\"", source);
  } else if (c.contains("rope_scaling") && !c["rope_scaling"].is_null()) {
    scaling = &c["rope_scaling"];
    where = fmt::format("{}: \"rope_scaling\"", source);
  }
  if (scaling == nullptr) return Status::ok();
  if (nested && !scaling->contains("rope_type") && !scaling->contains("type")) return Status::ok();  // theta only
  ZINF_ASSIGN_OR_RETURN(l->rope_scaling, model::rope_scaling_from_json_text(scaling->dump(), where));
  if (scaling->contains("partial_rotary_factor") &&
      !((*scaling)["partial_rotary_factor"].is_number() && (*scaling)["partial_rotary_factor"].get<double>() == 1.0)) {
    return Status::unsupported(fmt::format("{}: \"partial_rotary_factor\" is {}; zinf rotates the whole head", where,
                                           (*scaling)["partial_rotary_factor"].dump()));
  }
  return Status::ok();
}

// The window the folder's attention slides over, or 0 for full causal attention everywhere.
Result<int> sliding_window_of(const json& c, const std::string& family, int n_layer, const std::string& source) {
  const auto window = [&]() -> Result<int> {
    if (!c.contains("sliding_window") || c["sliding_window"].is_null()) {
      return Status::invalid_argument(
          fmt::format("{}: layers use sliding-window attention but \"sliding_window\" is missing", source));
    }
    return int_key(c, "sliding_window", source);
  };
  if (family == "mistral") {
    if (!c.contains("sliding_window") || c["sliding_window"].is_null()) return 0;
    return window();
  }
  if (family != "qwen2" && family != "qwen3") return 0;
  if (c.contains("layer_types") && c["layer_types"].is_array()) {
    for (const json& t : c["layer_types"]) {
      if (t == "sliding_attention") return window();
      if (t != "full_attention") {
        return Status::unsupported(
            fmt::format("{}: \"layer_types\" holds {}; zinf knows full_attention and sliding_attention", source, t.dump()));
      }
    }
    return 0;
  }
  if (absent_or_false(c, "use_sliding_window")) return 0;
  ZINF_ASSIGN_OR_RETURN(const int max_window_layers, int_key(c, "max_window_layers", source, n_layer));
  if (max_window_layers >= n_layer) return 0;
  return window();
}

Result<std::string> llama_family_config_from_hf(const json& c, const std::string& source, const std::string& family) {
  model::LlamaConfig l;
  l.family = model::llama_family_of(family).value_or(model::LlamaFamily::kLlama);
  ZINF_ASSIGN_OR_RETURN(l.vocab_size, int_key(c, "vocab_size", source));
  ZINF_ASSIGN_OR_RETURN(l.max_seq, int_key(c, "max_position_embeddings", source, 2048));
  ZINF_ASSIGN_OR_RETURN(l.n_layer, int_key(c, "num_hidden_layers", source));
  ZINF_ASSIGN_OR_RETURN(l.n_head, int_key(c, "num_attention_heads", source));
  ZINF_ASSIGN_OR_RETURN(l.n_kv_head, int_key(c, "num_key_value_heads", source, l.n_head));
  ZINF_ASSIGN_OR_RETURN(l.n_embd, int_key(c, "hidden_size", source));
  ZINF_ASSIGN_OR_RETURN(l.intermediate_size, int_key(c, "intermediate_size", source));
  ZINF_ASSIGN_OR_RETURN(l.rms_norm_eps, number_key(c, "rms_norm_eps", source, 1e-6));
  ZINF_RETURN_IF_ERROR(read_rope(c, source, &l));
  const auto refuse = [&](const std::string& key, const json& value, const std::string& zinf_does) {
    return Status::unsupported(fmt::format("{}: \"{}\" is {}; zinf's {} {}", source, key, value.dump(), family, zinf_does));
  };
  if (c.contains("tie_word_embeddings")) {
    if (!c["tie_word_embeddings"].is_boolean()) return refuse("tie_word_embeddings", c["tie_word_embeddings"], "needs true or false");
    l.tie_word_embeddings = c["tie_word_embeddings"].get<bool>();
  }
  if (c.contains("hidden_act") && c["hidden_act"] != "silu") return refuse("hidden_act", c["hidden_act"], "uses SiLU (SwiGLU)");
  if (!absent_or_false(c, "mlp_bias")) return refuse("mlp_bias", c["mlp_bias"], "has no MLP biases");
  if (c.contains("pretraining_tp") && !c["pretraining_tp"].is_null() && c["pretraining_tp"] != 1) {
    return refuse("pretraining_tp", c["pretraining_tp"], "computes the plain (tp 1) product");
  }
  if (c.contains("attention_dropout") && !c["attention_dropout"].is_null() &&
      !(c["attention_dropout"].is_number() && c["attention_dropout"].get<double>() == 0.0)) {
    return refuse("attention_dropout", c["attention_dropout"], "has no dropout");
  }
  if (c.contains("partial_rotary_factor") && !c["partial_rotary_factor"].is_null() &&
      !(c["partial_rotary_factor"].is_number() && c["partial_rotary_factor"].get<double>() == 1.0)) {
    return refuse("partial_rotary_factor", c["partial_rotary_factor"], "rotates the whole head");
  }
  // Biases: Llama's and Qwen3's attention_bias puts one on q, k, v and o; Qwen2 always has them
  // on q, k, v only; Mistral has none.
  if (family == "qwen2") {
    l.qkv_bias = true;
  } else if (family == "mistral") {
    if (!absent_or_false(c, "attention_bias")) return refuse("attention_bias", c["attention_bias"], "has no biases");
  } else if (!absent_or_false(c, "attention_bias")) {
    if (c["attention_bias"] != true) return refuse("attention_bias", c["attention_bias"], "needs true or false");
    l.qkv_bias = l.o_bias = true;
  }
  l.qk_norm = family == "qwen3";
  int hd = family == "qwen3" ? 128 : 0;  // Qwen3Config's default head_dim
  if (c.contains("head_dim") && !c["head_dim"].is_null()) {
    ZINF_ASSIGN_OR_RETURN(hd, int_key(c, "head_dim", source));
  }
  if (hd > 0 && static_cast<std::int64_t>(hd) * l.n_head != l.n_embd) l.head_dim = hd;
  ZINF_ASSIGN_OR_RETURN(l.sliding_window, sliding_window_of(c, family, l.n_layer, source));
  ZINF_RETURN_IF_ERROR(model::validate_llama_config(l).with_context(source));
  return model::llama_config_json(l);
}

Result<std::string> llama_config_from_hf(const json& c, const std::string& source) {
  return llama_family_config_from_hf(c, source, "llama");
}
Result<std::string> mistral_config_from_hf(const json& c, const std::string& source) {
  return llama_family_config_from_hf(c, source, "mistral");
}
Result<std::string> qwen2_config_from_hf(const json& c, const std::string& source) {
  return llama_family_config_from_hf(c, source, "qwen2");
}
Result<std::string> qwen3_config_from_hf(const json& c, const std::string& source) {
  return llama_family_config_from_hf(c, source, "qwen3");
}

// config.json for a checkpoint of the family, as transformers 4 and 5 both read it (rope_theta and
// rope_scaling at the top, and transformers 5's rope_parameters).
Result<json> llama_family_config_to_hf(const json& z) {
  ZINF_ASSIGN_OR_RETURN(const model::LlamaConfig l, model::llama_config_from_json(z.dump(), "the checkpoint's model"));
  const std::string family(model::llama_family_name(l.family));
  const char* arch = family == "mistral" ? "MistralForCausalLM"
                     : family == "qwen2" ? "Qwen2ForCausalLM"
                     : family == "qwen3" ? "Qwen3ForCausalLM"
                                         : "LlamaForCausalLM";
  json rope_params = {{"rope_type", "default"}, {"rope_theta", l.rope_theta}};
  json rope_scaling = nullptr;
  if (l.rope_scaling.type != model::RopeType::kDefault) {
    rope_scaling = json::parse(model::rope_scaling_json_text(l.rope_scaling));
    rope_params = rope_scaling;
    rope_params["rope_theta"] = l.rope_theta;
  }
  json j = {{"architectures", {arch}},
            {"model_type", family},
            {"vocab_size", l.vocab_size},
            {"max_position_embeddings", l.max_seq},
            {"num_hidden_layers", l.n_layer},
            {"num_attention_heads", l.n_head},
            {"num_key_value_heads", l.n_kv_head},
            {"hidden_size", l.n_embd},
            {"head_dim", l.head_size()},
            {"intermediate_size", l.intermediate_size},
            {"rms_norm_eps", l.rms_norm_eps},
            {"rope_theta", l.rope_theta},
            {"rope_scaling", rope_scaling},
            {"rope_parameters", rope_params},
            {"tie_word_embeddings", l.tie_word_embeddings},
            {"hidden_act", "silu"},
            {"attention_dropout", 0.0}};
  if (family == "llama") {
    j["attention_bias"] = l.qkv_bias;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  } else if (family == "mistral") {
    j["sliding_window"] = l.sliding_window > 0 ? json(l.sliding_window) : json(nullptr);
  } else {  // qwen2, qwen3
    if (family == "qwen3") j["attention_bias"] = l.qkv_bias;
    j["use_sliding_window"] = l.sliding_window > 0;
    j["sliding_window"] = l.sliding_window > 0 ? json(l.sliding_window) : json(nullptr);
    j["max_window_layers"] = l.sliding_window > 0 ? 0 : l.n_layer;
    j["layer_types"] = json::array();
    for (int i = 0; i < l.n_layer; ++i) {
      j["layer_types"].push_back(l.sliding_window > 0 ? "sliding_attention" : "full_attention");
    }
  }
  return j;
}

bool never_transposed(std::string_view) { return false; }

// ---- the architectures -----------------------------------------------------------------------

struct Architecture {
  std::string_view hf_type;    // config.json's model_type
  std::string_view zinf_type;  // Model::type()
  Result<std::string> (*config_from_hf)(const json& hf, const std::string& source);
  Result<json> (*config_to_hf)(const json& zinf_config);
  bool (*transposed)(std::string_view zinf_name);
  std::string_view write_prefix;  // what HF's *ForCausalLM class prefixes zinf's names with
};

constexpr Architecture kArchitectures[] = {
    {"gpt2", "gpt", gpt2_config_from_hf, gpt2_config_to_hf, gpt2_transposed, "transformer."},
    {"llama", "llama", llama_config_from_hf, llama_family_config_to_hf, never_transposed, ""},
    {"mistral", "llama", mistral_config_from_hf, llama_family_config_to_hf, never_transposed, ""},
    {"qwen2", "llama", qwen2_config_from_hf, llama_family_config_to_hf, never_transposed, ""},
    {"qwen3", "llama", qwen3_config_from_hf, llama_family_config_to_hf, never_transposed, ""},
};

std::string known_hf_types() {
  std::string s;
  for (const Architecture& a : kArchitectures) s += (s.empty() ? "" : ", ") + std::string(a.hf_type);
  return s;
}

std::vector<std::int64_t> hf_shape(const Architecture& arch, const model::ParamSpec& p) {
  if (!arch.transposed(p.name)) return p.shape;
  return std::vector<std::int64_t>(p.shape.rbegin(), p.shape.rend());
}

// out[o][i] = in[i][o] for in of shape (rows, cols).
void transpose(std::span<const float> in, std::size_t rows, std::size_t cols, std::span<float> out) {
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
  }
}

Result<std::string> hf_dtype_of_safetensors(const std::string& dtype) {
  if (dtype == "F32") return std::string("float32");
  if (dtype == "BF16") return std::string("bfloat16");
  if (dtype == "F16") return std::string("float16");
  return Status::invalid_argument(fmt::format("dtype \"{}\" is not F32, BF16 or F16", dtype));
}

Result<std::string> safetensors_dtype_of_hf(const std::string& torch_dtype) {
  if (torch_dtype == "float32") return std::string("F32");
  if (torch_dtype == "bfloat16") return std::string("BF16");
  if (torch_dtype == "float16") return std::string("F16");
  return Status::invalid_argument(
      fmt::format("dtype \"{}\" is not one zinf writes (float32, bfloat16, float16)", torch_dtype));
}

// The dtype the folder's weights are in: config.json's "dtype" (transformers 5) or "torch_dtype"
// (transformers 4), else the tensors' own when they agree, else float32.
Result<std::string> folder_dtype(const json& config, const std::string& config_path,
                                 const std::vector<std::string>& tensor_dtypes) {
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (!config.contains(key) || config[key].is_null()) continue;
    const std::string d = config[key].is_string() ? config[key].get<std::string>() : "";
    if (d == "float32" || d == "bfloat16" || d == "float16") return d;
    if (d == "auto") break;
    return Status::unsupported(fmt::format("{}: \"{}\" is {}; zinf reads float32, bfloat16 and float16 weights",
                                           config_path, key, config[key].dump()));
  }
  std::string seen;
  for (const std::string& st : tensor_dtypes) {
    auto d = hf_dtype_of_safetensors(st);
    if (!d.is_ok()) continue;
    if (!seen.empty() && seen != d.value()) return std::string("float32");  // mixed: keep full precision
    seen = d.value();
  }
  return seen.empty() ? std::string("float32") : seen;
}

Result<json> read_json(const std::string& path) {
  ZINF_ASSIGN_OR_RETURN(std::string text, read_small_file(path));
  auto j = jsonck::parse<json>(text, path);
  if (!j.is_ok()) return Status::invalid_argument(j.status().message());
  if (!j.value().is_object()) return Status::invalid_argument(fmt::format("{}: not a JSON object", path));
  return j;
}

}  // namespace

struct HfFolder::Impl {
  std::string dir;
  std::string model_type;
  std::string dtype;  // torch's name of the weights' dtype
  const Architecture* arch = nullptr;
  std::string config_json;  // zinf's
  std::vector<model::ParamSpec> params;
  std::map<std::string, SafetensorsReader> files;  // by file name
  struct Source {
    const SafetensorsReader* reader;
    std::string name;  // in the file
  };
  std::vector<Source> sources;  // per parameter
};

HfFolder::HfFolder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfFolder::HfFolder(HfFolder&&) noexcept = default;
HfFolder& HfFolder::operator=(HfFolder&&) noexcept = default;
HfFolder::~HfFolder() = default;

const std::string& HfFolder::dir() const { return impl_->dir; }
const std::string& HfFolder::model_type() const { return impl_->model_type; }
const std::string& HfFolder::dtype() const { return impl_->dtype; }

Result<HfFolder> HfFolder::open(const std::string& dir) {
  auto impl = std::make_unique<Impl>();
  impl->dir = dir;
  const std::string config_path = dir + "/config.json";
  ZINF_ASSIGN_OR_RETURN(const json config, read_json(config_path));
  if (!config.contains("model_type") || !config["model_type"].is_string()) {
    return Status::invalid_argument(fmt::format("{}: \"model_type\" is missing (zinf reads {})", config_path, known_hf_types()));
  }
  impl->model_type = config["model_type"].get<std::string>();
  for (const Architecture& a : kArchitectures) {
    if (a.hf_type == impl->model_type) impl->arch = &a;
  }
  if (impl->arch == nullptr) {
    return Status::unsupported(fmt::format("{}: model_type \"{}\" is not one zinf builds (zinf reads {})", config_path,
                                           impl->model_type, known_hf_types()));
  }
  ZINF_ASSIGN_OR_RETURN(impl->config_json, impl->arch->config_from_hf(config, config_path));
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> m, model::make_builtin_model(impl->config_json, config_path));
  impl->params.assign(m->params().begin(), m->params().end());

  // Which file holds each tensor: one model.safetensors, or the index's weight_map.
  std::map<std::string, std::string> file_of;  // tensor name -> file name
  const std::string single = dir + "/model.safetensors", index_path = dir + "/model.safetensors.index.json";
  if (std::filesystem::exists(single)) {
    ZINF_ASSIGN_OR_RETURN(SafetensorsReader r, SafetensorsReader::open(single));
    for (const SafetensorsEntry& e : r.entries()) file_of[e.name] = "model.safetensors";
    impl->files.emplace("model.safetensors", std::move(r));
  } else if (std::filesystem::exists(index_path)) {
    ZINF_ASSIGN_OR_RETURN(const json index, read_json(index_path));
    if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
      return Status::invalid_argument(fmt::format("{}: \"weight_map\" must be an object", index_path));
    }
    for (const auto& [name, file] : index["weight_map"].items()) {
      const std::string f = file.is_string() ? file.get<std::string>() : "";
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
        return Status::invalid_argument(
            fmt::format("{}: weight_map[\"{}\"] = {} is not a file name in the folder", index_path, name, file.dump()));
      }
      file_of[name] = f;
      if (impl->files.count(f) == 0) {
        ZINF_ASSIGN_OR_RETURN(SafetensorsReader r, SafetensorsReader::open(dir + "/" + f));
        impl->files.emplace(f, std::move(r));
      }
    }
  } else {
    return Status::not_found(fmt::format("{}: neither model.safetensors nor model.safetensors.index.json (zinf reads "
                                         "safetensors; convert pytorch_model.bin with transformers first)",
                                         dir));
  }

  // Every parameter, found under its HF name (with or without the class prefix) and shaped so.
  std::vector<std::string> tensor_dtypes;
  for (const model::ParamSpec& p : impl->params) {
    const std::string prefixed = std::string(impl->arch->write_prefix) + p.name;
    const std::string* found = nullptr;
    for (const std::string* candidate : {&prefixed, &p.name}) {
      if (file_of.count(*candidate) != 0) {
        found = candidate;
        break;
      }
    }
    if (found == nullptr) {
      return Status::not_found(fmt::format("{}: tensor {} ({} parameter {}) is missing", dir, prefixed,
                                           impl->model_type, p.name));
    }
    const std::string& file = file_of[*found];
    const SafetensorsReader& reader = impl->files.at(file);
    const SafetensorsEntry* e = reader.find(*found);
    if (e == nullptr) {
      return Status::not_found(fmt::format("{}/{}: tensor {} is listed in the index but not in the file", dir, file, *found));
    }
    const std::vector<std::int64_t> want = hf_shape(*impl->arch, p);
    if (e->shape != want) {
      return Status::invalid_argument(fmt::format("{}/{}: tensor {} has shape [{}], the model needs [{}]", dir, file,
                                                  *found, fmt::join(e->shape, ", "), fmt::join(want, ", ")));
    }
    impl->sources.push_back({&reader, *found});
    tensor_dtypes.push_back(e->dtype);
  }
  ZINF_ASSIGN_OR_RETURN(impl->dtype, folder_dtype(config, config_path, tensor_dtypes));
  return HfFolder(std::move(impl));
}

Result<std::unique_ptr<model::Model>> HfFolder::make_model(bool activation_checkpointing) const {
  return model::make_builtin_model(impl_->config_json, impl_->dir + "/config.json",
                                   model::BuiltinOptions{activation_checkpointing});
}

Status HfFolder::read_param(std::size_t index, std::span<float> out) const {
  const Impl& m = *impl_;
  if (index >= m.params.size() || out.size() != m.params[index].numel) {
    return Status::invalid_argument(fmt::format("{}: read_param({}) with {} elements", m.dir, index, out.size()));
  }
  const model::ParamSpec& p = m.params[index];
  const Impl::Source& src = m.sources[index];
  if (!m.arch->transposed(p.name)) return src.reader->read_f32(src.name, out);
  std::vector<float> stored(out.size());
  ZINF_RETURN_IF_ERROR(src.reader->read_f32(src.name, stored));
  transpose(stored, static_cast<std::size_t>(p.shape[1]), static_cast<std::size_t>(p.shape[0]), out);
  return Status::ok();
}

Result<std::string> model_config_from_hf(const std::string& config_text, const std::string& source) {
  auto j = jsonck::parse<json>(config_text, source);
  if (!j.is_ok()) return Status::invalid_argument(j.status().message());
  const json& config = j.value();
  if (!config.is_object() || !config.contains("model_type") || !config["model_type"].is_string()) {
    return Status::invalid_argument(fmt::format("{}: \"model_type\" is missing (zinf reads {})", source, known_hf_types()));
  }
  for (const Architecture& a : kArchitectures) {
    if (a.hf_type == config["model_type"].get<std::string>()) return a.config_from_hf(config, source);
  }
  return Status::unsupported(fmt::format("{}: model_type {} is not one zinf builds (zinf reads {})", source,
                                         config["model_type"].dump(), known_hf_types()));
}

Result<std::string> model_config_from_hf_file(const std::string& path) {
  std::error_code ec;
  const std::string file = std::filesystem::is_directory(path, ec) ? path + "/config.json" : path;
  ZINF_ASSIGN_OR_RETURN(const std::string text, read_small_file(file));
  return model_config_from_hf(text, file);
}

Status write_hf_folder(const CheckpointReader& checkpoint, const std::string& out_dir, std::uint64_t max_shard_bytes,
                       const std::string& torch_dtype) {
  ZINF_ASSIGN_OR_RETURN(const std::string st_dtype, safetensors_dtype_of_hf(torch_dtype));
  const json z = json::parse(checkpoint.model_config_json(), nullptr, false);
  const Architecture* arch = nullptr;
  for (const Architecture& a : kArchitectures) {
    // The Llama family shares one zinf type; its recorded "family" names the HF model_type.
    if (z.is_object() && z.value("type", "") == a.zinf_type &&
        (a.zinf_type != "llama" || z.value("family", "llama") == a.hf_type)) {
      arch = &a;
    }
  }
  if (arch == nullptr) {
    return Status::unsupported(fmt::format("{}: model type {} has no Hugging Face class zinf writes (it writes {}); use "
                                           "zinf consolidate without --hf for a safetensors file",
                                           checkpoint.folder(), z.is_object() && z.contains("type") ? z["type"].dump() : "?",
                                           known_hf_types()));
  }
  ZINF_ASSIGN_OR_RETURN(json config, arch->config_to_hf(z));
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return Status::sys_error("create " + out_dir, ec.value());

  // Tensors in parameter order, cut into shards of at most max_shard_bytes (a larger tensor
  // gets a shard of its own).
  std::vector<std::vector<TensorToWrite>> shards(1);
  std::uint64_t in_shard = 0, total = 0;
  for (std::size_t i = 0; i < checkpoint.params().size(); ++i) {
    const model::ParamSpec& p = checkpoint.params()[i];
    const std::uint64_t bytes = p.numel * (st_dtype == "F32" ? 4 : 2);
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    in_shard += bytes;
    total += bytes;
    const bool transposed = arch->transposed(p.name);
    shards.back().push_back({std::string(arch->write_prefix) + p.name, hf_shape(*arch, p),
                             [&checkpoint, i, transposed, &p](std::span<float> out) -> Status {
                               if (!transposed) return checkpoint.read_param(i, out);
                               std::vector<float> mine(out.size());
                               ZINF_RETURN_IF_ERROR(checkpoint.read_param(i, mine));
                               transpose(mine, static_cast<std::size_t>(p.shape[0]), static_cast<std::size_t>(p.shape[1]), out);
                               return Status::ok();
                             },
                             st_dtype});
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"source", "zinf " + checkpoint.folder()}};
  const std::string index_path = out_dir + "/model.safetensors.index.json";
  if (shards.size() == 1) {
    ZINF_RETURN_IF_ERROR(write_safetensors(out_dir + "/model.safetensors", shards[0], metadata));
    std::filesystem::remove(index_path, ec);  // a sharded export from before would shadow nothing, but mislead
  } else {
    json weight_map = json::object();
    for (std::size_t s = 0; s < shards.size(); ++s) {
      const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
      ZINF_RETURN_IF_ERROR(write_safetensors(out_dir + "/" + file, shards[s], metadata));
      for (const TensorToWrite& t : shards[s]) weight_map[t.name] = file;
    }
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    ZINF_RETURN_IF_ERROR(write_file_atomic(index_path, index.dump(2) + "\n"));
    std::filesystem::remove(out_dir + "/model.safetensors", ec);  // transformers would take it over the index
  }
  config["torch_dtype"] = torch_dtype;  // transformers 4's key
  config["dtype"] = torch_dtype;        // transformers 5's
  return write_file_atomic(out_dir + "/config.json", config.dump(2) + "\n");
}

}  // namespace zinf::zero3
