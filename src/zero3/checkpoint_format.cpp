// A checkpoint's engine.json: written from a SaveRecord, read into an EngineJson with every
// value checked; no I/O.
#include "zero3/checkpoint_format.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/json_check.h"
#include "zinf/model/registry.h"

namespace zinf::zero3::detail {
namespace {

// Checkpoints from before the Model interface recorded a GPT's dimensions without "type".
nlohmann::json normalized_model_json(nlohmann::json j) {
  if (j.is_object() && !j.contains("type")) j["type"] = "gpt";
  return j;
}

// The parameter and module lists ("params", "modules"), so that consolidation and resume checks
// need no code of the model that saved them.
nlohmann::json layout_json(const model::Model& m) {
  nlohmann::json params = nlohmann::json::array(), modules = nlohmann::json::array();
  for (const model::ParamSpec& p : m.params()) params.push_back({{"name", p.name}, {"shape", p.shape}, {"module", p.module}});
  for (const model::ModuleSpec& mod : m.modules()) modules.push_back({{"name", mod.name}, {"params", mod.params}});
  return {{"params", std::move(params)}, {"modules", std::move(modules)}};
}

// Reads "params"/"modules" from engine.json; a checkpoint without them (written before the Model
// interface) is a built-in model rebuilt from "model". Never throws on malformed input.
Result<ModelLayout> saved_model_layout(const nlohmann::json& j, const std::string& folder) {
  const std::string where = folder + "/engine.json";
  ModelLayout out;
  const nlohmann::json* jp = jsonck::member(j, "params");
  const nlohmann::json* jm = jsonck::member(j, "modules");
  if (jp == nullptr && jm == nullptr) {
    const nlohmann::json* model = jsonck::member(j, "model");
    if (model == nullptr) return Status::corruption(fmt::format("{}: missing key \"model\"", where));
    ZINF_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> m, model::make_builtin_model(model->dump(), where));
    out.params.assign(m->params().begin(), m->params().end());
    out.modules.assign(m->modules().begin(), m->modules().end());
    return out;
  }
  const auto bad = [&](const std::string& what) {
    return Status::corruption(fmt::format("{}: {} (the model's parameter list is damaged)", where, what));
  };
  if (jp == nullptr || jm == nullptr || !jp->is_array() || !jm->is_array()) {
    return bad("\"params\" and \"modules\" must be arrays");
  }
  const auto small_int = [](const nlohmann::json* v, std::int64_t lo, std::int64_t hi) {
    return v != nullptr && jsonck::int_value(*v, lo, hi, {}).is_ok();
  };
  // The whole model at most 2^48 elements, so byte offsets (x arrays x 4) stay far from 2^64.
  constexpr std::size_t kMaxElements = std::size_t{1} << 48;
  std::size_t total = 0;
  for (std::size_t i = 0; i < jp->size(); ++i) {
    const nlohmann::json& e = (*jp)[i];
    const nlohmann::json* name = jsonck::member(e, "name");
    const nlohmann::json* shape = jsonck::member(e, "shape");
    const nlohmann::json* module = jsonck::member(e, "module");
    if (name == nullptr || !name->is_string() || shape == nullptr || !shape->is_array() ||
        !small_int(module, 0, INT32_MAX)) {
      return bad(fmt::format("params[{}] needs a string \"name\", an array \"shape\" and an integer \"module\"", i));
    }
    model::ParamSpec p;
    p.name = name->get<std::string>();
    p.index = static_cast<int>(i);
    p.module = static_cast<int>(module->get<std::int64_t>());
    p.numel = 1;
    for (const nlohmann::json& d : *shape) {
      if (!small_int(&d, 1, INT64_MAX / 2)) return bad(fmt::format("params[{}] ('{}') has shape {}", i, p.name, shape->dump()));
      p.shape.push_back(d.get<std::int64_t>());
      if (p.numel > kMaxElements / static_cast<std::size_t>(p.shape.back())) {
        return bad(fmt::format("params[{}] ('{}') has shape {}", i, p.name, shape->dump()));
      }
      p.numel *= static_cast<std::size_t>(p.shape.back());
    }
    total += p.numel;
    if (total > kMaxElements) return bad(fmt::format("more than 2^48 elements in all at params[{}]", i));
    out.params.push_back(std::move(p));
  }
  for (std::size_t m = 0; m < jm->size(); ++m) {
    const nlohmann::json& e = (*jm)[m];
    const nlohmann::json* name = jsonck::member(e, "name");
    const nlohmann::json* params = jsonck::member(e, "params");
    if (name == nullptr || !name->is_string() || params == nullptr || !params->is_array()) {
      return bad(fmt::format("modules[{}] needs a string \"name\" and an array \"params\"", m));
    }
    model::ModuleSpec mod;
    mod.name = name->get<std::string>();
    for (const nlohmann::json& v : *params) {
      if (!small_int(&v, 0, INT32_MAX)) return bad(fmt::format("modules[{}] ('{}') lists {}", m, mod.name, v.dump()));
      mod.params.push_back(static_cast<int>(v.get<std::int64_t>()));
    }
    out.modules.push_back(std::move(mod));
  }
  const Status valid = model::validate_layout(out.params, out.modules);
  if (!valid.is_ok()) return bad(valid.message());
  return out;
}

// The format version of engine.json `j`: one this zinf reads, else Unsupported.
Result<int> check_format(const nlohmann::json& j, const std::string& folder) {
  if (!j.is_object() || !j.contains("model")) {
    return Status::corruption(fmt::format("{}/engine.json: not a zinf checkpoint", folder));
  }
  const nlohmann::json* format = jsonck::member(j, "format");
  const std::int64_t version = format != nullptr && format->is_number_integer() ? format->get<std::int64_t>() : 0;
  if (version < kOldestCheckpointFormat || version > kCheckpointFormat) {
    return Status::unsupported(fmt::format("{}/engine.json: checkpoint format {}, this zinf reads formats {} to {}",
                                           folder, format == nullptr ? "(none)" : jsonck::describe(*format),
                                           kOldestCheckpointFormat, kCheckpointFormat));
  }
  return static_cast<int>(version);
}

Result<SavedLayout> saved_layout(const ModelLayout& model, const nlohmann::json& j, const std::string& folder) {
  const std::string file = folder + "/engine.json";
  const jsonck::Where w{file, ""};
  ZINF_ASSIGN_OR_RETURN(const std::int64_t world, jsonck::int_key(j, "world_size", 1, kMaxCheckpointWorld, w));
  ZINF_ASSIGN_OR_RETURN(const std::uint64_t sub_group_size,
                        jsonck::uint_key(j, "sub_group_size", 0, std::numeric_limits<std::uint64_t>::max(), w));
  // The master copy and at most a few optimizer states per element.
  ZINF_ASSIGN_OR_RETURN(const std::int64_t arrays, jsonck::int_key(j, "arrays", 1, 16, w));
  ZINF_ASSIGN_OR_RETURN(const std::string fingerprint, jsonck::string_key(j, "layout", w));
  ZINF_ASSIGN_OR_RETURN(PartitionPlan plan, model_partition_plan(model.params, model.modules.size(), static_cast<int>(world)));
  SavedLayout s{std::move(plan), {}, static_cast<std::size_t>(arrays), {}, 0};
  s.layout = swap::PartitionLayout::build(layout_partitions(model.params, model.modules, s.plan), sub_group_size);
  if (s.layout.fingerprint() != fingerprint) {
    return Status::corruption(fmt::format("{}/engine.json: partition layout '{}' does not match its model and {} ranks ('{}')",
                                          folder, fingerprint, world, s.layout.fingerprint()));
  }
  std::uint64_t at = 0;
  for (const swap::SubGroup& sg : s.layout.subgroups) {
    s.subgroup_bytes_at.push_back(at);
    at += sg.numel * s.arrays * sizeof(float);  // < 2^48 x 2 x 16 x 4 in all: no overflow
  }
  s.rank_file_bytes = at;
  return s;
}

Result<std::vector<SavedRankFile>> saved_ranks(const nlohmann::json& j, int format, const SavedLayout& saved,
                                               const std::string& file) {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  // Format 2 kept each checksum's top 53 bits.
  const std::uint64_t max_checksum = format == 2 ? (std::uint64_t{1} << 53) - 1 : kMax;
  const nlohmann::json* ranks = jsonck::member(j, "ranks");
  const std::size_t world = static_cast<std::size_t>(saved.plan.world_size());
  if (ranks == nullptr || !ranks->is_array() || ranks->size() != world) {
    return Status::corruption(fmt::format("{}: ranks: expected an array of world_size = {} entries", file, world));
  }
  std::vector<SavedRankFile> out;
  for (std::size_t r = 0; r < world; ++r) {
    const std::string path = fmt::format("ranks[{}]", r);
    const jsonck::Where w{file, path};
    SavedRankFile f;
    ZINF_ASSIGN_OR_RETURN(f.bytes, jsonck::uint_key((*ranks)[r], "bytes", 0, kMax, w));
    ZINF_ASSIGN_OR_RETURN(f.checksum, jsonck::uint_key((*ranks)[r], "checksum", 0, max_checksum, w));
    if (f.bytes != saved.rank_file_bytes) {
      return Status::corruption(fmt::format("{}: {}.bytes = {}, but the recorded layout makes every rank file {} bytes",
                                            file, path, f.bytes, saved.rank_file_bytes));
    }
    out.push_back(f);
  }
  return out;
}

Result<EngineCounters> saved_counters(const nlohmann::json& j, const std::string& file) {
  const nlohmann::json* c = jsonck::member(j, "counters");
  if (c == nullptr || !c->is_object()) return Status::corruption(fmt::format("{}: counters: missing or not an object", file));
  const jsonck::Where w{file, "counters"};
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  EngineCounters out;
  ZINF_ASSIGN_OR_RETURN(out.steps, jsonck::int_key(*c, "steps", 0, kMax, w));
  ZINF_ASSIGN_OR_RETURN(out.updates, jsonck::int_key(*c, "updates", 0, kMax, w));
  ZINF_ASSIGN_OR_RETURN(out.schedule_k, jsonck::int_key(*c, "schedule_k", 0, kMax, w));
  ZINF_ASSIGN_OR_RETURN(out.loss_scale, jsonck::number_key(*c, "loss_scale", w));
  ZINF_ASSIGN_OR_RETURN(out.scaler_iteration, jsonck::int_key_or(*c, "scaler_iteration", 0, 0, kMax, w));
  ZINF_ASSIGN_OR_RETURN(out.scaler_last_overflow, jsonck::int_key_or(*c, "scaler_last_overflow", -1, -1, kMax, w));
  ZINF_ASSIGN_OR_RETURN(const std::int64_t hysteresis,
                        jsonck::int_key_or(*c, "scaler_hysteresis_left", 1, 0, std::numeric_limits<int>::max(), w));
  out.scaler_hysteresis_left = static_cast<int>(hysteresis);
  return out;
}

}  // namespace

