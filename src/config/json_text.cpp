// JSON text handling for ds_config files: trailing commas, key positions, parse errors with line:col.
#include "config/json_text.h"

#include <cctype>
#include <set>
#include <vector>

#include <fmt/format.h>

namespace zinf::config::detail {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Offset just past the comment starting at `i` (text[i] == '/'), or `i` if none starts there.
// An unterminated block comment runs to the end; the parser reports it.
std::size_t skip_comment(std::string_view text, std::size_t i) {
  if (i + 1 >= text.size() || text[i] != '/') return i;
  if (text[i + 1] == '/') {
    std::size_t end = text.find('\n', i + 2);
    return end == std::string_view::npos ? text.size() : end + 1;
  }
  if (text[i + 1] == '*') {
    std::size_t end = text.find("*/", i + 2);
    return end == std::string_view::npos ? text.size() : end + 2;
  }
  return i;
}

// Offset of the first byte at or after `i` that is neither whitespace nor inside a comment.
std::size_t skip_blank(std::string_view text, std::size_t i) {
  while (i < text.size()) {
    if (is_space(text[i])) {
      ++i;
      continue;
    }
    std::size_t next = skip_comment(text, i);
    if (next == i) break;
    i = next;
  }
  return i;
}

// Offset just past the string literal starting at `i` (text[i] == '"'); appends its decoded
// contents to `out` when given. Escapes other than \uXXXX below 0x80 are decoded; others are
// kept as written (only key lookups depend on this, and such keys are never valid ones).
std::size_t scan_string(std::string_view text, std::size_t i, std::string* out) {
  ++i;
  while (i < text.size() && text[i] != '"') {
    char c = text[i];
    if (c != '\\' || i + 1 >= text.size()) {
      if (out != nullptr) out->push_back(c);
      ++i;
      continue;
    }
    char e = text[i + 1];
    char decoded = 0;
    switch (e) {
      case '"': decoded = '"'; break;
      case '\\': decoded = '\\'; break;
      case '/': decoded = '/'; break;
      case 'b': decoded = '\b'; break;
      case 'f': decoded = '\f'; break;
      case 'n': decoded = '\n'; break;
      case 'r': decoded = '\r'; break;
      case 't': decoded = '\t'; break;
      default: break;
    }
    if (e == 'u' && i + 5 < text.size()) {
      unsigned code = 0;
      bool hex = true;
      for (std::size_t k = i + 2; k < i + 6; ++k) {
        char h = text[k];
        code <<= 4;
        if (h >= '0' && h <= '9') code |= unsigned(h - '0');
        else if (h >= 'a' && h <= 'f') code |= unsigned(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F') code |= unsigned(h - 'A' + 10);
        else hex = false;
      }
      if (out != nullptr) {
        if (hex && code < 0x80) out->push_back(char(code));
        else out->append(text.substr(i, 6));
      }
      i += 6;
      continue;
    }
    if (out != nullptr) {
      if (decoded != 0) out->push_back(decoded);
      else out->append(text.substr(i, 2));
    }
    i += 2;
  }
  return i < text.size() ? i + 1 : i;
}

std::string join_key(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

// Strips nlohmann's "[json.exception.parse_error.101] parse error at line 3, column 8: " prefix.
std::string parse_error_detail(const std::string& what) {
  std::size_t column = what.find("column ");
  if (column != std::string::npos) {
    std::size_t colon = what.find(": ", column);
    if (colon != std::string::npos) return what.substr(colon + 2);
  }
  std::size_t bracket = what.find("] ");
  return bracket == std::string::npos ? what : what.substr(bracket + 2);
}

// nlohmann reports the last character it read; for an unexpected multi-character token (a
// string, number or literal), point at the token's first character instead.
std::size_t token_start(std::string_view text, std::size_t offset, const std::string& detail) {
  if (offset >= text.size()) return offset;
  if (detail.find("unexpected string literal") != std::string::npos && text[offset] == '"') {
    std::size_t i = offset;
    while (i > 0) {
      --i;
      if (text[i] != '"') continue;
      std::size_t backslashes = 0;
      while (i >= backslashes + 1 && text[i - backslashes - 1] == '\\') ++backslashes;
      if (backslashes % 2 == 0) return i;
    }
    return offset;
  }
  bool literal = detail.find("unexpected number literal") != std::string::npos ||
                 detail.find("unexpected 'true'") != std::string::npos ||
                 detail.find("unexpected 'false'") != std::string::npos ||
                 detail.find("unexpected 'null'") != std::string::npos;
  if (!literal) return offset;
  auto in_token = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '+' || c == '-';
  };
  while (offset > 0 && in_token(text[offset - 1])) --offset;
  return offset;
}

}  // namespace

TextPosition position_of(std::string_view text, std::size_t offset) {
  if (offset > text.size()) offset = text.size();
  TextPosition pos;
  for (std::size_t i = 0; i < offset; ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      ++pos.line;
      pos.column = 1;
    } else if ((c & 0xC0) != 0x80) {  // count UTF-8 lead bytes, not continuation bytes
      ++pos.column;
    }
  }
  return pos;
}

