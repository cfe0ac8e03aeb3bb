// Checkpoints: per-rank fp32 master and optimizer state plus engine counters, saved atomically
// (temporary folder, fsync, rename, then `latest`), verified by checksums on load.
//
// Layout of <dir>:
//   latest                       the newest complete tag (written last)
//   <tag>/engine.json            format, model, precision, layout fingerprint, world size,
//                                counters, loss scaler, per-rank file sizes and checksums,
//                                and the caller's client_state
//   <tag>/rank<r>.state          for each sub-group, for which in (master, state 0, ...):
//                                that sub-group's padded fp32 array, back to back
// With checkpoint.use_node_local_storage each node's first rank writes engine.json and `latest`
// into its own <dir>, which holds only that node's rank files; otherwise rank 0 does, once.
//
// Loading re-partitions: every array is elementwise, so a rank's new slice of each partition
// group is read from the saved ranks whose old slices overlap it. The same world size and
// sub_group_size read each rank's own file; another world size (or sub_group_size) reads pieces
// of several.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/checksum.h"
#include "common/json_check.h"
#include "zero3/checkpoint_format.h"
#include "zero3/engine_impl.h"
#include "zero3/file_util.h"
#include "zinf/log.h"
#include "zinf/model/registry.h"
#include "zinf/zero3/checkpoint.h"
#include "zinf/zero3/safetensors.h"

namespace zinf::zero3 {
namespace {

using detail::EngineJson;
using detail::kMaxCheckpointWorld;
using detail::ModelLayout;
using detail::SavedLayout;
using detail::SavedRankFile;

constexpr int kFormatVersion = 2;  // 2: partition groups per module

// Rank files are checksummed with XXH3-64 (common/checksum.h); engine.json keeps its top 53
// bits (exact in the double that carries it to rank 0) and names the algorithm.
constexpr const char* kChecksumAlgo = "xxh3-64";

// The model's architecture as engine.json records it ("model"): its config_json() object. Older
// checkpoints recorded a GPT's dimensions without "type".
nlohmann::json model_json(const model::Model& m) { return nlohmann::json::parse(m.config_json(), nullptr, false); }
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

std::string rank_file(const std::string& folder, int rank) { return fmt::format("{}/rank{}.state", folder, rank); }

// Checkpoint folders are private (0700), as their files are (0600).
Status make_dir(const std::string& path) { return fileio::make_dir(path, fileio::kPrivateDirMode); }

Status check_format(const nlohmann::json& j, const std::string& folder) {
  if (!j.is_object() || !j.contains("model")) {
    return Status::corruption(fmt::format("{}/engine.json: not a zinf checkpoint", folder));
  }
  const nlohmann::json* format = jsonck::member(j, "format");
  const bool current = format != nullptr && format->is_number_integer() && format->get<std::int64_t>() == kFormatVersion;
  if (!current) {
    return Status::unsupported(fmt::format("{}/engine.json: checkpoint format {}, this zinf reads format {} (format 1 "
                                           "partitioned each parameter on its own)",
                                           folder, format == nullptr ? "(none)" : jsonck::describe(*format),
                                           kFormatVersion));
  }
  return Status::ok();
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
  s.layout = swap::OptimizerLayout::build(layout_partitions(model.params, model.modules, s.plan), sub_group_size);
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

// The saved parameters are this model's, name for name and shape for shape.
Status check_same_params(const ModelLayout& saved, const model::Model& now, const std::string& folder) {
  const auto params = now.params();
  if (saved.params.size() != params.size()) {
    return Status::invalid_argument(fmt::format("{}: checkpoint has {} parameters, this model has {}", folder,
                                                saved.params.size(), params.size()));
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (saved.params[i].name != params[i].name || saved.params[i].shape != params[i].shape ||
        saved.params[i].module != params[i].module) {
      return Status::invalid_argument(fmt::format("{}: checkpoint parameter {} is '{}' {} (module {}), this model's is "
                                                  "'{}' {} (module {})",
                                                  folder, i, saved.params[i].name, fmt::join(saved.params[i].shape, "x"),
                                                  saved.params[i].module, params[i].name, fmt::join(params[i].shape, "x"),
                                                  params[i].module));
    }
  }
  return Status::ok();
}

// Size and checksum of saved rank r's file against engine.json.
Status verify_rank_file(const EngineJson& e, const std::string& folder, int r) {
  const std::string path = rank_file(folder, r);
  const SavedRankFile& info = e.ranks[static_cast<std::size_t>(r)];
  auto size = file_size_of(path);
  if (!size.is_ok()) {
    return size.status().with_context(
        e.node_local
            ? fmt::format("{} was saved with checkpoint.use_node_local_storage: each node holds only its own ranks' "
                          "files; copy every rank<r>.state of the {} ranks into one folder to resume with another "
                          "world size", folder, e.ranks.size())
            : folder);
  }
  if (size.value() != info.bytes) {
    return Status::corruption(fmt::format("{}: {} bytes, engine.json says {}", path, size.value(), info.bytes));
  }
  Checksum64 sum;
  std::vector<char> chunk(std::size_t{1} << 20);
  for (std::uint64_t off = 0; off < size.value(); off += chunk.size()) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), size.value() - off));
    ZINF_RETURN_IF_ERROR(read_exact(path, off, chunk.data(), n));
    sum.add(chunk.data(), n);
  }
  if ((sum.value() >> 11) != info.checksum) {
    if (e.checksum_algo != kChecksumAlgo) {
      return Status::corruption(fmt::format(
          "{}: checksum mismatch: {}/engine.json records {}, and this build checks {}; a checkpoint without "
          "checksum_algo was saved by an older zinf (FNV-1a checksums) and cannot be verified by this one",
          path, folder, e.checksum_algo.empty() ? "no checksum_algo" : "checksum_algo \"" + e.checksum_algo + "\"",
          kChecksumAlgo));
    }
    return Status::corruption(fmt::format("{}: checksum mismatch ({}); the file is damaged", path, kChecksumAlgo));
  }
  return Status::ok();
}

