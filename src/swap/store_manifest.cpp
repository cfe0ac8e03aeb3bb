// The swap store's manifest: JSON (de)serialisation.
#include "swap/store_manifest.h"

#include <charconv>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/json_check.h"

namespace zinf::swap::detail {

namespace {

using nlohmann::json;

constexpr std::uint64_t kU64 = std::numeric_limits<std::uint64_t>::max();

// [file, offset, length] with each number checked for its type.
Result<Extent> extent_from_json(const json& e, jsonck::Where w) {
  if (!e.is_array() || e.size() != 3) return jsonck::bad(w, "expected [file, offset, length]");
  Extent out;
  ZINF_ASSIGN_OR_RETURN(const std::uint64_t file, jsonck::uint_value(e[0], 0, std::numeric_limits<std::uint32_t>::max(), w));
  out.file = static_cast<std::uint32_t>(file);
  ZINF_ASSIGN_OR_RETURN(out.offset, jsonck::uint_value(e[1], 0, kU64, w));
  ZINF_ASSIGN_OR_RETURN(out.length, jsonck::uint_value(e[2], 0, kU64 - out.offset, w));  // no wrap of offset + length
  if (out.offset % kSwapAlignment != 0 || out.length % kSwapAlignment != 0) {
    return jsonck::bad(w, fmt::format("offset {} and length {} must be multiples of {}", out.offset, out.length,
                                      kSwapAlignment));
  }
  return out;
}

Result<TensorRecord> record_from_json(const std::string& key, const json& j, const std::string& path) {
  const std::string where = "tensors." + key;
  const jsonck::Where w{path, where};
  if (!j.is_object()) return jsonck::bad(w, "expected an object");
  TensorRecord r;
  r.key = key;
  ZINF_ASSIGN_OR_RETURN(r.numel, jsonck::uint_key(j, "numel", 0, kU64, w));
  ZINF_ASSIGN_OR_RETURN(r.nbytes, jsonck::uint_key(j, "nbytes", 0, kU64 - kSwapAlignment, w));
  ZINF_ASSIGN_OR_RETURN(const std::string dtype, jsonck::string_key(j, "dtype", w));
  ZINF_ASSIGN_OR_RETURN(r.dtype, parse_dtype(dtype));
  const json* extents = jsonck::member(j, "extents");
  if (extents == nullptr || !extents->is_array()) return jsonck::bad(w, "extents: missing or not an array");
  for (std::size_t i = 0; i < extents->size(); ++i) {
    const std::string at = fmt::format("{}.extents[{}]", where, i);
    ZINF_ASSIGN_OR_RETURN(Extent e, extent_from_json((*extents)[i], {path, at}));
    r.extents.push_back(e);
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
  auto parsed = jsonck::parse<json>(text, path);
  if (!parsed.is_ok()) return Status::corruption("swap store manifest " + parsed.status().message());
  const json& j = parsed.value();
  if (!j.is_object()) return Status::corruption(fmt::format("swap store manifest {}: not a JSON object", path));
  const jsonck::Where w{path, ""};
  auto format = jsonck::string_key(j, "format", w);
  if (!format.is_ok() || format.value() != kManifestFormat) {
    return Status::corruption(fmt::format("{}: not a zinf swap store manifest", path));
  }
  ZINF_ASSIGN_OR_RETURN(const std::int64_t version, jsonck::int_key(j, "version", 0, std::numeric_limits<int>::max(), w));
  if (version != kManifestVersion) {
    return Status::corruption(
        fmt::format("{}: manifest version {} (this build reads {})", path, version, kManifestVersion));
  }
  Manifest m;
  ZINF_ASSIGN_OR_RETURN(const std::int64_t rank, jsonck::int_key(j, "rank", 0, std::numeric_limits<int>::max(), w));
  m.rank = static_cast<int>(rank);
  ZINF_ASSIGN_OR_RETURN(m.kind, jsonck::string_key(j, "kind", w));
  ZINF_ASSIGN_OR_RETURN(m.stripe_unit, jsonck::uint_key(j, "stripe_unit", 0, kU64, w));
  ZINF_ASSIGN_OR_RETURN(m.generation, jsonck::uint_key(j, "generation", 0, kU64, w));
  const json* files = jsonck::member(j, "files");
  if (files == nullptr || !files->is_array()) return jsonck::bad(w, "files: missing or not an array");
  for (std::size_t i = 0; i < files->size(); ++i) {
    const std::string at = fmt::format("files[{}]", i);
    const jsonck::Where fw{path, at};
    ManifestFile f;
    ZINF_ASSIGN_OR_RETURN(f.name, jsonck::string_key((*files)[i], "name", fw));
    ZINF_ASSIGN_OR_RETURN(f.bytes, jsonck::uint_key((*files)[i], "bytes", 0, kU64, fw));
    m.files.push_back(std::move(f));
  }
  const json* tensors = jsonck::member(j, "tensors");
  if (tensors == nullptr || !tensors->is_object()) return jsonck::bad(w, "tensors: missing or not an object");
  for (const auto& [key, t] : tensors->items()) {
    ZINF_ASSIGN_OR_RETURN(TensorRecord r, record_from_json(key, t, path));
    if (const json* ps = jsonck::member(t, "page_sums"); ps != nullptr) {
      const std::string at = "tensors." + key + ".page_sums";
      const jsonck::Where pw{path, at};
      const json* extent = jsonck::member(*ps, "extent");
      if (extent == nullptr) return jsonck::bad(pw, "missing key \"extent\"");
      ZINF_ASSIGN_OR_RETURN(r.sums, extent_from_json(*extent, pw));
      ZINF_ASSIGN_OR_RETURN(const std::uint64_t half, jsonck::uint_key(*ps, "half", 0, 1, pw));
      r.sums_half = static_cast<std::uint32_t>(half);
      ZINF_ASSIGN_OR_RETURN(const std::string hex, jsonck::string_key(*ps, "xxh3", pw));
      std::uint64_t check = 0;
      const auto [end, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), check, 16);
      if (ec != std::errc() || end != hex.data() + hex.size() || hex.size() != 16 ||
          r.sums.length % (2 * kSwapAlignment) != 0 ||
          r.sums.length / 2 < align_up(r.nbytes, kSwapAlignment) / kSwapAlignment * 8) {
        return Status::corruption(fmt::format("{}: the page_sums entry of '{}' is malformed", path, key));
      }
      m.sums_check.emplace(key, check);
    }
    m.tensors.emplace(key, std::move(r));
  }
  const json* metadata = jsonck::member(j, "metadata");
  if (metadata == nullptr || !metadata->is_object()) return jsonck::bad(w, "metadata: missing or not an object");
  for (const auto& [key, v] : metadata->items()) {
    if (!v.is_string()) return jsonck::bad(w, fmt::format("metadata.{}: expected a string, got {}", key, jsonck::describe(v)));
    m.metadata.emplace(key, v.get<std::string>());
  }
  return m;
}

}  // namespace zinf::swap::detail
