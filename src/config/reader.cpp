// Typed reading of ds_config objects: type and range checks, "auto", unknown keys with suggestions.
#include "config/reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <fmt/format.h>

#include "common/json_check.h"

namespace zinf::config::detail {

namespace {

constexpr std::string_view kAuto = "auto";

// Unknown keys that deserve more than a distance-based suggestion.
struct KeyHint {
  std::string_view key;
  std::string_view hint;
};
constexpr KeyHint kKeyHints[] = {
    {"num_threads",
     "ds_nvme_tune prints 'num_threads', but the runtime reads 'intra_op_parallelism'; "
     "did you mean 'intra_op_parallelism'?"},
};

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Optimal string alignment distance (Damerau-Levenshtein without repeated edits of a substring).
std::size_t osa_distance(std::string_view a, std::string_view b) {
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<std::size_t>> d(n + 1, std::vector<std::size_t>(m + 1));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= n; ++i) {
    for (std::size_t j = 1; j <= m; ++j) {
      std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

std::string describe_int_range(IntRange r) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  if (r.min == 1 && r.max == kMax) return "a positive integer";
  if (r.min == 0 && r.max == kMax) return "a non-negative integer";
  if (r.max == kMax) return fmt::format("an integer >= {}", r.min);
  return fmt::format("an integer from {} to {}", r.min, r.max);
}

std::string describe_number_range(NumberRange r) {
  bool has_min = std::isfinite(r.min) && r.min > -std::numeric_limits<double>::max();
  bool has_max = std::isfinite(r.max);
  if (has_min && has_max) {
    if (!r.min_exclusive && !r.max_exclusive) {
      return fmt::format("a number from {} to {}", format_number(r.min), format_number(r.max));
    }
    return fmt::format("a number {} {} and {} {}", r.min_exclusive ? ">" : ">=",
                       format_number(r.min), r.max_exclusive ? "<" : "<=",
                       format_number(r.max));
  }
  if (has_min) return fmt::format("a number {} {}", r.min_exclusive ? ">" : ">=", format_number(r.min));
  if (has_max) return fmt::format("a number {} {}", r.max_exclusive ? "<" : "<=", format_number(r.max));
  return "a number";
}

bool in_range(double v, NumberRange r) {
  if (r.min_exclusive ? !(v > r.min) : !(v >= r.min)) return false;
  if (r.max_exclusive ? !(v < r.max) : !(v <= r.max)) return false;
  return true;
}

bool is_auto(const Json& v) { return v.is_string() && v.get_ref<const std::string&>() == kAuto; }

}  // namespace

std::string format_number(double value) { return fmt::format("{}", value); }

std::string describe_value(const Json& value) {
  switch (value.type()) {
    case Json::value_t::string: {
      const std::string& s = value.get_ref<const std::string&>();
      std::string shown = s.size() > 60 ? s.substr(0, 57) + "..." : s;
      return fmt::format("the string \"{}\"", shown);
    }
    case Json::value_t::boolean: return value.get<bool>() ? "true" : "false";
    case Json::value_t::number_float: return format_number(value.get<double>());
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return value.dump();
    case Json::value_t::null: return "null";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    default: return value.dump();
  }
}

namespace {

std::vector<std::string> words_of(std::string_view s) {
  std::vector<std::string> words;
  std::string w;
  for (char c : lower(s)) {
    if (c == '_' || c == '-' || c == '.') {
      if (!w.empty()) words.push_back(std::move(w));
      w.clear();
    } else {
      w += c;
    }
  }
  if (!w.empty()) words.push_back(std::move(w));
  return words;
}

// Extra words of `candidate` when every word of `key` begins one of its words, in order
// (warmup_steps -> warmup_num_steps: 1; max_live_params -> stage3_max_live_parameters: 1); nullopt
// when not. Keys of one word are left to the letter distance.
std::optional<std::size_t> words_within(const std::vector<std::string>& key, const std::vector<std::string>& candidate) {
  if (key.size() < 2) return std::nullopt;
  std::size_t j = 0;
  for (const std::string& w : key) {
    while (j < candidate.size() && candidate[j].rfind(w, 0) != 0) ++j;
    if (j == candidate.size()) return std::nullopt;
    ++j;
  }
  return candidate.size() - key.size();
}

}  // namespace

std::optional<std::string> closest_match(std::string_view key,
                                         const std::vector<std::string>& candidates) {
  // By meaning first: a candidate that holds the key's words (fewest other words wins).
  const std::vector<std::string> key_words = words_of(key);
  std::optional<std::string> by_words;
  std::size_t fewest = std::numeric_limits<std::size_t>::max();
  for (const std::string& c : candidates) {
    const std::optional<std::size_t> extra = words_within(key_words, words_of(c));
    if (extra && *extra < fewest && lower(c) != lower(key)) {
      fewest = *extra;
      by_words = c;
    }
  }
  if (by_words) return by_words;
  std::string k = lower(key);
  std::size_t limit = std::max<std::size_t>(2, key.size() / 3);
  std::optional<std::string> best;
  std::size_t best_distance = limit + 1;
  for (const std::string& c : candidates) {
    // The distance is at least the difference in length: skip the O(n*m) table when that alone
    // is too far (a long string value compared with short names).
    const std::size_t diff = k.size() > c.size() ? k.size() - c.size() : c.size() - k.size();
    if (diff > limit) continue;
    std::size_t dist = osa_distance(k, lower(c));
    if (dist < best_distance) {
      best_distance = dist;
      best = c;
    }
  }
  return best;
}

// ---- ParseState ---------------------------------------------------------------------------

std::string ParseState::where(std::string_view path) const {
  std::optional<std::size_t> offset = keys_.find(std::string(path));
  if (!offset) return source_;
  TextPosition pos = position_of(text_, *offset);
  return fmt::format("{}:{}:{}", source_, pos.line, pos.column);
}

Status ParseState::error(std::string_view path, std::string_view message) const {
  if (path.empty()) return Status::invalid_argument(fmt::format("{}: {}", where(path), message));
  return Status::invalid_argument(fmt::format("{}: {}: {}", where(path), path, message));
}

void ParseState::warn(std::string_view path, std::string_view message) {
  if (path.empty()) {
    warnings_.push_back(fmt::format("{}: {}", source_, message));
  } else {
    warnings_.push_back(fmt::format("{}: {}: {}", source_, path, message));
  }
}

void ParseState::note_auto(std::string key, std::string value, std::string source) {
  autos_.push_back(AutoResolution{std::move(key), std::move(value), std::move(source)});
}

std::string trainer_default_source(std::string_view option) {
  return fmt::format("the Hugging Face Trainer's default (pass {} to choose; --strict-auto to require it)", option);
}

void ParseState::need_option(std::string path, std::string option, std::string message) {
  missing_.push_back(Missing{std::move(path), std::move(option), std::move(message)});
}

Status ParseState::missing_options_error() const {
  if (missing_.empty()) return Status::ok();
  if (missing_.size() == 1) return error(missing_[0].path, missing_[0].message);
  // Group the keys by the option that fills them, options in the order the file needs them.
  std::vector<const Missing*> sorted;
  for (const Missing& m : missing_) sorted.push_back(&m);
  auto offset = [&](const Missing* m) {
    return keys_.find(m->path).value_or(std::numeric_limits<std::size_t>::max());
  };
  std::stable_sort(sorted.begin(), sorted.end(),
                   [&](const Missing* a, const Missing* b) { return offset(a) < offset(b); });
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;
  for (const Missing* m : sorted) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == m->option; });
    if (it == groups.end()) {
      groups.push_back({m->option, {m->path}});
    } else {
      it->second.push_back(m->path);
    }
  }
  std::vector<std::string> parts;
  for (const auto& [option, paths] : groups) {
    parts.push_back(fmt::format("{} (for {})", option, fmt::join(paths, ", ")));
  }
  return Status::invalid_argument(
      fmt::format("{}: {} keys are \"auto\" and need values from the command line or the model; "
                  "pass {}",
                  source_, missing_.size(), fmt::join(parts, "; ")));
}