nlohmann::json model_json(const model::Model& m) { return nlohmann::json::parse(m.config_json(), nullptr, false); }

std::string engine_json_text(const model::Model& model, const SaveRecord& r) {
  nlohmann::json j;
  j["format"] = kCheckpointFormat;
  j["tag"] = r.tag;
  j["model"] = model_json(model);
  j.update(layout_json(model));
  j["precision"] = r.precision;
  j["optimizer"] = r.optimizer;
  j["layout"] = r.layout->fingerprint();
  j["world_size"] = r.world_size;
  j["partition"] = "one group per module, split in W contiguous slices";
  j["node_local"] = r.node_local;
  j["sub_groups"] = r.layout->subgroups.size();
  j["sub_group_size"] = r.layout->sub_group_size;
  j["arrays"] = r.arrays;
  j["counters"] = {{"steps", r.counters.steps},
                   {"updates", r.counters.updates},
                   {"schedule_k", r.counters.schedule_k},
                   {"loss_scale", r.counters.loss_scale},
                   {"scaler_iteration", r.counters.scaler_iteration},
                   {"scaler_last_overflow", r.counters.scaler_last_overflow},
                   {"scaler_hysteresis_left", r.counters.scaler_hysteresis_left}};
  nlohmann::json ranks = nlohmann::json::array();
  for (const SavedRankFile& f : r.ranks) ranks.push_back({{"bytes", f.bytes}, {"checksum", f.checksum}});
  j["ranks"] = ranks;
  j["checksum_algo"] = kChecksumAlgo;
  j["client_state"] = r.client_state;
  return j.dump(2) + "\n";
}

