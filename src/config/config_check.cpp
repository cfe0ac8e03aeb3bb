// `zinf config check FILE`: validate a ds_config.json, print it resolved or print the error.
#include "zinf/config/config_check.h"

namespace zinf::config {

int run_config_check(const std::string& path, const AutoContext& ctx, std::ostream& out,
                     std::ostream& err) {
  Result<DsConfig> config = load_ds_config(path, ctx);
  if (!config.is_ok()) {
    err << "error: " << config.status().message() << "\n";
    return kConfigCheckInvalid;
  }
  for (const std::string& w : config->warnings) err << "warning: " << w << "\n";
  for (const AutoResolution& a : config->auto_resolved) {
    err << "note: " << a.key << " = " << a.value << " (auto: " << a.source << ")\n";
  }
  out << resolved_config_json(*config) << "\n";
  return kConfigCheckOk;
}

}  // namespace zinf::config
