// zinf CLI model options: presets plus explicit dimensions, validated with option names.
#include "model_options.h"

#include <fmt/format.h>

#include "zinf/model/registry.h"
#include "zinf/zero3/hf_folder.h"

namespace zinf::cli {

void ModelOptions::add_to(CLI::App& cmd, const std::string& default_preset, const std::string& vocab_default) {
  preset = default_preset;
  std::string names;
  for (const std::string& n : model::gpt_preset_names()) names += (names.empty() ? "" : ", ") + n;
  cmd.add_option("--model", preset, "model preset: " + names)->capture_default_str();
  cmd.add_option("--layers", layers, "number of transformer blocks (overrides the preset)");
  cmd.add_option("--hidden", hidden, "hidden size n_embd (overrides the preset)");
  cmd.add_option("--heads", heads, "attention heads (overrides the preset)");
  cmd.add_option("--seq", seq,
                 "the training window T, tokens per row (a new preset's max positions too; at most the model's max "
                 "positions; default for --model-dir and --model-config: min(max positions, 2048), on --resume the "
                 "checkpoint's)");
  cmd.add_option("--vocab", vocab, "vocabulary size (default: " + vocab_default + ")");
}

Result<model::GptConfig> ModelOptions::resolve(int default_vocab) const {
  const int v = vocab.value_or(default_vocab);
  model::GptConfig c;
  if (!preset.empty()) {
    auto p = model::gpt_preset(preset, v);
    if (!p.is_ok()) return p.status().with_context("--model");
    c = p.value();
  } else {
    c.vocab_size = v;
  }
  if (layers) c.n_layer = *layers;
  if (hidden) c.n_embd = *hidden;
  if (heads) c.n_head = *heads;
  if (seq) c.max_seq = *seq;
  Status s = model::validate_config(c);
  if (!s.is_ok()) {
    return Status::invalid_argument(fmt::format(
        "model options (--layers {} --hidden {} --heads {} --seq {} --vocab {}): {}", c.n_layer, c.n_embd,
        c.n_head, c.max_seq, c.vocab_size, s.message()));
  }
  return c;
}

Result<ModelMaker> model_from_config_option(const std::string& path) {
  auto config = zero3::model_config_from_hf_file(path);
  if (!config.is_ok()) return config.status().with_context("--model-config");
  return ModelMaker([json = std::move(config).value(), path](bool recompute) {
    return model::make_builtin_model(json, path, model::BuiltinOptions{recompute});
  });
}

}  // namespace zinf::cli