Result<std::vector<SavedRankFile>> saved_ranks(const nlohmann::json& j, const SavedLayout& saved, const std::string& file) {
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
    ZINF_ASSIGN_OR_RETURN(f.bytes, jsonck::uint_key((*ranks)[r], "bytes", 0, std::numeric_limits<std::uint64_t>::max(), w));
    ZINF_ASSIGN_OR_RETURN(f.checksum, jsonck::uint_key((*ranks)[r], "checksum", 0, (std::uint64_t{1} << 53) - 1, w));
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

// Test-only (ZINF_TEST_SLOW_SAVE_MS=<ms>): announce each phase of a save on stderr and pause
// there, so that the kill tests can stop a process inside a save. Unset: nothing happens.
void save_phase(const char* phase) {
  static const long pause_ms = [] {
    const char* v = std::getenv("ZINF_TEST_SLOW_SAVE_MS");
    return v != nullptr ? std::strtol(v, nullptr, 10) : -1L;
  }();
  if (pause_ms < 0) return;
  std::fprintf(stderr, "zinf-test: save: %s\n", phase);
  std::fflush(stderr);
  if (pause_ms > 0) ::usleep(static_cast<useconds_t>(pause_ms) * 1000);
}

bool is_folder(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// What a save killed part way leaves in `dir`: "<tag>.tmp" folders, "latest.tmp.*" files and
// "<tag>.old" beside a complete "<tag>" (a tag never ends in ".tmp" or ".old"). Called by the
// writer while it holds the save lock.
void remove_stale_temporaries(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool tmp_folder = name.ends_with(".tmp") && entry.is_directory(ec) && !entry.is_symlink(ec);
    const bool tmp_latest = name.starts_with("latest.tmp.") && entry.is_regular_file(ec);
    // <tag>.old next to a <tag> folder: a re-save of <tag> that was stopped after the new folder
    // was in place and before it removed the old one (a kill after "latest written"). The new
    // <tag> is complete once it is in place, so the old copy is garbage; without <tag>, the
    // .old is the only copy and the save of that tag puts it back instead.
    const bool old_copy = name.ends_with(".old") && entry.is_directory(ec) && !entry.is_symlink(ec) &&
                          is_folder(dir + "/" + name.substr(0, name.size() - 4));
    if (tmp_folder || tmp_latest || old_copy) {
      std::error_code rm;
      std::filesystem::remove_all(entry.path(), rm);
    }
  }
}

}  // namespace

