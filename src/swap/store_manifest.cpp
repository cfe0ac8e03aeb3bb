// The swap store's manifest: JSON (de)serialisation.
#include "swap/store_manifest.h"

#include <charconv>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace zinf::swap::detail {

namespace {

using nlohmann::json;

TensorRecord record_from_json(const std::string& key, const json& j) {
  TensorRecord r;
  r.key = key;
  r.numel = j.at("numel").get<std::uint64_t>();
  r.nbytes = j.at("nbytes").get<std::uint64_t>();
  for (const json& e : j.at("extents")) {
    r.extents.push_back(Extent{e.at(0).get<std::uint32_t>(), e.at(1).get<std::uint64_t>(),
                               e.at(2).get<std::uint64_t>()});
  }
  return r;
}

}  // namespace

std::string manifest_to_json(const Manifest& m) {
  json j;
  j["format"] = kManifestFormat;
  j["version"] = kManifestVersion;
  j["rank"] = m.rank;
  j["kind"] = m.kind;
  j["alignment"] = kSwapAlignment;
  j["stripe_unit"] = m.stripe_unit;
  j["generation"] = m.generation;
  json files = json::array();
  for (const ManifestFile& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}});
  j["files"] = std::move(files);
  json tensors = json::object();
  for (const auto& [key, r] : m.tensors) {
    json extents = json::array();
    for (const Extent& e : r.extents) extents.push_back({e.file, e.offset, e.length});
    tensors[key] = {{"dtype", std::string(dtype_name(r.dtype))},
                    {"numel", r.numel},
                    {"nbytes", r.nbytes},
                    {"extents", std::move(extents)}};
    if (r.sums.length != 0) {
      auto it = m.sums_check.find(key);
      tensors[key]["page_sums"] = {{"extent", {r.sums.file, r.sums.offset, r.sums.length}},
                                   {"half", r.sums_half},
                                   {"xxh3", fmt::format("{:016x}", it == m.sums_check.end() ? 0 : it->second)}};
    }
  }
  j["tensors"] = std::move(tensors);
  j["metadata"] = m.metadata;
  return j.dump(1) + "\n";
}

Result<Manifest> manifest_from_json(const std::string& text, const std::string& path) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::corruption(fmt::format("swap store manifest {}: not valid JSON", path));
  try {
    if (j.at("format").get<std::string>() != kManifestFormat) {
      return Status::corruption(fmt::format("{}: not a zinf swap store manifest", path));
    }
    const int version = j.at("version").get<int>();
    if (version != kManifestVersion) {
      return Status::corruption(
          fmt::format("{}: manifest version {} (this build reads {})", path, version, kManifestVersion));
    }
    Manifest m;
    m.rank = j.at("rank").get<int>();
    m.kind = j.at("kind").get<std::string>();
    m.stripe_unit = j.at("stripe_unit").get<std::uint64_t>();
    m.generation = j.at("generation").get<std::uint64_t>();
    for (const json& f : j.at("files")) {
      m.files.push_back(ManifestFile{f.at("name").get<std::string>(), f.at("bytes").get<std::uint64_t>()});
    }
    for (const auto& [key, t] : j.at("tensors").items()) {
      TensorRecord r = record_from_json(key, t);
      ZINF_ASSIGN_OR_RETURN(r.dtype, parse_dtype(t.at("dtype").get<std::string>()));
      if (t.contains("page_sums")) {
        const json& ps = t.at("page_sums");
        const json& e = ps.at("extent");
        r.sums = Extent{e.at(0).get<std::uint32_t>(), e.at(1).get<std::uint64_t>(), e.at(2).get<std::uint64_t>()};
        r.sums_half = ps.at("half").get<std::uint32_t>();
        const std::string hex = ps.at("xxh3").get<std::string>();
        std::uint64_t check = 0;
        const auto [end, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), check, 16);
        if (ec != std::errc() || end != hex.data() + hex.size() || hex.size() != 16 ||
            r.sums_half > 1 || r.sums.length % (2 * kSwapAlignment) != 0 ||
            r.sums.length / 2 < align_up(r.nbytes, kSwapAlignment) / kSwapAlignment * 8) {
          return Status::corruption(fmt::format("{}: the page_sums entry of '{}' is malformed", path, key));
        }
        m.sums_check.emplace(key, check);
      }
      m.tensors.emplace(key, std::move(r));
    }
    m.metadata = j.at("metadata").get<std::map<std::string, std::string>>();
    return m;
  } catch (const json::exception& e) {
    return Status::corruption(fmt::format("swap store manifest {}: {}", path, e.what()));
  }
}

}  // namespace zinf::swap::detail
