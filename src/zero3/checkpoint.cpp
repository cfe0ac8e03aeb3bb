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
#include "zero3/engine_impl.h"
#include "zero3/file_util.h"
#include "zinf/log.h"
#include "zinf/model/registry.h"
#include "zinf/zero3/checkpoint.h"
#include "zinf/zero3/safetensors.h"

namespace zinf::zero3 {
namespace {

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

// A model's parameter and module lists as a checkpoint knows them.
struct ModelLayout {
  std::vector<model::ParamSpec> params;
  std::vector<model::ModuleSpec> modules;
};

// Reads "params"/"modules" from engine.json; a checkpoint without them (written before the Model
// interface) is a built-in model rebuilt from "model". Never throws on malformed input.
Result<ModelLayout> saved_model_layout(const nlohmann::json& j, const std::string& folder) {
  const std::string where = folder + "/engine.json";
  ModelLayout out;
  if (!j.contains("params") && !j.contains("modules")) {
    ZINF_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> m, model::make_builtin_model(j["model"].dump(), where));
    out.params.assign(m->params().begin(), m->params().end());
    out.modules.assign(m->modules().begin(), m->modules().end());
    return out;
  }
  const auto bad = [&](const std::string& what) {
    return Status::corruption(fmt::format("{}: {} (the model's parameter list is damaged)", where, what));
  };
  const nlohmann::json none;
  const nlohmann::json& jp = j.contains("params") ? j["params"] : none;
  const nlohmann::json& jm = j.contains("modules") ? j["modules"] : none;
  if (!jp.is_array() || !jm.is_array()) return bad("\"params\" and \"modules\" must be arrays");
  const auto small_int = [](const nlohmann::json& v, std::int64_t lo, std::int64_t hi) {
    return v.is_number_integer() && v.get<std::int64_t>() >= lo && v.get<std::int64_t>() <= hi &&
           !(v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi));
  };
  for (std::size_t i = 0; i < jp.size(); ++i) {
    const nlohmann::json& e = jp[i];
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("shape") ||
        !e["shape"].is_array() || !e.contains("module") || !small_int(e["module"], 0, INT32_MAX)) {
      return bad(fmt::format("params[{}] needs a string \"name\", an array \"shape\" and an integer \"module\"", i));
    }
    model::ParamSpec p;
    p.name = e["name"].get<std::string>();
    p.index = static_cast<int>(i);
    p.module = e["module"].get<int>();
    p.numel = 1;
    for (const nlohmann::json& d : e["shape"]) {
      if (!small_int(d, 1, INT64_MAX / 2)) return bad(fmt::format("params[{}] ('{}') has shape {}", i, p.name, e["shape"].dump()));
      p.shape.push_back(d.get<std::int64_t>());
      if (p.numel > (std::size_t{1} << 48) / static_cast<std::size_t>(p.shape.back())) {
        return bad(fmt::format("params[{}] ('{}') has shape {}", i, p.name, e["shape"].dump()));
      }
      p.numel *= static_cast<std::size_t>(p.shape.back());
    }
    out.params.push_back(std::move(p));
  }
  for (std::size_t m = 0; m < jm.size(); ++m) {
    const nlohmann::json& e = jm[m];
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("params") || !e["params"].is_array()) {
      return bad(fmt::format("modules[{}] needs a string \"name\" and an array \"params\"", m));
    }
    model::ModuleSpec mod;
    mod.name = e["name"].get<std::string>();
    for (const nlohmann::json& v : e["params"]) {
      if (!small_int(v, 0, INT32_MAX)) return bad(fmt::format("modules[{}] ('{}') lists {}", m, mod.name, v.dump()));
      mod.params.push_back(v.get<int>());
    }
    out.modules.push_back(std::move(mod));
  }
  const Status valid = model::validate_layout(out.params, out.modules);
  if (!valid.is_ok()) return bad(valid.message());
  return out;
}

std::string rank_file(const std::string& folder, int rank) { return fmt::format("{}/rank{}.state", folder, rank); }