namespace detail {

Result<EngineJson> parse_engine_json(std::string_view text, const std::string& folder) {
  const std::string file = folder + "/engine.json";
  ZINF_ASSIGN_OR_RETURN(const nlohmann::json j, jsonck::parse<nlohmann::json>(text, file));
  ZINF_RETURN_IF_ERROR(check_format(j, folder));
  const jsonck::Where w{file, ""};
  EngineJson e;
  e.model = normalized_model_json(*jsonck::member(j, "model"));  // check_format made sure it is there
  ZINF_ASSIGN_OR_RETURN(e.model_layout, saved_model_layout(j, folder));
  ZINF_ASSIGN_OR_RETURN(e.saved, saved_layout(e.model_layout, j, folder));
  ZINF_ASSIGN_OR_RETURN(e.precision, jsonck::string_key(j, "precision", w));
  ZINF_ASSIGN_OR_RETURN(e.optimizer, jsonck::string_key(j, "optimizer", w));
  ZINF_ASSIGN_OR_RETURN(e.checksum_algo, jsonck::string_key_or(j, "checksum_algo", "", w));
  ZINF_ASSIGN_OR_RETURN(e.node_local, jsonck::bool_key_or(j, "node_local", false, w));
  ZINF_ASSIGN_OR_RETURN(e.ranks, saved_ranks(j, e.saved, file));
  ZINF_ASSIGN_OR_RETURN(e.counters, saved_counters(j, file));
  ZINF_ASSIGN_OR_RETURN(e.client_state, jsonck::string_key_or(j, "client_state", "", w));
  return e;
}

Status check_checkpoint_tag(std::string_view tag, std::string_view where) {
  const auto bad = [&](std::string_view why) {
    return Status::invalid_argument(fmt::format("{}: checkpoint tag '{}': {}; a tag names a folder directly inside "
                                                "the checkpoint folder",
                                                where, tag.size() > 80 ? std::string(tag.substr(0, 77)) + "..." : std::string(tag),
                                                why));
  };
  if (tag.empty()) return bad("empty");
  if (tag.size() > 255) return bad(fmt::format("{} bytes, more than a file name may have (255)", tag.size()));
  if (tag == "." || tag == "..") return bad("refers to a folder itself");
  if (tag == "latest") return bad("'latest' is the name of the file that points at the newest tag");
  for (char c : tag) {
    if (c == '/') return bad("contains '/'");
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return bad("contains a control character");
  }
  if (tag.ends_with(".tmp") || tag.ends_with(".old")) return bad("ends in .tmp or .old, the names a save uses for its temporaries");
  return Status::ok();
}

Result<std::string> parse_latest_tag(std::string_view text, const std::string& dir) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r' || text.back() == '\t')) {
    text.remove_suffix(1);
  }
  const std::string where = dir + "/latest";
  const Status st = check_checkpoint_tag(text, where);
  if (!st.is_ok()) return Status::corruption(st.message());
  return std::string(text);
}

}  // namespace detail

Status check_tag_name(const std::string& tag) {
  if (tag.size() > kMaxTagLength) {
    return Status::invalid_argument(fmt::format("checkpoint tag '{}...': {} bytes, more than the {} zinf accepts",
                                                tag.substr(0, 64), tag.size(), kMaxTagLength));
  }
  return detail::check_checkpoint_tag(tag, "checkpoint");
}

Result<std::string> checkpoint_tag_folder(const std::string& dir, const std::string& tag) {
  ZINF_RETURN_IF_ERROR(check_tag_name(tag));
  const std::string folder = dir + "/" + tag;
  if (is_folder(folder)) return folder;
  // A re-save of this tag cut off between its two renames left the complete old folder here.
  const std::string old = folder + ".old";
  if (is_folder(old) && std::filesystem::exists(old + "/engine.json")) {
    log(LogLevel::kNotice, fmt::format("{} is missing; using {} (a save of that tag was interrupted)", folder, old));
    return old;
  }
  return Status::not_found(fmt::format("checkpoint folder {} does not exist", folder));
}