Result<EngineJson> parse_engine_json(std::string_view text, const std::string& folder) {
  const std::string file = folder + "/engine.json";
  ZINF_ASSIGN_OR_RETURN(const nlohmann::json j, jsonck::parse<nlohmann::json>(text, file));
  const jsonck::Where w{file, ""};
  EngineJson e;
  ZINF_ASSIGN_OR_RETURN(e.format, check_format(j, folder));
  e.model = normalized_model_json(*jsonck::member(j, "model"));  // check_format made sure it is there
  ZINF_ASSIGN_OR_RETURN(e.model_layout, saved_model_layout(j, folder));
  ZINF_ASSIGN_OR_RETURN(e.saved, saved_layout(e.model_layout, j, folder));
  ZINF_ASSIGN_OR_RETURN(e.precision, jsonck::string_key(j, "precision", w));
  ZINF_ASSIGN_OR_RETURN(e.optimizer, jsonck::string_key(j, "optimizer", w));
  ZINF_ASSIGN_OR_RETURN(e.checksum_algo, jsonck::string_key(j, "checksum_algo", w));
  if (e.checksum_algo != kChecksumAlgo) {
    return Status::unsupported(fmt::format("{}: checksum_algo \"{}\", this zinf checks {}", file, e.checksum_algo, kChecksumAlgo));
  }
  ZINF_ASSIGN_OR_RETURN(e.node_local, jsonck::bool_key_or(j, "node_local", false, w));
  ZINF_ASSIGN_OR_RETURN(e.ranks, saved_ranks(j, e.format, e.saved, file));
  ZINF_ASSIGN_OR_RETURN(e.counters, saved_counters(j, file));
  ZINF_ASSIGN_OR_RETURN(e.client_state, jsonck::string_key_or(j, "client_state", "", w));
  return e;
}

}  // namespace zinf::zero3::detail