Status make_dir(const std::string& path) {
  // Checkpoint folders are private (0700), as their files are (0600).
  if (::mkdir(path.c_str(), fileio::kPrivateDirMode) != 0 && errno != EEXIST) {
    return Status::sys_error(fmt::format("mkdir {}", path), errno);
  }
  return Status::ok();
}

Status check_format(const nlohmann::json& j, const std::string& folder) {
  if (j.is_discarded() || !j.is_object() || !j.contains("model")) {
    return Status::corruption(fmt::format("{}/engine.json: not a zinf checkpoint", folder));
  }
  if (j.value("format", 0) != kFormatVersion) {
    return Status::unsupported(fmt::format("{}/engine.json: checkpoint format {}, this zinf reads format {} (format 1 "
                                           "partitioned each parameter on its own)",
                                           folder, j.value("format", 0), kFormatVersion));
  }
  return Status::ok();
}

// How a checkpoint's ranks laid out their state: its plan and layout, rebuilt from engine.json
// and checked against the stored fingerprint.
struct SavedLayout {
  PartitionPlan plan;
  swap::OptimizerLayout layout;
  std::size_t arrays = 1;
  std::vector<std::uint64_t> subgroup_bytes_at;  // where each sub-group's arrays start in a rank file

  // Byte offset in a rank file of element `element` of group g's slice in array `which`.
  std::uint64_t element_offset(std::size_t g, std::size_t which, std::size_t element) const {
    const std::size_t sg = layout.subgroup_of[g];
    return subgroup_bytes_at[sg] + (which * layout.subgroups[sg].numel + layout.offset_in_subgroup[g] + element) * sizeof(float);
  }
};

Result<SavedLayout> saved_layout(const ModelLayout& model, const nlohmann::json& j, const std::string& folder) {
  const int world = j.value("world_size", 0);
  if (world < 1 || !j.contains("sub_group_size") || !j.contains("arrays") || !j.contains("ranks") ||
      !j["ranks"].is_array() || j["ranks"].size() != static_cast<std::size_t>(world)) {
    return Status::corruption(fmt::format("{}/engine.json: world_size, sub_group_size, arrays or ranks missing or wrong",
                                          folder));
  }
  ZINF_ASSIGN_OR_RETURN(PartitionPlan plan, model_partition_plan(model.params, model.modules.size(), world));
  SavedLayout s{std::move(plan), {}, j.value("arrays", std::size_t{1}), {}};
  s.layout = swap::OptimizerLayout::build(layout_partitions(model.params, model.modules, s.plan),
                                          j.value("sub_group_size", std::uint64_t{1}));
  if (s.layout.fingerprint() != j.value("layout", "")) {
    return Status::corruption(fmt::format("{}/engine.json: partition layout '{}' does not match its model and {} ranks ('{}')",
                                          folder, j.value("layout", ""), world, s.layout.fingerprint()));
  }
  std::uint64_t at = 0;
  for (const swap::SubGroup& sg : s.layout.subgroups) {
    s.subgroup_bytes_at.push_back(at);
    at += sg.numel * s.arrays * sizeof(float);
  }
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
Status verify_rank_file(const nlohmann::json& j, const std::string& folder, int r) {
  const std::string path = rank_file(folder, r);
  const auto& info = j["ranks"][static_cast<std::size_t>(r)];
  auto size = file_size_of(path);
  if (!size.is_ok()) {
    return size.status().with_context(
        j.value("node_local", false)
            ? fmt::format("{} was saved with checkpoint.use_node_local_storage: each node holds only its own ranks' "
                          "files; copy every rank<r>.state of the {} ranks into one folder to resume with another "
                          "world size", folder, j.value("world_size", 0))
            : folder);
  }
  if (size.value() != info.value("bytes", std::uint64_t{0})) {
    return Status::corruption(fmt::format("{}: {} bytes, engine.json says {}", path, size.value(), info.value("bytes", 0)));
  }
  Checksum64 sum;
  std::vector<char> chunk(std::size_t{1} << 20);
  for (std::uint64_t off = 0; off < size.value(); off += chunk.size()) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), size.value() - off));
    ZINF_RETURN_IF_ERROR(read_exact(path, off, chunk.data(), n));
    sum.add(chunk.data(), n);
  }
  if ((sum.value() >> 11) != info.value("checksum", std::uint64_t{0})) {
    const std::string algo = j.value("checksum_algo", "");
    if (algo != kChecksumAlgo) {
      return Status::corruption(fmt::format(
          "{}: checksum mismatch: {}/engine.json records {}, and this build checks {}; a checkpoint without "
          "checksum_algo was saved by an older zinf (FNV-1a checksums) and cannot be verified by this one",
          path, folder, algo.empty() ? "no checksum_algo" : "checksum_algo \"" + algo + "\"", kChecksumAlgo));
    }
    return Status::corruption(fmt::format("{}: checksum mismatch ({}); the file is damaged", path, kChecksumAlgo));
  }
  return Status::ok();
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

