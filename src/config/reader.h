// Internal: typed reading of one JSON object of a ds_config, with full key paths in every message.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config/json_text.h"
#include "zinf/config/ds_config.h"
#include "zinf/status.h"

namespace zinf::config::detail {

// Shared by all readers of one parse: where keys are, what the context says, what to report.
class ParseState {
 public:
  // `text` and `keys` must outlive the state.
  ParseState(std::string source, std::string_view text, const KeyIndex& keys,
             const AutoContext& ctx)
      : source_(std::move(source)), text_(text), keys_(keys), ctx_(ctx) {}

  const std::string& source() const { return source_; }
  const AutoContext& ctx() const { return ctx_; }

  // "SOURCE:LINE:COL: PATH: MESSAGE" (no line when the key is not in the file).
  Status error(std::string_view path, std::string_view message) const;
  // Same form, for warnings; collected in file order.
  void warn(std::string_view path, std::string_view message);
  // A key DeepSpeed knows that zinf does not implement; all are named in one warning.
  void ignore(std::string path) { ignored_.push_back(std::move(path)); }
  void note_auto(std::string key, std::string value, std::string source);
  // An "auto" at `path` that needs `option`, which was not given; `message` explains it when it
  // is the only one. Parsing goes on with the default so that all of them are reported at once.
  void need_option(std::string path, std::string option, std::string message);
  // ok when nothing is missing; else one error naming every key and the options to pass.
  Status missing_options_error() const;

  // Moves the collected warnings (the ignored-keys warning last) and resolutions out.
  std::vector<std::string> take_warnings();
  std::vector<AutoResolution> take_auto_resolved() { return std::move(autos_); }

 private:
  std::string where(std::string_view path) const;

  std::string source_;
  std::string_view text_;
  const KeyIndex& keys_;
  const AutoContext& ctx_;
  std::vector<std::string> warnings_;
  std::vector<std::string> ignored_;
  std::vector<AutoResolution> autos_;
  struct Missing {
    std::string path;
    std::string option;
    std::string message;
  };
  std::vector<Missing> missing_;
};

// A value read from the file: absent (or null), "auto", or a value.
template <typename T>
struct Field {
  bool present = false;
  bool is_auto = false;
  T value{};
  bool has_value() const { return present && !is_auto; }
};

struct IntRange {
  std::int64_t min = 0;
  std::int64_t max = std::numeric_limits<std::int64_t>::max();
};
inline constexpr IntRange kPositive{1, std::numeric_limits<std::int64_t>::max()};
inline constexpr IntRange kNonNegative{0, std::numeric_limits<std::int64_t>::max()};
// Batch sizes: the trainer holds them (and their product) in int.
inline constexpr IntRange kBatchRange{1, std::numeric_limits<std::int32_t>::max()};

inline constexpr double kInf = std::numeric_limits<double>::infinity();

struct NumberRange {
  double min = 0.0;
  double max = std::numeric_limits<double>::infinity();
  bool min_exclusive = false;
  bool max_exclusive = false;
};

// Reads the keys of one object. Every key asked for (present or not) becomes a valid key of
// this level; finish() then rejects any other key in the object with a suggestion.
class ObjectReader {
 public:
  // `obj` may be nullptr (the block is absent): every read returns "absent".
  ObjectReader(ParseState& state, const Json* obj, std::string path);

  const std::string& path() const { return path_; }
  std::string key_path(std::string_view key) const;
  bool has(std::string_view key);  // present and not null; marks the key valid

  Result<Field<std::int64_t>> integer(std::string_view key, IntRange range);
  Result<Field<double>> number(std::string_view key, NumberRange range);
  Result<Field<bool>> boolean(std::string_view key);
  Result<Field<std::string>> string(std::string_view key);
  // A string that must be one of `options` (compared exactly; suggestions ignore case).
  Result<Field<std::string>> choice(std::string_view key,
                                    std::initializer_list<std::string_view> options);
  // A list of numbers, e.g. betas.
  Result<Field<std::vector<double>>> numbers(std::string_view key, std::size_t count,
                                             NumberRange range);
  // A nested object; nullptr when absent or null, an error when it is not an object.
  Result<const Json*> object(std::string_view key);
  // The raw value (nullptr when absent); marks the key valid.
  const Json* raw(std::string_view key);

  // Keys DeepSpeed knows that zinf ignores: each one present is named in the warning.
  void ignore(std::span<const std::string_view> keys);
  // Rejects the first key of the object that no read asked for.
  Status finish();

  Status error(std::string_view key, std::string_view message) const {
    return state_.error(key_path(key), message);
  }

 private:
  const Json* lookup(std::string_view key);
  // Looks `key` up and sets f.present / f.is_auto; returns the value still to be read, or
  // nullptr when the key is absent or "auto" (then f is complete).
  template <typename T>
  const Json* start(std::string_view key, Field<T>& f);  // defined (and used) in reader.cpp

  ParseState& state_;
  const Json* obj_;
  std::string path_;
  std::vector<std::string> valid_;
};

// How a JSON value reads in a message: `the string "abc"`, `-1`, `true`, `an object`.
std::string describe_value(const Json& value);

// The candidate `key` most plausibly meant: first by meaning, one whose words (split at '_', '-',
// '.') begin with the key's words in order, fewest other words winning (warmup_steps ->
// warmup_num_steps, max_live_params -> stage3_max_live_parameters); else the closest by letters
// (case-insensitive optimal-string-alignment distance) if close enough to be a plausible typo.
std::optional<std::string> closest_match(std::string_view key,
                                         const std::vector<std::string>& candidates);

// Shortest round-trip text of a number: 3e-05, 0.9, 16777216.
std::string format_number(double value);

}  // namespace zinf::config::detail
