// Helpers shared by the config tests: fixture paths, temporary folders, parse shortcuts.
#pragma once

#include <string>
#include <string_view>

#include "temp_dir.h"
#include "zinf/config/ds_config.h"

namespace zinf::config::testing {

// Path of a fixture under tests/config/data.
std::string data_path(std::string_view name);
std::string read_text(const std::string& path);

// Per-test folders: the shared helper.
using TempDir = zinf::testing::TempDir;

// Parses `text` as "ds_config.json".
Result<DsConfig> parse(std::string_view text, const AutoContext& ctx = {});
// The error message of parsing `text`; "" (and a test failure) when it parses.
std::string error_of(std::string_view text, const AutoContext& ctx = {});
// Model options only: world size 1, hidden size 1024.
AutoContext model_context();
// What the Hugging Face Trainer would pass for its defaults plus a model with hidden size 1024.
AutoContext trainer_context();
// Replaces every occurrence of `from` in `text` with `to`.
std::string replace_all(std::string text, std::string_view from, std::string_view to);

}  // namespace zinf::config::testing