// What a save killed part way leaves in `dir`: "<tag>.tmp" folders and "latest.tmp.*" files
// (tags never contain ".tmp"). Called by the writer while it holds the save lock.
void remove_stale_temporaries(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool tmp_folder = name.ends_with(".tmp") && entry.is_directory(ec) && !entry.is_symlink(ec);
    const bool tmp_latest = name.starts_with("latest.tmp.") && entry.is_regular_file(ec);
    if (tmp_folder || tmp_latest) {
      std::error_code rm;
      std::filesystem::remove_all(entry.path(), rm);
    }
  }
}

}  // namespace

Status check_tag_name(const std::string& tag) {
  const char* why = tag.empty()                                 ? "it is empty"
                    : tag.size() > kMaxTagLength                ? "it is too long"
                    : tag.find('/') != std::string::npos        ? "it contains '/'"
                    : tag.find('\0') != std::string::npos       ? "it contains a NUL byte"
                    : tag == "." || tag == ".."                 ? "it names no folder of its own"
                                                                : nullptr;
  if (why == nullptr) return Status::ok();
  std::string shown = tag.substr(0, 64);
  for (char& c : shown) {
    if (c == '\0' || c == '\n') c = '?';
  }
  return Status::invalid_argument(fmt::format(
      "checkpoint tag '{}{}': {}; a tag is a plain folder name in the checkpoint folder (at most {} bytes)", shown,
      tag.size() > shown.size() ? "..." : "", why, kMaxTagLength));
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
  std::string tag = std::move(text).value();
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == ' ' || tag.back() == '\r')) tag.pop_back();
  const Status named = check_tag_name(tag);
  if (!named.is_ok()) return Status::corruption(fmt::format("{}/latest: {}", dir, named.message()));
  auto folder = checkpoint_tag_folder(dir, tag);
  if (!folder.is_ok()) return Status::corruption(fmt::format("{}/latest names '{}': {}", dir, tag, folder.status().message()));
  return tag;
}

