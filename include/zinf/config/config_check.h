// `zinf config check FILE [model options]`: validates a ds_config.json and prints it resolved.
#pragma once

#include <ostream>
#include <string>

#include "zinf/config/ds_config.h"

namespace zinf::config {

// Exit status of `zinf config check`.
inline constexpr int kConfigCheckOk = 0;
inline constexpr int kConfigCheckInvalid = 2;

// Loads `path` with `ctx`. Valid: writes the resolved config JSON to `out`, one "warning: ..."
// line per warning and one "note: KEY = VALUE (auto: SOURCE)" line per resolved "auto" to
// `err`, and returns kConfigCheckOk. Invalid: writes "error: MESSAGE" to `err` and returns
// kConfigCheckInvalid. Never throws, never exits.
int run_config_check(const std::string& path, const AutoContext& ctx, std::ostream& out,
                     std::ostream& err);

}  // namespace zinf::config
