// Internal: a checkpoint's engine.json written from and read into plain structs, with no I/O, so
// that save, resume, consolidation and the fuzz targets share one writer and one reader that
// never throws. The tag rule and `latest` are in checkpoint_folder.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "zero3/model_partition.h"
#include "zinf/zero3/engine.h"
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
  swap::PartitionLayout layout;
  std::size_t arrays = 1;
  std::vector<std::uint64_t> subgroup_bytes_at;  // where each sub-group's arrays start in a rank file
  std::uint64_t rank_file_bytes = 0;             // every rank file's size under this layout

  // Byte offset in a rank file of element `element` of group g's slice in the array at
  // `position` (StateArray::position(): 0 the master weights, 1 + i the optimizer's state i).
  std::uint64_t element_offset(std::size_t g, std::size_t position, std::size_t element) const {
    const std::size_t sg = layout.subgroup_of[g];
    return subgroup_bytes_at[sg] + (position * layout.subgroups[sg].numel + layout.offset_in_subgroup[g] + element) * sizeof(float);
  }
};

struct SavedRankFile {
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0;  // the XXH3-64 of the file (format 2: its top 53 bits)
};

// Everything a load needs from engine.json, each value checked for type and range.
struct EngineJson {
  int format = 0;        // kOldestCheckpointFormat .. kCheckpointFormat
  nlohmann::json model;  // the architecture, normalized (a GPT without "type" gets it)
  ModelLayout model_layout;
  SavedLayout saved;
  std::string precision;
  std::string optimizer;
  std::string checksum_algo;  // kChecksumAlgo
  bool node_local = false;
  std::vector<SavedRankFile> ranks;
  EngineCounters counters;
  std::string client_state;
};

// The engine.json format a save writes: each rank file's whole XXH3-64. A load also reads format
// 2 (released by earlier zinf: the top 53 bits of each checksum), so that their checkpoints
// resume; format 1 (never released) is refused as Unsupported.
inline constexpr int kCheckpointFormat = 3;
inline constexpr int kOldestCheckpointFormat = 2;

// The checksum of each rank file, named in engine.json ("checksum_algo").
inline constexpr const char* kChecksumAlgo = "xxh3-64";

// Largest world size a checkpoint may record (ranks are ints; the ranks array must match it).
inline constexpr std::int64_t kMaxCheckpointWorld = std::int64_t{1} << 20;

// The model's architecture as engine.json records it ("model"): its config_json() object.
nlohmann::json model_json(const model::Model& m);

// What a save records in engine.json besides the model's own description and lists.
struct SaveRecord {
  std::string tag;
  std::string precision;
  std::string optimizer;
  const swap::PartitionLayout* layout = nullptr;
  int world_size = 1;
  bool node_local = false;
  std::size_t arrays = 1;  // the master copy and the optimizer's states
  EngineCounters counters;
  std::vector<SavedRankFile> ranks;  // per rank, in rank order
  std::string client_state;
};

// The text of engine.json (format kCheckpointFormat) for `model` and `r`.
std::string engine_json_text(const model::Model& model, const SaveRecord& r);

// Parses the text of `folder`/engine.json. Corruption naming the file and the key for anything
// missing, mistyped or out of range; Unsupported for another format version. Never throws.
Result<EngineJson> parse_engine_json(std::string_view text, const std::string& folder);

}  // namespace zinf::zero3::detail
