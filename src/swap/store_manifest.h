// Internal: the swap store's manifest (JSON).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "zinf/status.h"
#include "zinf/swap/swap_store.h"

namespace zinf::swap::detail {

inline constexpr int kManifestVersion = 1;
inline constexpr const char* kManifestFormat = "zinf-swap-store";

struct ManifestFile {
  std::string name;         // file name inside its nvme_path's store folder, "stripe<i>.swp"
  std::uint64_t bytes = 0;  // bytes allocated in the file (its logical end)
};

struct Manifest {
  int rank = 0;
  std::string kind;
  std::uint64_t stripe_unit = 0;
  std::uint64_t generation = 0;
  std::vector<ManifestFile> files;
  std::map<std::string, TensorRecord> tensors;
  std::map<std::string, std::string> metadata;
  // Per tensor with a checksum extent (TensorRecord::sums): the XXH3-64 of the checksums
  // stored there. Tensors without one (a manifest from before checksums, or a store without
  // them) have no entry.
  std::map<std::string, std::uint64_t> sums_check;
};

std::string manifest_to_json(const Manifest& manifest);
// Corruption (naming `path`) when the text is not a manifest this version can read.
Result<Manifest> manifest_from_json(const std::string& text, const std::string& path);

}  // namespace zinf::swap::detail
