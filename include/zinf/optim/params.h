// A small value map for the "params" blocks of ds_config.json (optimizer, scheduler, fp16), so
// that the optim layer does not expose a JSON library. The config layer converts JSON into it.
#pragma once

#include <map>
#include <string>
#include <variant>
#include <vector>

namespace zinf::optim {

// JSON null, boolean, number, string, or array of numbers (e.g. "betas": [0.9, 0.999]).
// Integers are given as doubles; integer settings accept whole numbers only (1e3 is fine, 2.5 is not).
// A null means "not given": the default applies.
using ParamValue = std::variant<std::monostate, bool, double, std::string, std::vector<double>>;
using ParamMap = std::map<std::string, ParamValue, std::less<>>;

}  // namespace zinf::optim
