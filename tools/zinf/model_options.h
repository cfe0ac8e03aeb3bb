// zinf CLI: the model options shared by train, estimate and config check (--model or dimensions).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "zinf/model/config.h"
#include "zinf/model/model.h"
#include "zinf/status.h"

namespace zinf::cli {

struct ModelOptions {
  std::string preset;  // --model
  std::optional<int> layers, hidden, heads, seq, vocab;

  // Adds --model, --layers, --hidden, --heads, --seq, --vocab to `cmd`; `vocab_default` says
  // in --vocab's help what the command takes without it (what its resolve() is given).
  void add_to(CLI::App& cmd, const std::string& default_preset,
              const std::string& vocab_default = "from the data, 256 for bytes");
  // The model: the preset (if any) with any dimension given on the command line replacing its
  // own; `default_vocab` when neither --vocab nor the data decides. Errors name the option.
  Result<model::GptConfig> resolve(int default_vocab) const;
  bool given() const { return !preset.empty() || layers || hidden || heads || seq; }
};

// --model-config (train and plan): the built-in model that an HF config.json, or a folder
// holding one, describes, made freshly initialised on each call; errors name the option and file.
using ModelMaker = std::function<Result<std::unique_ptr<model::Model>>(bool activation_checkpointing)>;
Result<ModelMaker> model_from_config_option(const std::string& path);

}  // namespace zinf::cli