std::vector<std::string> ParseState::take_warnings() {
  if (!ignored_.empty()) {
    // Name them in file order, however the blocks were read.
    auto offset = [&](const std::string& path) {
      return keys_.find(path).value_or(std::numeric_limits<std::size_t>::max());
    };
    std::stable_sort(ignored_.begin(), ignored_.end(),
                     [&](const std::string& a, const std::string& b) { return offset(a) < offset(b); });
    warnings_.push_back(fmt::format(
        "{}: ignoring keys that DeepSpeed knows but zinf does not implement: {}", source_,
        fmt::join(ignored_, ", ")));
    ignored_.clear();
  }
  return std::move(warnings_);
}

// ---- ObjectReader -------------------------------------------------------------------------

ObjectReader::ObjectReader(ParseState& state, const Json* obj, std::string path)
    : state_(state), obj_(obj), path_(std::move(path)) {}

std::string ObjectReader::key_path(std::string_view key) const {
  return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
}

const Json* ObjectReader::lookup(std::string_view key) {
  if (std::find(valid_.begin(), valid_.end(), key) == valid_.end()) valid_.emplace_back(key);
  if (obj_ == nullptr) return nullptr;
  auto it = obj_->find(std::string(key));
  if (it == obj_->end() || it->is_null()) return nullptr;
  return &*it;
}

template <typename T>
const Json* ObjectReader::start(std::string_view key, Field<T>& f) {
  const Json* v = lookup(key);
  if (v == nullptr) return nullptr;
  f.present = true;
  if (is_auto(*v)) {
    f.is_auto = true;
    return nullptr;
  }
  return v;
}

bool ObjectReader::has(std::string_view key) { return lookup(key) != nullptr; }

const Json* ObjectReader::raw(std::string_view key) { return lookup(key); }