std::string blank_trailing_commas(std::string_view text) {
  std::string result(text);
  std::size_t i = 0;
  while (i < text.size()) {
    char c = text[i];
    if (c == '"') {
      i = scan_string(text, i, nullptr);
      continue;
    }
    std::size_t after_comment = skip_comment(text, i);
    if (after_comment != i) {
      i = after_comment;
      continue;
    }
    if (c == ',') {
      std::size_t next = skip_blank(text, i + 1);
      if (next < text.size() && (text[next] == '}' || text[next] == ']')) result[i] = ' ';
    }
    ++i;
  }
  return result;
}

std::optional<std::size_t> KeyIndex::find(const std::string& path) const {
  auto it = offsets.find(path);
  if (it == offsets.end()) return std::nullopt;
  return it->second;
}

namespace {

// Walks valid JSON text once, recording where each key (and array element) starts.
class KeyScanner {
 public:
  explicit KeyScanner(std::string_view text) : text_(text) {}

  KeyIndex run() {
    std::size_t i = skip_blank(text_, 0);
    while (i < text_.size()) {
      i = step(i);
      i = skip_blank(text_, i);
    }
    return std::move(index_);
  }

 private:
  struct Frame {
    bool is_object;
    std::string path;            // path of this container
    std::string last_key_path;   // object: path of the most recent key
    std::size_t index = 0;       // array: index of the current element
    bool expect_key = true;      // object: the next string is a key
    bool element_seen = false;   // array: the current element's start was recorded
    std::set<std::string> keys;  // object: keys seen so far
  };

  // Handles the token at `i`; returns the offset just past it.
  std::size_t step(std::size_t i) {
    char c = text_[i];
    if (c == '{' || c == '[') {
      std::string path = value_path(i);
      stack_.push_back(Frame{c == '{', path, "", 0, true, false, {}});
      return i + 1;
    }
    if (c == '}' || c == ']') {
      if (!stack_.empty()) stack_.pop_back();
      return i + 1;
    }
    if (c == ',') {
      next_member();
      return i + 1;
    }
    if (c == ':') return i + 1;
    if (c == '"' && !stack_.empty() && stack_.back().is_object && stack_.back().expect_key) {
      return key(i);
    }
    value_path(i);
    if (c == '"') return scan_string(text_, i, nullptr);
    const std::size_t start = i;
    while (i < text_.size() && !is_space(text_[i]) && text_[i] != ',' && text_[i] != '}' &&
           text_[i] != ']' && text_[i] != '/') {
      ++i;
    }
    // Always move on: a '/' that starts no comment would otherwise be looked at forever.
    return i == start ? i + 1 : i;
  }

  void next_member() {
    if (stack_.empty()) return;
    Frame& top = stack_.back();
    if (top.is_object) {
      top.expect_key = true;
    } else {
      ++top.index;
      top.element_seen = false;
    }
  }

  std::size_t key(std::size_t i) {
    Frame& top = stack_.back();
    std::string name;
    std::size_t end = scan_string(text_, i, &name);
    top.last_key_path = join_key(top.path, name);
    top.expect_key = false;
    if (!top.keys.insert(name).second && !index_.duplicate_path) {
      index_.duplicate_path = top.last_key_path;
      index_.duplicate_offset = i;
    }
    index_.offsets.emplace(top.last_key_path, i);
    return end;
  }

