// Internal: a checkpoint's engine.json and `latest` read into plain structs, with no I/O, so that
// resume, consolidation and the fuzz targets share one reader that never throws.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "zero3/engine_impl.h"
#include "zinf/model/model.h"
#include "zinf/status.h"

namespace zinf::zero3::detail {

// A model's parameter and module lists as a checkpoint knows them.
struct ModelLayout {
  std::vector<model::ParamSpec> params;
  std::vector<model::ModuleSpec> modules;
};

// How a checkpoint's ranks laid out their state: its plan and layout, rebuilt from engine.json
// and checked against the stored fingerprint.
struct SavedLayout {
  PartitionPlan plan;
  swap::OptimizerLayout layout;
  std::size_t arrays = 1;
  std::vector<std::uint64_t> subgroup_bytes_at;  // where each sub-group's arrays start in a rank file
  std::uint64_t rank_file_bytes = 0;             // every rank file's size under this layout

  // Byte offset in a rank file of element `element` of group g's slice in array `which`.
  std::uint64_t element_offset(std::size_t g, std::size_t which, std::size_t element) const {
    const std::size_t sg = layout.subgroup_of[g];
    return subgroup_bytes_at[sg] + (which * layout.subgroups[sg].numel + layout.offset_in_subgroup[g] + element) * sizeof(float);
  }
};

struct SavedRankFile {
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0;  // the XXH3-64 of the file (format 2: its top 53 bits)
};

// Everything a load needs from engine.json, each value checked for type and range.
struct EngineJson {
  int format = 0;        // kCheckpointFormat, or kOldestCheckpointFormat .. it
  nlohmann::json model;  // the architecture, normalized (a GPT without "type" gets it)
  ModelLayout model_layout;
  SavedLayout saved;
  std::string precision;
  std::string optimizer;
  std::string checksum_algo;  // "" in checkpoints of older zinf
  bool node_local = false;
  std::vector<SavedRankFile> ranks;
  EngineCounters counters;
  std::string client_state;
};

// The engine.json format a save writes, and the oldest a load reads. 3: each rank file's whole
// XXH3-64 (format 2 kept its top 53 bits; 1 partitioned each parameter on its own).
inline constexpr int kCheckpointFormat = 3;
inline constexpr int kOldestCheckpointFormat = 2;

// Largest world size a checkpoint may record (ranks are ints; the ranks array must match it).
inline constexpr std::int64_t kMaxCheckpointWorld = std::int64_t{1} << 20;

// Parses the text of `folder`/engine.json. Corruption naming the file and the key for anything
// missing, mistyped or out of range; Unsupported for another format version. Never throws.
Result<EngineJson> parse_engine_json(std::string_view text, const std::string& folder);

// A checkpoint tag must name a folder directly inside the checkpoint folder: non-empty, at most
// kMaxTagLength bytes, no '/', not "." or "..", no NUL or control characters, not "latest" and not
// ending in ".tmp" or ".old" (the save's own temporary names). InvalidArgument naming `where`.
// The one check for tags given to save, given to load, and read from `latest`.
Status check_checkpoint_tag(std::string_view tag, std::string_view where);

// The tag in the text of `dir`/latest (trailing whitespace dropped), checked as above.
Result<std::string> parse_latest_tag(std::string_view text, const std::string& dir);

}  // namespace zinf::zero3::detail