Result<Field<std::int64_t>> ObjectReader::integer(std::string_view key, IntRange range) {
  Field<std::int64_t> f;
  const Json* v = start(key, f);
  if (v == nullptr) return f;
  std::string expected = describe_int_range(range);
  const jsonck::IntReading r = jsonck::read_int64(*v, jsonck::WholeFloats::kAccept);
  const std::string shown = v->is_number_float() ? format_number(v->get<double>()) : v->dump();
  switch (r.error) {
    case jsonck::IntError::kNone: break;
    case jsonck::IntError::kNotWhole:
      return error(key, fmt::format("expected {}, got {} (not a whole number)", expected, shown));
    case jsonck::IntError::kOutOfRange:
      return error(key, fmt::format("expected {}, got {} (out of range)", expected, shown));
    case jsonck::IntError::kNotAnInteger:
      return error(key, fmt::format("expected {}, got {}", expected, describe_value(*v)));
  }
  f.value = r.value;
  if (f.value < range.min || f.value > range.max) {
    return error(key, fmt::format("expected {}, got {}", expected, f.value));
  }
  return f;
}

Result<Field<double>> ObjectReader::number(std::string_view key, NumberRange range) {
  Field<double> f;
  const Json* v = start(key, f);
  if (v == nullptr) return f;
  std::string expected = describe_number_range(range);
  if (!v->is_number()) return error(key, fmt::format("expected {}, got {}", expected, describe_value(*v)));
  f.value = v->get<double>();
  if (!in_range(f.value, range)) {
    return error(key, fmt::format("expected {}, got {}", expected, format_number(f.value)));
  }
  return f;
}

Result<Field<bool>> ObjectReader::boolean(std::string_view key) {
  Field<bool> f;
  const Json* v = start(key, f);
  if (v == nullptr) return f;
  if (!v->is_boolean()) {
    return error(key, fmt::format("expected a boolean (true/false), got {}", describe_value(*v)));
  }
  f.value = v->get<bool>();
  return f;
}

Result<Field<std::string>> ObjectReader::string(std::string_view key) {
  Field<std::string> f;
  const Json* v = start(key, f);
  if (v == nullptr) return f;
  if (!v->is_string()) return error(key, fmt::format("expected a string, got {}", describe_value(*v)));
  f.value = v->get<std::string>();
  return f;
}

Result<Field<std::string>> ObjectReader::choice(std::string_view key,
                                                std::initializer_list<std::string_view> options) {
  ZINF_ASSIGN_OR_RETURN(Field<std::string> f, string(key));
  if (!f.has_value()) return f;
  for (std::string_view o : options) {
    if (f.value == o) return f;
  }
  std::vector<std::string> names(options.begin(), options.end());
  std::string listed = fmt::format("\"{}\"", fmt::join(names, "\", \""));
  std::optional<std::string> near = closest_match(f.value, names);
  return error(key, fmt::format("expected one of {}, got \"{}\"{}", listed, f.value,
                                near ? fmt::format("; did you mean \"{}\"?", *near) : ""));
}

Result<Field<std::vector<double>>> ObjectReader::numbers(std::string_view key, std::size_t count,
                                                         NumberRange range) {
  Field<std::vector<double>> f;
  const Json* v = start(key, f);
  if (v == nullptr) return f;
  std::string expected = fmt::format("a list of {} numbers, each {}", count,
                                     describe_number_range(range).substr(2));
  if (!v->is_array() || v->size() != count) {
    return error(key, fmt::format("expected {}, got {}", expected,
                                  v->is_array() ? fmt::format("{} elements", v->size())
                                                : describe_value(*v)));
  }
  for (std::size_t i = 0; i < count; ++i) {
    const Json& e = (*v)[i];
    if (!e.is_number() || !in_range(e.get<double>(), range)) {
      return error(key, fmt::format("expected {}, got {} at position {}", expected,
                                    describe_value(e), i));
    }
    f.value.push_back(e.get<double>());
  }
  return f;
}

Result<const Json*> ObjectReader::object(std::string_view key) {
  const Json* v = lookup(key);
  if (v == nullptr) return static_cast<const Json*>(nullptr);
  if (!v->is_object()) {
    return error(key, fmt::format("expected an object {{...}}, got {}", describe_value(*v)));
  }
  return v;
}

void ObjectReader::ignore(std::span<const std::string_view> keys) {
  for (std::string_view key : keys) {
    if (lookup(key) != nullptr) state_.ignore(key_path(key));
  }
}

Status ObjectReader::finish() {
  if (obj_ == nullptr) return Status::ok();
  for (auto it = obj_->begin(); it != obj_->end(); ++it) {
    const std::string& key = it.key();
    if (std::find(valid_.begin(), valid_.end(), key) != valid_.end()) continue;
    for (const KeyHint& h : kKeyHints) {
      if (h.key == key) return error(key, fmt::format("unknown key; {}", h.hint));
    }
    std::optional<std::string> near = closest_match(key, valid_);
    if (near) return error(key, fmt::format("unknown key; did you mean '{}'?", *near));
    return error(key, fmt::format("unknown key (not a key DeepSpeed or zinf knows{})",
                                  path_.empty() ? " at the top level" : " in " + path_));
  }
  return Status::ok();
}

}  // namespace zinf::config::detail