Result<std::string> read_latest_tag(const std::string& dir) {
  // A tag is one short line: anything much longer is not a `latest` file.
  auto text = read_small_file(dir + "/latest", kMaxTagLength + 64);
  if (!text.is_ok()) return text.status().with_context(fmt::format("{}: no readable 'latest' tag", dir));
  ZINF_ASSIGN_OR_RETURN(std::string tag, detail::parse_latest_tag(text.value(), dir));
  if (tag.size() > kMaxTagLength) return Status::corruption(fmt::format("{}/latest: a tag of {} bytes", dir, tag.size()));
  auto folder = checkpoint_tag_folder(dir, tag);
  if (!folder.is_ok()) return Status::corruption(fmt::format("{}/latest names '{}': {}", dir, tag, folder.status().message()));
  return tag;
}

Status Engine::save_checkpoint(const std::string& dir, const std::string& tag, const std::string& client_state) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(check_tag_name(tag).with_context(fmt::format("checkpoint save into {}", dir)));
  const int rank = m.comm.rank();
  const std::string final_dir = dir + "/" + tag;
  const std::string tmp_dir = fmt::format("{}/{}.tmp", dir, tag);
  // Who writes the shared files: rank 0, or each node's first rank for node-local storage.
  const bool writer = m.options.ds.checkpoint.use_node_local_storage ? m.comm.local_rank() == 0 : rank == 0;
  // The writer holds <dir>/.zinf_save.lock until the save is over: a second save into the
  // folder (another job, or another engine) is refused at once instead of mixing files.
  std::optional<fileio::FileLock> save_lock;
  Status prepared;
  if (writer) {
    prepared = [&]() -> Status {
      ZINF_RETURN_IF_ERROR(make_dir(dir));
      ZINF_ASSIGN_OR_RETURN(save_lock, fileio::FileLock::acquire(dir + "/.zinf_save.lock",
                                                                 fmt::format("checkpoint folder {}", dir)));
      remove_stale_temporaries(dir);
      // A re-save of this tag that was cut off between its renames left only <tag>.old: put it
      // back first, so that removing <tag>.old below never loses the only copy `latest` names.
      const std::string old_dir = final_dir + ".old";
      if (!is_folder(final_dir) && is_folder(old_dir)) ZINF_RETURN_IF_ERROR(fileio::rename_path(old_dir, final_dir));
      return make_dir(tmp_dir);
    }();
  }
  // Every rank learns whether the folder is ready (a refused writer must not leave the others waiting).
  std::vector<double> not_ready = {prepared.is_ok() ? 0.0 : 1.0};
  ZINF_RETURN_IF_ERROR(m.comm.all_reduce_sum(not_ready));
  ZINF_RETURN_IF_ERROR(prepared);
  if (not_ready[0] > 0) {
    return Status::aborted(fmt::format("checkpoint save into {}: the writing rank could not prepare the folder", dir));
  }
  // This rank's state, streamed sub-group by sub-group.
  ZINF_ASSIGN_OR_RETURN(AtomicFile file, AtomicFile::create(rank_file(tmp_dir, rank)));
  Checksum64 sum;
  std::uint64_t bytes = 0;
  std::vector<float> buf;
  const std::size_t arrays = 1 + m.optimizer->optimizer().state_count();
  for (std::size_t sg = 0; sg < m.layout.subgroups.size(); ++sg) {
    buf.resize(m.layout.subgroups[sg].numel);
    for (std::size_t which = 0; which < arrays; ++which) {
      ZINF_RETURN_IF_ERROR(m.optimizer->read_state(sg, which, buf));
      ZINF_RETURN_IF_ERROR(file.append(buf.data(), buf.size() * sizeof(float)));
      sum.add(buf.data(), buf.size() * sizeof(float));
      bytes += buf.size() * sizeof(float);
    }
  }
  ZINF_RETURN_IF_ERROR(file.commit());
  save_phase("rank file written");
  // Every rank's size and checksum reach rank 0 for engine.json.
  std::vector<double> sizes(static_cast<std::size_t>(m.comm.world_size()) * 2, 0.0);
  sizes[static_cast<std::size_t>(rank) * 2] = static_cast<double>(bytes);
  sizes[static_cast<std::size_t>(rank) * 2 + 1] = static_cast<double>(sum.value() >> 11);  // exact in a double
  ZINF_RETURN_IF_ERROR(m.comm.all_reduce_sum(sizes));
  if (writer) {
    nlohmann::json j;
    j["format"] = kFormatVersion;
    j["tag"] = tag;
    j["model"] = model_json(*m.model);
    j.update(layout_json(*m.model));
    j["precision"] = swap::dtype_name(m.dtype);
    j["optimizer"] = m.optimizer->optimizer().config().name();
    j["layout"] = m.layout.fingerprint();
    j["world_size"] = m.comm.world_size();
    j["partition"] = "one group per module, split in W contiguous slices";
    j["node_local"] = m.options.ds.checkpoint.use_node_local_storage;
    j["sub_groups"] = m.layout.subgroups.size();
    j["sub_group_size"] = m.layout.sub_group_size;
    j["arrays"] = arrays;
    j["counters"] = {{"steps", m.counters.steps},
                     {"updates", m.counters.updates},
                     {"schedule_k", m.counters.schedule_k},
                     {"loss_scale", m.counters.loss_scale},
                     {"scaler_iteration", m.counters.scaler_iteration},
                     {"scaler_last_overflow", m.counters.scaler_last_overflow},
                     {"scaler_hysteresis_left", m.counters.scaler_hysteresis_left}};
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < m.comm.world_size(); ++r) {
      ranks.push_back({{"bytes", static_cast<std::uint64_t>(sizes[static_cast<std::size_t>(r) * 2])},
                       {"checksum", static_cast<std::uint64_t>(sizes[static_cast<std::size_t>(r) * 2 + 1])}});
    }
    j["ranks"] = ranks;
    j["checksum_algo"] = kChecksumAlgo;
    j["client_state"] = client_state;
    ZINF_RETURN_IF_ERROR(write_file_atomic(tmp_dir + "/engine.json", j.dump(2) + "\n"));
    ZINF_RETURN_IF_ERROR(sync_dir(tmp_dir));
    save_phase("engine.json written");
    // Swap the new folder in; an older one with the same tag goes only after that succeeded.
    // Between the two renames <tag> is missing: readers then take <tag>.old, which is complete
    // (checkpoint_tag_folder), and the next save of the tag puts it back first.
    const std::string old_dir = fmt::format("{}/{}.old", dir, tag);
    std::error_code ec;
    std::filesystem::remove_all(old_dir, ec);
    const bool had_old = std::filesystem::exists(final_dir);
    if (had_old) ZINF_RETURN_IF_ERROR(fileio::rename_path(final_dir, old_dir));
    if (had_old) save_phase("old folder moved aside");
    if (Status moved = fileio::rename_path(tmp_dir, final_dir); !moved.is_ok()) {
      // Put the old folder back; should that fail too, the next save or load finds <tag>.old.
      if (had_old) (void)fileio::rename_path(old_dir, final_dir);
      return moved;
    }
    ZINF_RETURN_IF_ERROR(sync_dir(dir));
    save_phase("new folder in place");
    ZINF_RETURN_IF_ERROR(write_file_atomic(dir + "/latest", tag + "\n"));
    save_phase("latest written");
    if (had_old) std::filesystem::remove_all(old_dir, ec);
  }
  return m.comm.barrier();
}

