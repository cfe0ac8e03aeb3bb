// The models zinf builds itself from a configuration: for checkpoints and tools that must
// rebuild a model from what a checkpoint recorded (Model::config_json()).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/model/model.h"
#include "zinf/status.h"

namespace zinf::model {

// Run-time choices that config_json() leaves out.
struct BuiltinOptions {
  bool activation_checkpointing = false;
};

// Builds the built-in model a config_json() text describes ("type": "gpt" or "llama"; a text without
// "type" is a GPT, as checkpoints before the Model interface recorded it). A type zinf does not
// build (a user's own model) is an unsupported error naming it and the built-in types; errors
// name `source`.
Result<std::unique_ptr<Model>> make_builtin_model(std::string_view config_json, std::string_view source,
                                                  const BuiltinOptions& options = {});

// The "type" names make_builtin_model() knows.
std::vector<std::string> builtin_model_types();

}  // namespace zinf::model
