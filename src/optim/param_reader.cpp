// Typed reads from a ParamMap with errors that name the key.
#include "optim/param_reader.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace zinf::optim::detail {
namespace {

std::string_view kind_of(const ParamValue& v) {
  switch (v.index()) {
    case 0: return "null";
    case 1: return "a boolean";
    case 2: return "a number";
    case 3: return "a string";
    default: return "a list";
  }
}

}  // namespace

ParamReader::ParamReader(std::string_view section, std::string_view owner, const ParamMap& params)
    : section_(section), owner_(owner), params_(params) {}

const ParamValue* ParamReader::find(std::string_view key) {
  if (std::find(known_.begin(), known_.end(), key) == known_.end()) known_.emplace_back(key);
  auto it = params_.find(key);
  if (it == params_.end() || std::holds_alternative<std::monostate>(it->second)) return nullptr;
  return &it->second;
}

bool ParamReader::has(std::string_view key) const {
  auto it = params_.find(key);
  return it != params_.end() && !std::holds_alternative<std::monostate>(it->second);
}

Status ParamReader::error(std::string_view key, std::string_view message) const {
  return Status::invalid_argument(fmt::format("{}.{}: {}", section_, key, message));
}

Status ParamReader::number(std::string_view key, double* out) {
  const ParamValue* v = find(key);
  if (v == nullptr) return Status::ok();
  const double* d = std::get_if<double>(v);
  if (d == nullptr) return error(key, fmt::format("expected a number, got {}", kind_of(*v)));
  if (!std::isfinite(*d)) return error(key, "expected a finite number");
  *out = *d;
  return Status::ok();
}

Status ParamReader::integer(std::string_view key, std::int64_t* out) {
  double d = 0.0;
  if (!has(key)) {
    (void)find(key);
    return Status::ok();
  }
  ZINF_RETURN_IF_ERROR(number(key, &d));
  if (d != std::trunc(d) || std::fabs(d) > 9.0e15) {
    return error(key, fmt::format("expected a whole number, got {}", d));
  }
  *out = static_cast<std::int64_t>(d);
  return Status::ok();
}

Status ParamReader::boolean(std::string_view key, bool* out) {
  const ParamValue* v = find(key);
  if (v == nullptr) return Status::ok();
  const bool* b = std::get_if<bool>(v);
  if (b == nullptr) return error(key, fmt::format("expected true or false, got {}", kind_of(*v)));
  *out = *b;
  return Status::ok();
}

Status ParamReader::text(std::string_view key, std::string* out) {
  const ParamValue* v = find(key);
  if (v == nullptr) return Status::ok();
  const std::string* s = std::get_if<std::string>(v);
  if (s == nullptr) return error(key, fmt::format("expected a string, got {}", kind_of(*v)));
  *out = *s;
  return Status::ok();
}

Status ParamReader::pair(std::string_view key, double* first, double* second) {
  const ParamValue* v = find(key);
  if (v == nullptr) return Status::ok();
  const std::vector<double>* list = std::get_if<std::vector<double>>(v);
  if (list == nullptr || list->size() != 2) {
    return error(key, fmt::format("expected a list of two numbers, got {}",
                                  list == nullptr ? std::string(kind_of(*v))
                                                  : fmt::format("{} numbers", list->size())));
  }
  if (!std::isfinite((*list)[0]) || !std::isfinite((*list)[1])) return error(key, "expected finite numbers");
  *first = (*list)[0];
  *second = (*list)[1];
  return Status::ok();
}

Status ParamReader::finish() const {
  for (const auto& [key, value] : params_) {
    if (std::find(known_.begin(), known_.end(), key) == known_.end()) {
      return error(key, fmt::format("unknown parameter for {} (known: {})", owner_, fmt::join(known_, ", ")));
    }
  }
  return Status::ok();
}

}  // namespace zinf::optim::detail