Result<std::string> Engine::load_checkpoint(const std::string& dir, const std::string& requested_tag) {
  Impl& m = *impl_;
  std::string tag = requested_tag;
  if (tag.empty()) {
    ZINF_ASSIGN_OR_RETURN(tag, read_latest_tag(dir));
  } else {
    ZINF_RETURN_IF_ERROR(check_tag_name(tag).with_context(fmt::format("--resume {}", dir)));
  }
  ZINF_ASSIGN_OR_RETURN(const std::string folder, checkpoint_tag_folder(dir, tag));
  ZINF_ASSIGN_OR_RETURN(std::string text, read_small_file(folder + "/engine.json"));
  ZINF_ASSIGN_OR_RETURN(const EngineJson e, detail::parse_engine_json(text, folder));
  auto mismatch = [&](const std::string& what, const std::string& saved, const std::string& now) {
    return Status::invalid_argument(fmt::format("{}: checkpoint has {} {}, this run has {}", folder, what, saved, now));
  };
  const nlohmann::json now_model = model_json(*m.model);
  if (e.model != now_model) return mismatch("model", e.model.dump(), now_model.dump());
  const ModelLayout& saved_model = e.model_layout;
  ZINF_RETURN_IF_ERROR(check_same_params(saved_model, *m.model, folder));
  if (e.precision != swap::dtype_name(m.dtype)) {
    return mismatch("precision", e.precision, std::string(swap::dtype_name(m.dtype)));
  }
  if (e.optimizer != m.optimizer->optimizer().config().name()) {
    return mismatch("optimizer", e.optimizer, std::string(m.optimizer->optimizer().config().name()));
  }
  const SavedLayout& saved = e.saved;
  const std::size_t arrays = 1 + m.optimizer->optimizer().state_count();
  if (saved.arrays != arrays) {
    return Status::corruption(fmt::format("{}/engine.json: {} arrays per sub-group, the optimizer has {}", folder,
                                          saved.arrays, arrays));
  }
  // The saved ranks whose slices overlap this rank's: verify each whole file before any state
  // is touched.
  const int rank = m.comm.rank();
  const int old_world = saved.plan.world_size();
  std::vector<bool> needed(static_cast<std::size_t>(old_world), false);
  for (std::size_t g = 0; g < m.plan.num_groups(); ++g) {
    const ElementRange mine = m.plan.owned_in_group(g, rank);
    for (int q = 0; q < old_world; ++q) {
      const ElementRange theirs = saved.plan.owned_in_group(g, q);
      if (std::max(mine.begin, theirs.begin) < std::min(mine.end, theirs.end)) needed[static_cast<std::size_t>(q)] = true;
    }
  }
  for (int q = 0; q < old_world; ++q) {
    if (needed[static_cast<std::size_t>(q)]) ZINF_RETURN_IF_ERROR(verify_rank_file(e, folder, q));
  }
  std::vector<float> buf;
  for (std::size_t sg = 0; sg < m.layout.subgroups.size(); ++sg) {
    buf.resize(m.layout.subgroups[sg].numel);
    for (std::size_t which = 0; which < arrays; ++which) {
      std::fill(buf.begin(), buf.end(), 0.0f);
      for (std::size_t g = m.layout.subgroups[sg].first_param;
           g < m.layout.subgroups[sg].first_param + m.layout.subgroups[sg].param_count; ++g) {
        const ElementRange mine = m.plan.owned_in_group(g, rank);
        for (int q = 0; q < old_world; ++q) {
          const ElementRange theirs = saved.plan.owned_in_group(g, q);
          const std::size_t lo = std::max(mine.begin, theirs.begin), hi = std::min(mine.end, theirs.end);
          if (lo >= hi) continue;
          float* to = buf.data() + m.layout.offset_in_subgroup[g] + (lo - mine.begin);
          ZINF_RETURN_IF_ERROR(read_exact(rank_file(folder, q), saved.element_offset(g, which, lo - theirs.begin), to,
                                          (hi - lo) * sizeof(float)));
        }
      }
      ZINF_RETURN_IF_ERROR(m.optimizer->load_state(sg, which, buf).with_context(folder));
    }
  }
  if (old_world != m.comm.world_size() || saved.layout.fingerprint() != m.layout.fingerprint()) {
    log(LogLevel::kInfo, fmt::format("{}: re-partitioned from {} to {} ranks ({} -> {})", folder, old_world,
                                     m.comm.world_size(), saved.layout.fingerprint(), m.layout.fingerprint()));
  }
  m.counters.steps = e.counters.steps;
  m.counters.updates = e.counters.updates;
  m.counters.schedule_k = e.counters.schedule_k;
  optim::LossScaler::State s;
  s.scale = e.counters.loss_scale;
  s.iteration = e.counters.scaler_iteration;
  s.last_overflow_iteration = e.counters.scaler_last_overflow;
  s.hysteresis_left = e.counters.scaler_hysteresis_left;
  ZINF_RETURN_IF_ERROR(m.scaler->restore(s).with_context(folder));
  m.sync_scaler_counters();
  ZINF_RETURN_IF_ERROR(m.publish_params());
  m.coordinator->invalidate_gathered();
  return e.client_state;
}

