// Checked reading of JSON values from files zinf does not trust (engine.json, manifests, headers).
//
// nlohmann's `at()`, `get<T>()`, `value()` and `operator[]` on a const object throw or assert on a
// missing key or a wrong type, and `get<int>()` silently truncates a wider number. These helpers
// never throw: a missing key, a wrong type or a value outside the destination's range is a
// Status (Corruption by default) naming `where` (the file) and the key path.
//
// Header-only and templated on the JSON type (nlohmann::json or ordered_json), so the common
// layer itself need not link nlohmann; the includer must include <nlohmann/json.hpp> first.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "zinf/status.h"

namespace zinf::jsonck {

// Where a value sits: the file and the path of the enclosing object (or of the value itself for
// the *_value functions), e.g. "dir/engine.json" and "counters"; the *_key functions add the key.
struct Where {
  std::string_view file;
  std::string_view path;
};

inline std::string join_path(std::string_view prefix, std::string_view key) {
  return prefix.empty() ? std::string(key) : fmt::format("{}.{}", prefix, key);
}

inline Status bad(Where w, std::string_view what) {
  if (w.path.empty()) return Status::corruption(fmt::format("{}: {}", w.file, what));
  return Status::corruption(fmt::format("{}: {}: {}", w.file, w.path, what));
}

template <typename Json>
std::string describe(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// The member `key` of `obj`, or nullptr when `obj` is not an object or has no such key.
template <typename Json>
const Json* member(const Json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(std::string(key));
  return it == obj.end() ? nullptr : &*it;
}

// The one rule for reading a JSON value as a signed 64-bit integer, shared by the readers of
// files zinf writes (int_value below) and of ds_config (config/reader.h), which differ only in
// `floats` and in how they word the error.
enum class WholeFloats {
  kRefuse,  // files zinf writes store integers as integers: a float is refused, whole or not
  kAccept,  // ds_config: 5e8 or 2.0 is the integer it names (as DeepSpeed's Python reads it)
};
enum class IntError { kNone, kNotAnInteger, kNotWhole, kOutOfRange };
struct IntReading {
  std::int64_t value = 0;
  IntError error = IntError::kNone;
};

template <typename Json>
IntReading read_int64(const Json& v, WholeFloats floats) {
  if (v.is_number_unsigned()) {
    const std::uint64_t u = v.template get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return {0, IntError::kOutOfRange};
    return {static_cast<std::int64_t>(u), IntError::kNone};
  }
  if (v.is_number_integer()) return {v.template get<std::int64_t>(), IntError::kNone};
  if (v.is_number_float() && floats == WholeFloats::kAccept) {
    const double d = v.template get<double>();
    if (std::floor(d) != d) return {0, IntError::kNotWhole};
    if (!(std::fabs(d) < 9.2233720368547758e18)) return {0, IntError::kOutOfRange};  // 2^63
    return {static_cast<std::int64_t>(d), IntError::kNone};
  }
  return {0, IntError::kNotAnInteger};
}

// `v` as an integer in [lo, hi], read with WholeFloats::kRefuse.
template <typename Json>
Result<std::int64_t> int_value(const Json& v, std::int64_t lo, std::int64_t hi, Where w) {
  const IntReading r = read_int64(v, WholeFloats::kRefuse);
  if (r.error == IntError::kOutOfRange) {
    return bad(w, fmt::format("{} is out of range (expected an integer from {} to {})", v.dump(), lo, hi));
  }
  if (r.error != IntError::kNone) {
    return bad(w, fmt::format("expected an integer from {} to {}, got {}", lo, hi, describe(v)));
  }
  const std::int64_t out = r.value;
  if (out < lo || out > hi) {
    return bad(w, fmt::format("{} is out of range (expected an integer from {} to {})", out, lo, hi));
  }
  return out;
}

// `v` as an unsigned integer in [lo, hi].
template <typename Json>
Result<std::uint64_t> uint_value(const Json& v, std::uint64_t lo, std::uint64_t hi, Where w) {
  std::uint64_t out = 0;
  if (v.is_number_unsigned()) {
    out = v.template get<std::uint64_t>();
  } else if (v.is_number_integer()) {
    const std::int64_t s = v.template get<std::int64_t>();
    if (s < 0) return bad(w, fmt::format("{} is negative (expected an integer from {} to {})", s, lo, hi));
    out = static_cast<std::uint64_t>(s);
  } else {
    return bad(w, fmt::format("expected an integer from {} to {}, got {}", lo, hi, describe(v)));
  }
  if (out < lo || out > hi) {
    return bad(w, fmt::format("{} is out of range (expected an integer from {} to {})", out, lo, hi));
  }
  return out;
}

// Required members.
template <typename Json>
Result<std::int64_t> int_key(const Json& obj, std::string_view key, std::int64_t lo, std::int64_t hi, Where w) {
  const std::string path = join_path(w.path, key);
  const Where k{w.file, path};
  const Json* v = member(obj, key);
  if (v == nullptr) return bad(w, fmt::format("missing integer key \"{}\"", key));
  return int_value(*v, lo, hi, k);
}

template <typename Json>
Result<std::uint64_t> uint_key(const Json& obj, std::string_view key, std::uint64_t lo, std::uint64_t hi,
                               Where w) {
  const std::string path = join_path(w.path, key);
  const Where k{w.file, path};
  const Json* v = member(obj, key);
  if (v == nullptr) return bad(w, fmt::format("missing integer key \"{}\"", key));
  return uint_value(*v, lo, hi, k);
}

template <typename Json>
Result<std::string> string_key(const Json& obj, std::string_view key, Where w) {
  const std::string path = join_path(w.path, key);
  const Where k{w.file, path};
  const Json* v = member(obj, key);
  if (v == nullptr) return bad(w, fmt::format("missing string key \"{}\"", key));
  if (!v->is_string()) return bad(k, fmt::format("expected a string, got {}", describe(*v)));
  return v->template get<std::string>();
}

template <typename Json>
Result<double> number_key(const Json& obj, std::string_view key, Where w) {
  const std::string path = join_path(w.path, key);
  const Where k{w.file, path};
  const Json* v = member(obj, key);
  if (v == nullptr) return bad(w, fmt::format("missing number key \"{}\"", key));
  if (!v->is_number()) return bad(k, fmt::format("expected a number, got {}", describe(*v)));
  return v->template get<double>();
}

template <typename Json>
Result<bool> bool_key(const Json& obj, std::string_view key, Where w) {
  const std::string path = join_path(w.path, key);
  const Where k{w.file, path};
  const Json* v = member(obj, key);
  if (v == nullptr) return bad(w, fmt::format("missing boolean key \"{}\"", key));
  if (!v->is_boolean()) return bad(k, fmt::format("expected true or false, got {}", describe(*v)));
  return v->template get<bool>();
}

// Optional members: `fallback` when absent (null counts as absent); a wrong type is still an error.
template <typename Json>
Result<std::int64_t> int_key_or(const Json& obj, std::string_view key, std::int64_t fallback, std::int64_t lo,
                                std::int64_t hi, Where w) {
  const std::string path = join_path(w.path, key);
  const Where k{w.file, path};
  const Json* v = member(obj, key);
  if (v == nullptr || v->is_null()) return fallback;
  return int_value(*v, lo, hi, k);
}

template <typename Json>
Result<std::string> string_key_or(const Json& obj, std::string_view key, std::string fallback, Where w) {
  const std::string path = join_path(w.path, key);
  const Where k{w.file, path};
  const Json* v = member(obj, key);
  if (v == nullptr || v->is_null()) return fallback;
  if (!v->is_string()) return bad(k, fmt::format("expected a string, got {}", describe(*v)));
  return v->template get<std::string>();
}

template <typename Json>
Result<bool> bool_key_or(const Json& obj, std::string_view key, bool fallback, Where w) {
  const std::string path = join_path(w.path, key);
  const Where k{w.file, path};
  const Json* v = member(obj, key);
  if (v == nullptr || v->is_null()) return fallback;
  if (!v->is_boolean()) return bad(k, fmt::format("expected true or false, got {}", describe(*v)));
  return v->template get<bool>();
}

template <typename Json>
Result<double> number_key_or(const Json& obj, std::string_view key, double fallback, Where w) {
  const std::string path = join_path(w.path, key);
  const Where k{w.file, path};
  const Json* v = member(obj, key);
  if (v == nullptr || v->is_null()) return fallback;
  if (!v->is_number()) return bad(k, fmt::format("expected a number, got {}", describe(*v)));
  return v->template get<double>();
}

// Deepest nesting of arrays and objects in JSON text, counting brackets outside strings; stops
// counting (and returns max_depth + 1) as soon as `max_depth` is exceeded, so a 64 MiB run of
// '[' costs one pass and no allocation.
inline std::size_t nesting_depth(std::string_view text, std::size_t max_depth) {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > max_depth) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

// Files zinf writes itself nest a few levels; 64 leaves room and bounds the parser's memory.
inline constexpr std::size_t kMaxJsonDepth = 64;

// Parses untrusted JSON text without exceptions: Corruption naming `file` when it is not JSON or
// nests deeper than `max_depth`.
template <typename Json>
Result<Json> parse(std::string_view text, std::string_view file, std::size_t max_depth = kMaxJsonDepth) {
  if (nesting_depth(text, max_depth) > max_depth) {
    return Status::corruption(fmt::format("{}: JSON nested deeper than {} levels", file, max_depth));
  }
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::corruption(fmt::format("{}: not valid JSON", file));
  return j;
}

}  // namespace zinf::jsonck
