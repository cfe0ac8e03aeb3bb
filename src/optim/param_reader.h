// Internal: typed reads from a ParamMap, with errors that name "<section>.<key>" and a final
// check that rejects every key no read asked for.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/optim/params.h"
#include "zinf/status.h"

namespace zinf::optim::detail {

class ParamReader {
 public:
  // section: e.g. "scheduler.params"; owner: e.g. "WarmupLR" (named in unknown-key errors).
  ParamReader(std::string_view section, std::string_view owner, const ParamMap& params);

  // Each read declares `key` as known. A missing or null key leaves *out unchanged.
  Status number(std::string_view key, double* out);
  Status integer(std::string_view key, std::int64_t* out);  // whole numbers only
  Status boolean(std::string_view key, bool* out);
  Status text(std::string_view key, std::string* out);
  Status pair(std::string_view key, double* first, double* second);  // [a, b]
  bool has(std::string_view key) const;  // present and not null

  // An invalid_argument Status "<section>.<key>: <message>".
  Status error(std::string_view key, std::string_view message) const;
  // Fails on the first key that no read declared: "<section>.<key>: unknown parameter for
  // <owner> (known: a, b, c)".
  Status finish() const;

 private:
  const ParamValue* find(std::string_view key);
  std::string section_;
  std::string owner_;
  const ParamMap& params_;
  std::vector<std::string> known_;
};

}  // namespace zinf::optim::detail