struct CheckpointReader::Impl {
  std::string folder;
  std::string model_json;
  ModelLayout model;
  SavedLayout saved;
  std::string client_state;
};

CheckpointReader::CheckpointReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept = default;
CheckpointReader::~CheckpointReader() = default;

Result<CheckpointReader> CheckpointReader::open(const std::string& checkpoint) {
  std::string folder = checkpoint;
  if (!std::filesystem::exists(folder + "/engine.json")) {
    if (!std::filesystem::exists(checkpoint + "/latest")) {
      return Status::not_found(fmt::format("{}: neither a checkpoint folder (engine.json) nor one with 'latest'", checkpoint));
    }
    ZINF_ASSIGN_OR_RETURN(const std::string tag, read_latest_tag(checkpoint));
    ZINF_ASSIGN_OR_RETURN(folder, checkpoint_tag_folder(checkpoint, tag));
  }
  ZINF_ASSIGN_OR_RETURN(std::string text, read_small_file(folder + "/engine.json"));
  ZINF_ASSIGN_OR_RETURN(EngineJson e, detail::parse_engine_json(text, folder));
  for (int r = 0; r < e.saved.plan.world_size(); ++r) ZINF_RETURN_IF_ERROR(verify_rank_file(e, folder, r));
  auto impl = std::make_unique<Impl>(
      Impl{folder, e.model.dump(), std::move(e.model_layout), std::move(e.saved), std::move(e.client_state)});
  return CheckpointReader(std::move(impl));
}

