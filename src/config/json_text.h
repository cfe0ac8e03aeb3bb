// Internal: JSON text handling for ds_config files (comments, trailing commas, key positions).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "zinf/status.h"

namespace zinf::config::detail {

// Keeps keys in file order, so errors and warnings come out in the order the user wrote them.
using Json = nlohmann::ordered_json;

// Caps on config text, checked before the parser allocates anything: a config is a few KiB with
// keys of a few dozen bytes nested a few levels, so anything past these is an error, not a slow
// parse (a 20000-deep array took 1.2 GB in the key index, a 2 MB key 20 s in the suggestions).
inline constexpr std::size_t kMaxConfigBytes = std::size_t{16} << 20;
inline constexpr std::size_t kMaxConfigDepth = 64;
inline constexpr std::size_t kMaxKeyBytes = 256;

struct TextPosition {
  int line = 1;    // 1-based
  int column = 1;  // 1-based, in UTF-8 characters
};

// Line and column of byte `offset` in `text` (offsets past the end map to the end).
TextPosition position_of(std::string_view text, std::size_t offset);

// Returns `text` with every trailing comma (a ',' followed, past whitespace and comments, by
// '}' or ']') outside strings and comments replaced by a space. Byte offsets are unchanged, so
// positions in the result are positions in the original.
std::string blank_trailing_commas(std::string_view text);

// Where each key of a JSON document starts, by dotted path ("zero_optimization.stage");
// array elements are "path[i]" and map to the element's first byte.
struct KeyIndex {
  std::unordered_map<std::string, std::size_t> offsets;
  // The first key that appears twice in one object, in file order, and where the second is.
  std::optional<std::string> duplicate_path;
  std::size_t duplicate_offset = 0;

  std::optional<std::size_t> find(const std::string& path) const;
};

// Indexes the keys of `text`, which must already be valid JSON (comments allowed).
KeyIndex index_keys(std::string_view text);

// A parsed document and where its keys are.
struct ParsedText {
  Json root;
  KeyIndex keys;
};

// ok, or InvalidArgument "SOURCE[:LINE:COL]: ..." when `text` is over kMaxConfigBytes, nests
// arrays/objects deeper than kMaxConfigDepth, or has a key longer than kMaxKeyBytes. One pass,
// no allocation; strings and comments are skipped as the parser would.
Status check_text_limits(std::string_view text, std::string_view source);

// Parses `text` (after check_text_limits) allowing comments and trailing commas. Errors read
// "SOURCE:LINE:COL: syntax error while parsing object - unexpected ...", and a key given twice
// in one object is "SOURCE:LINE:COL: PATH: duplicate key".
Result<ParsedText> parse_json_text(std::string_view text, std::string_view source);

}  // namespace zinf::config::detail
