// Internal: table-driven reading of optimizer and scheduler "params" blocks.
#pragma once

#include <span>
#include <string_view>

#include "config/reader.h"
#include "zinf/config/ds_config.h"

namespace zinf::config::detail {

enum class ParamKind {
  kInt,
  kNumber,
  kBool,
  kBetas,        // a list of two numbers
  kWarmupType,   // "log" or "linear"
  kMustBeFalse,  // a torch option zinf does not implement: accepted only when false
  kMustBeZero,   // likewise for a number
  kIgnored,      // known to the reference, no effect in zinf: named in the warning
};

// Where "auto" (and a key the file leaves out) takes its value from.
enum class ParamSource { kNone, kZero, kLr, kBetas, kEps, kWeightDecay, kWarmupSteps, kTotalSteps };

enum class Presence {
  kDefault,   // absent: the default
  kRequired,  // absent and no command-line value: an error
  kOptional,  // absent: left out of the list
};

struct ParamSpec {
  std::string_view name;
  ParamKind kind;
  Presence presence = Presence::kDefault;
  double def = 0.0;   // numbers, integers, booleans (0/1), first beta
  double def2 = 0.0;  // second beta
  ParamSource source = ParamSource::kNone;
  NumberRange range = {};
  std::string_view def_text = {};  // kWarmupType default
};

// Reads every spec from `r` (the params object, possibly absent) into `out` in table order,
// resolving "auto" and command-line values; `owner` ("WarmupDecayLR") names the type in
// messages. Leaves r.finish() to the caller.
Status read_params(ParseState& st, ObjectReader& r, std::span<const ParamSpec> specs,
                   std::string_view owner, ParamList* out);

}  // namespace zinf::config::detail