const std::string& CheckpointReader::folder() const { return impl_->folder; }
const std::string& CheckpointReader::model_config_json() const { return impl_->model_json; }
const std::string& CheckpointReader::client_state() const { return impl_->client_state; }
std::span<const model::ParamSpec> CheckpointReader::params() const { return impl_->model.params; }
std::span<const model::ModuleSpec> CheckpointReader::modules() const { return impl_->model.modules; }

Status CheckpointReader::read_param(std::size_t index, std::span<float> out) const {
  const Impl& m = *impl_;
  if (index >= m.model.params.size() || out.size() != m.model.params[index].numel) {
    return Status::invalid_argument(fmt::format("{}: read_param({}) with {} elements", m.folder, index, out.size()));
  }
  const SavedLayout& saved = m.saved;
  for (int r = 0; r < saved.plan.world_size(); ++r) {
    const ElementRange range = saved.plan.owned(index, r);
    if (range.size() == 0) continue;
    const std::uint64_t at = saved.element_offset(saved.plan.place(index).group, 0, saved.plan.slice_offset(index, r));
    ZINF_RETURN_IF_ERROR(
        read_exact(rank_file(m.folder, r), at, out.data() + range.begin, range.size() * sizeof(float)));
  }
  return Status::ok();
}

Status consolidate_checkpoint(const std::string& checkpoint, const std::string& out_path) {
  ZINF_ASSIGN_OR_RETURN(const CheckpointReader reader, CheckpointReader::open(checkpoint));
  std::vector<TensorToWrite> tensors;
  for (std::size_t p = 0; p < reader.params().size(); ++p) {
    const model::ParamSpec& spec = reader.params()[p];
    tensors.push_back({spec.name, spec.shape, [&, p](std::span<float> out) { return reader.read_param(p, out); }});
  }
  return write_safetensors(out_path, tensors, {{"format", "pt"}, {"source", "zinf " + reader.folder()}});
}

}  // namespace zinf::zero3