Status Engine::save_checkpoint(const std::string& dir, const std::string& tag, const std::string& client_state) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(check_tag_name(tag));
  if (tag == "latest" || tag.find(".tmp") != std::string::npos || tag.ends_with(".old")) {
    return Status::invalid_argument(
        fmt::format("checkpoint tag '{}': 'latest', '.tmp' and a final '.old' are zinf's own names", tag));
  }
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
      if (!is_folder(final_dir) && is_folder(old_dir) && ::rename(old_dir.c_str(), final_dir.c_str()) != 0) {
        return Status::sys_error(fmt::format("rename {} to {}", old_dir, final_dir), errno);
      }
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
    if (had_old && ::rename(final_dir.c_str(), old_dir.c_str()) != 0) {
      return Status::sys_error(fmt::format("rename {} to {}", final_dir, old_dir), errno);
    }
    if (had_old) save_phase("old folder moved aside");
    if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0) {
      const int err = errno;
      if (had_old) (void)::rename(old_dir.c_str(), final_dir.c_str());
      return Status::sys_error(fmt::format("rename {} to {}", tmp_dir, final_dir), err);
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
  }
  ZINF_ASSIGN_OR_RETURN(const std::string folder, checkpoint_tag_folder(dir, tag));
  ZINF_ASSIGN_OR_RETURN(std::string text, read_small_file(folder + "/engine.json"));
  const auto j = nlohmann::json::parse(text, nullptr, false);
  ZINF_RETURN_IF_ERROR(check_format(j, folder));
  auto mismatch = [&](const std::string& what, const std::string& saved, const std::string& now) {
    return Status::invalid_argument(fmt::format("{}: checkpoint has {} {}, this run has {}", folder, what, saved, now));
  };
  const nlohmann::json now_model = model_json(*m.model);
  if (normalized_model_json(j["model"]) != now_model) return mismatch("model", j["model"].dump(), now_model.dump());
  ZINF_ASSIGN_OR_RETURN(const ModelLayout saved_model, saved_model_layout(j, folder));
  ZINF_RETURN_IF_ERROR(check_same_params(saved_model, *m.model, folder));
  if (j.value("precision", "") != swap::dtype_name(m.dtype)) {
    return mismatch("precision", j.value("precision", ""), std::string(swap::dtype_name(m.dtype)));
  }
  if (j.value("optimizer", "") != m.optimizer->optimizer().config().name()) {
    return mismatch("optimizer", j.value("optimizer", ""), std::string(m.optimizer->optimizer().config().name()));
  }
  ZINF_ASSIGN_OR_RETURN(SavedLayout saved, saved_layout(saved_model, j, folder));
  const std::size_t arrays = 1 + m.optimizer->optimizer().state_count();
  if (j.value("arrays", std::size_t{0}) != arrays) {
    return Status::corruption(fmt::format("{}/engine.json: {} arrays per sub-group, the optimizer has {}", folder,
                                          j.value("arrays", 0), arrays));
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
    if (needed[static_cast<std::size_t>(q)]) ZINF_RETURN_IF_ERROR(verify_rank_file(j, folder, q));
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
  const auto& c = j["counters"];
  m.counters.steps = c.value("steps", std::int64_t{0});
  m.counters.updates = c.value("updates", std::int64_t{0});
  m.counters.schedule_k = c.value("schedule_k", std::int64_t{0});
  optim::LossScaler::State s;
  s.scale = c.value("loss_scale", 1.0);
  s.iteration = c.value("scaler_iteration", std::int64_t{0});
  s.last_overflow_iteration = c.value("scaler_last_overflow", std::int64_t{-1});
  s.hysteresis_left = c.value("scaler_hysteresis_left", 1);
  ZINF_RETURN_IF_ERROR(m.scaler->restore(s).with_context(folder));
  m.sync_scaler_counters();
  ZINF_RETURN_IF_ERROR(m.publish_params());
  m.coordinator->invalidate_gathered();
  return j.value("client_state", std::string());
}

struct CheckpointReader::Impl {
  std::string folder;
  std::string model_json;
  ModelLayout model;
  SavedLayout saved;
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
  const auto j = nlohmann::json::parse(text, nullptr, false);
  ZINF_RETURN_IF_ERROR(check_format(j, folder));
  ZINF_ASSIGN_OR_RETURN(ModelLayout model, saved_model_layout(j, folder));
  ZINF_ASSIGN_OR_RETURN(SavedLayout saved, saved_layout(model, j, folder));
  for (int r = 0; r < saved.plan.world_size(); ++r) ZINF_RETURN_IF_ERROR(verify_rank_file(j, folder, r));
  auto impl = std::make_unique<Impl>(
      Impl{folder, normalized_model_json(j["model"]).dump(), std::move(model), std::move(saved)});
  return CheckpointReader(std::move(impl));
}

const std::string& CheckpointReader::folder() const { return impl_->folder; }
const std::string& CheckpointReader::model_config_json() const { return impl_->model_json; }
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