  // Path of the value that starts at `at`, recording array element starts.
  std::string value_path(std::size_t at) {
    if (stack_.empty()) return "";
    Frame& top = stack_.back();
    if (top.is_object) return top.last_key_path;
    std::string path = fmt::format("{}[{}]", top.path, top.index);
    if (!top.element_seen) {
      index_.offsets.emplace(path, at);
      top.element_seen = true;
    }
    return path;
  }

  std::string_view text_;
  std::vector<Frame> stack_;
  KeyIndex index_;
};

}  // namespace

KeyIndex index_keys(std::string_view text) { return KeyScanner(text).run(); }

Status check_text_limits(std::string_view text, std::string_view source) {
  if (text.size() > kMaxConfigBytes) {
    return Status::invalid_argument(fmt::format("{}: {} bytes; a config may hold at most {} bytes (16 MiB)", source,
                                                text.size(), kMaxConfigBytes));
  }
  auto at = [&](std::size_t offset, std::string_view message) {
    TextPosition pos = position_of(text, offset);
    return Status::invalid_argument(fmt::format("{}:{}:{}: {}", source, pos.line, pos.column, message));
  };
  std::size_t depth = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '"') {
      const std::size_t end = scan_string(text, i, nullptr);
      // A key is a string followed by ':'; only keys are looked up and compared by distance.
      const std::size_t next = skip_blank(text, end);
      if (next < text.size() && text[next] == ':' && end - i > kMaxKeyBytes + 2) {
        return at(i, fmt::format("a key of {} bytes; keys may be at most {} bytes", end - i - 2, kMaxKeyBytes));
      }
      i = end;
      continue;
    }
    const std::size_t after_comment = skip_comment(text, i);
    if (after_comment != i) {
      i = after_comment;
      continue;
    }
    // nlohmann's lexer takes a NUL for the end of the input, so "0<NUL>garbage" would parse as
    // 0 and the key index would then walk the garbage (found by the config_text fuzzer).
    if (c == '\0') return at(i, "a NUL byte; a config is text");
    if (c == '[' || c == '{') {
      if (++depth > kMaxConfigDepth) {
        return at(i, fmt::format("arrays and objects nested deeper than {} levels", kMaxConfigDepth));
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
    ++i;
  }
  return Status::ok();
}

Result<ParsedText> parse_json_text(std::string_view text, std::string_view source) {
  ZINF_RETURN_IF_ERROR(check_text_limits(text, source));
  std::string cleaned = blank_trailing_commas(text);
  ParsedText parsed;
  try {
    parsed.root = Json::parse(cleaned, /*cb=*/nullptr, /*allow_exceptions=*/true,
                              /*ignore_comments=*/true);
  } catch (const Json::parse_error& e) {
    // e.byte counts the characters read, the offending one included.
    std::string detail = parse_error_detail(e.what());
    std::size_t offset = token_start(text, e.byte > 0 ? e.byte - 1 : 0, detail);
    TextPosition pos = position_of(text, offset);
    return Status::invalid_argument(
        fmt::format("{}:{}:{}: {}", source, pos.line, pos.column, detail));
  } catch (const Json::exception& e) {
    // "number overflow parsing '1e999'" has no position: find the number in the text.
    std::string detail = parse_error_detail(e.what());
    std::size_t open = detail.find('\'');
    std::size_t close = open == std::string::npos ? open : detail.find('\'', open + 1);
    if (close != std::string::npos && close > open + 1) {
      std::size_t at = cleaned.find(detail.substr(open + 1, close - open - 1));
      if (at != std::string::npos) {
        TextPosition pos = position_of(text, at);
        return Status::invalid_argument(
            fmt::format("{}:{}:{}: {}", source, pos.line, pos.column, detail));
      }
    }
    return Status::invalid_argument(fmt::format("{}: {}", source, detail));
  }
  parsed.keys = index_keys(cleaned);
  if (parsed.keys.duplicate_path) {
    TextPosition pos = position_of(text, parsed.keys.duplicate_offset);
    return Status::invalid_argument(
        fmt::format("{}:{}:{}: {}: duplicate key (the reference rejects it too; keep one)", source,
                    pos.line, pos.column, *parsed.keys.duplicate_path));
  }
  return parsed;
}

}  // namespace zinf::config::detail
