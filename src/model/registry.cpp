// Built-in models from their recorded configuration.
#include "zinf/model/registry.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "zinf/model/gpt.h"
#include "zinf/model/llama.h"

namespace zinf::model {

std::vector<std::string> builtin_model_types() { return {"gpt", "llama"}; }

Result<std::unique_ptr<Model>> make_builtin_model(std::string_view config_json, std::string_view source,
                                                  const BuiltinOptions& options) {
  const auto j = nlohmann::json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::invalid_argument(fmt::format("{}: the model configuration is not a JSON object", source));
  }
  const auto type = j.find("type");
  if (type == j.end() || *type == "gpt") {
    ZINF_ASSIGN_OR_RETURN(GptConfig c, gpt_config_from_json(config_json, source));
    c.activation_checkpointing = options.activation_checkpointing;
    ZINF_ASSIGN_OR_RETURN(std::unique_ptr<GptModel> gpt, GptModel::create(c));
    return std::unique_ptr<Model>(std::move(gpt));
  }
  if (*type == "llama") {
    ZINF_ASSIGN_OR_RETURN(LlamaConfig c, llama_config_from_json(config_json, source));
    c.activation_checkpointing = options.activation_checkpointing;
    ZINF_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> llama, LlamaModel::create(c));
    return std::unique_ptr<Model>(std::move(llama));
  }
  std::string known;
  for (const std::string& t : builtin_model_types()) known += (known.empty() ? "" : ", ") + t;
  return Status::unsupported(fmt::format("{}: model type {} is not one zinf builds (built-in: {}); a program that "
                                         "defines its own Model builds it itself",
                                         source, type->dump(), known));
}

}  // namespace zinf::model
