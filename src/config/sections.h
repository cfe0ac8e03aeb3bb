// Internal: parsers for the blocks of a ds_config and the helpers they share for "auto".
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "config/reader.h"
#include "zinf/config/ds_config.h"

namespace zinf::config::detail {

inline std::string value_text(std::int64_t v) { return std::to_string(v); }
inline std::string value_text(double v) { return format_number(v); }
inline std::string value_text(bool v) { return v ? "true" : "false"; }
inline std::string value_text(const std::string& v) { return fmt::format("\"{}\"", v); }
inline std::string value_text(const std::vector<double>& v) {
  std::vector<std::string> parts;
  for (double d : v) parts.push_back(format_number(d));
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

inline constexpr std::string_view kReferenceDefault =
    "reference default; DeepSpeed has no source for this \"auto\" either";

// A key without a model or command-line source: "auto" means the reference default, as the
// reference's loader treats it; the choice is noted. `*out` holds the default on entry.
template <typename T>
void take_or_default(ParseState& st, const std::string& path, const Field<T>& f, T* out) {
  if (f.is_auto) {
    st.note_auto(path, value_text(*out), std::string(kReferenceDefault));
  } else if (f.present) {
    *out = f.value;
  }
}

// A key the command line also sets (`given`, spelled `option`): "auto" takes the command-line
// value (an error when there is none), an explicit value must agree with it, and a key the
// file leaves out takes it. `*out` holds the default on entry.
// How a note names a TrainerDefaults value: "the Hugging Face Trainer's default (pass --lr to
// choose; --strict-auto to require it)".
std::string trainer_default_source(std::string_view option);

template <typename T>
Status take_from_context(ParseState& st, const std::string& path, const Field<T>& f,
                         const std::optional<T>& given, std::string_view option, T* out,
                         const std::optional<T>& trainer_default = std::nullopt) {
  if (f.is_auto) {
    if (!given && trainer_default && st.ctx().trainer_defaults) {
      *out = *trainer_default;
      st.note_auto(path, value_text(*trainer_default), trainer_default_source(option));
      return Status::ok();
    }
    if (!given) {
      st.need_option(path, std::string(option),
                     fmt::format("is \"auto\", which takes its value from the command line; "
                                 "pass {}",
                                 option));
      return Status::ok();
    }
    *out = *given;
    st.note_auto(path, value_text(*given), std::string(option));
    return Status::ok();
  }
  if (f.present) {
    if (given && *given != f.value) {
      return st.error(path, fmt::format("the file says {} but {} says {}; make them agree or "
                                        "set the key to \"auto\"",
                                        value_text(f.value), option, value_text(*given)));
    }
    *out = f.value;
    return Status::ok();
  }
  if (given) *out = *given;
  return Status::ok();
}

// zero_optimization (object or the deprecated boolean form) into `zero`. A misplaced
// zero_optimization.aio block (as in some Hugging Face examples) is returned in *nested_aio.
Status parse_zero(ParseState& st, ObjectReader& top, ZeroSection* zero, const Json** nested_aio);
// An aio block at `path` ("aio" or "zero_optimization.aio").
Status parse_aio(ParseState& st, const Json* obj, const std::string& path, AioSection* aio);
// fp16, bf16 (and its old name bfloat16); "enabled": "auto" follows the command-line precision.
Status parse_precision(ParseState& st, ObjectReader& top, Fp16Section* fp16, Bf16Section* bf16);
Status parse_optimizer(ParseState& st, const Json* obj, std::optional<OptimizerSection>* out);
Status parse_scheduler(ParseState& st, const Json* obj, std::optional<SchedulerSection>* out);

}  // namespace zinf::config::detail
