// Checkpoints: per-rank fp32 master and optimizer state plus engine counters, saved atomically
// (temporary folder, fsync, rename, then `latest`), verified by checksums on load.
//
// Layout of <dir>:
//   latest                       the newest complete tag (written last)
//   <tag>/engine.json            format, model, precision, layout fingerprint, world size,
//                                counters, loss scaler, per-rank file sizes and checksums,
//                                and the caller's client_state
//   <tag>/rank<r>.state          for each sub-group, for each array in (master, state 0, ...):
//                                that sub-group's padded fp32 array, back to back
// With checkpoint.use_node_local_storage each node's first rank writes engine.json and `latest`
// into its own <dir>, which holds only that node's rank files; otherwise rank 0 does, once.
//
// Loading re-partitions: every array is elementwise, so a rank's new slice of each partition
// group is read from the saved ranks whose old slices overlap it. The same world size and
// sub_group_size read each rank's own file; another world size (or sub_group_size) reads pieces
// of several.
#include <algorithm>
#include <array>
#include <filesystem>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/checksum.h"
#include "zero3/checkpoint_folder.h"
#include "zero3/checkpoint_format.h"
#include "zero3/checkpoint_state.h"
#include "zero3/file_util.h"
#include "zinf/log.h"
#include "zinf/zero3/checkpoint.h"
#include "zinf/zero3/safetensors.h"

namespace zinf::zero3 {
namespace {

using detail::EngineJson;
using detail::kChecksumAlgo;
using detail::ModelLayout;
using detail::SavedLayout;
using detail::SavedRankFile;

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
  const std::string path = detail::rank_file(folder, r);
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
  // Format 2 recorded the top 53 bits.
  const std::uint64_t got = e.format == 2 ? sum.value() >> 11 : sum.value();
  if (got != info.checksum) {
    return Status::corruption(fmt::format("{}: checksum mismatch ({}); the file is damaged", path, kChecksumAlgo));
  }
  return Status::ok();
}

}  // namespace

namespace detail {

Status save_checkpoint(const CheckpointState& m, const std::string& dir, const std::string& tag,
                       const std::string& client_state) {
  ZINF_RETURN_IF_ERROR(check_tag_name(tag).with_context(fmt::format("checkpoint save into {}", dir)));
  const int rank = m.comm.rank();
  const std::string tmp_dir = detail::tmp_tag_folder(dir, tag);
  // Who writes the shared files: rank 0, or each node's first rank for node-local storage.
  const bool writer = m.node_local_storage ? m.comm.local_rank() == 0 : rank == 0;
  // The writer holds <dir>/.zinf_save.lock until the save is over (see prepare_save_folder).
  std::optional<fileio::FileLock> save_lock;
  const Status prepared = writer ? detail::prepare_save_folder(dir, tag, &save_lock) : Status::ok();
  // A save that fails from here on leaves no <tag>.tmp behind (the writer removes it).
  const detail::TmpFolderGuard remove_tmp(writer && prepared.is_ok() ? tmp_dir : std::string());
  // Every rank learns whether the folder is ready (a refused writer must not leave the others waiting).
  std::array<std::uint64_t, 1> not_ready = {prepared.is_ok() ? 0u : 1u};
  ZINF_RETURN_IF_ERROR(m.comm.all_reduce_sum_u64(not_ready));
  ZINF_RETURN_IF_ERROR(prepared);
  if (not_ready[0] > 0) {
    return Status::aborted(fmt::format("checkpoint save into {}: the writing rank could not prepare the folder", dir));
  }
  // This rank's state, streamed sub-group by sub-group.
  ZINF_ASSIGN_OR_RETURN(AtomicFile file, AtomicFile::create(detail::rank_file(tmp_dir, rank)));
  Checksum64 sum;
  std::uint64_t bytes = 0;
  std::vector<float> buf;
  const std::size_t arrays = 1 + m.optimizer.optimizer().state_count();
  for (std::size_t sg = 0; sg < m.layout.subgroups.size(); ++sg) {
    buf.resize(m.layout.subgroups[sg].numel);
    for (std::size_t position = 0; position < arrays; ++position) {
      ZINF_RETURN_IF_ERROR(m.optimizer.read_state(sg, StateArray::at_position(position), buf));
      ZINF_RETURN_IF_ERROR(file.append(buf.data(), buf.size() * sizeof(float)));
      sum.add(buf.data(), buf.size() * sizeof(float));
      bytes += buf.size() * sizeof(float);
    }
  }
  ZINF_RETURN_IF_ERROR(file.commit());
  detail::save_phase("rank file written");
  // Every rank's size and checksum reach rank 0 for engine.json.
  const std::array<std::uint64_t, 2> mine = {bytes, sum.value()};
  std::vector<std::uint64_t> sizes(static_cast<std::size_t>(m.comm.world_size()) * mine.size());
  ZINF_RETURN_IF_ERROR(m.comm.all_gather_u64(mine, sizes));
  if (writer) {
    detail::SaveRecord record{tag,
                              std::string(swap::dtype_name(m.precision)),
                              std::string(m.optimizer.optimizer().config().name()),
                              &m.layout,
                              m.comm.world_size(),
                              m.node_local_storage,
                              arrays,
                              m.counters,
                              {},
                              client_state};
    for (int r = 0; r < m.comm.world_size(); ++r) {
      record.ranks.push_back(SavedRankFile{sizes[static_cast<std::size_t>(r) * 2], sizes[static_cast<std::size_t>(r) * 2 + 1]});
    }
    ZINF_RETURN_IF_ERROR(write_file_atomic(tmp_dir + "/engine.json", detail::engine_json_text(m.model, record)));
    ZINF_RETURN_IF_ERROR(sync_dir(tmp_dir));
    detail::save_phase("engine.json written");
    ZINF_RETURN_IF_ERROR(detail::install_tag_folder(dir, tag));
  }
  return m.comm.barrier();
}

Result<std::string> load_checkpoint(const CheckpointState& m, const std::string& dir, const std::string& requested_tag) {
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
  const nlohmann::json now_model = detail::model_json(m.model);
  if (e.model != now_model) return mismatch("model", e.model.dump(), now_model.dump());
  const ModelLayout& saved_model = e.model_layout;
  ZINF_RETURN_IF_ERROR(check_same_params(saved_model, m.model, folder));
  if (e.precision != swap::dtype_name(m.precision)) {
    return mismatch("precision", e.precision, std::string(swap::dtype_name(m.precision)));
  }
  if (e.optimizer != m.optimizer.optimizer().config().name()) {
    return mismatch("optimizer", e.optimizer, std::string(m.optimizer.optimizer().config().name()));
  }
  const SavedLayout& saved = e.saved;
  const std::size_t arrays = 1 + m.optimizer.optimizer().state_count();
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
    for (std::size_t position = 0; position < arrays; ++position) {
      std::fill(buf.begin(), buf.end(), 0.0f);
      for (std::size_t g = m.layout.subgroups[sg].first_param;
           g < m.layout.subgroups[sg].first_param + m.layout.subgroups[sg].param_count; ++g) {
        const ElementRange mine = m.plan.owned_in_group(g, rank);
        for (int q = 0; q < old_world; ++q) {
          const ElementRange theirs = saved.plan.owned_in_group(g, q);
          const std::size_t lo = std::max(mine.begin, theirs.begin), hi = std::min(mine.end, theirs.end);
          if (lo >= hi) continue;
          float* to = buf.data() + m.layout.offset_in_subgroup[g] + (lo - mine.begin);
          ZINF_RETURN_IF_ERROR(read_exact(detail::rank_file(folder, q), saved.element_offset(g, position, lo - theirs.begin), to,
                                          (hi - lo) * sizeof(float)));
        }
      }
      ZINF_RETURN_IF_ERROR(m.optimizer.load_state(sg, StateArray::at_position(position), buf).with_context(folder));
    }
  }
  if (old_world != m.comm.world_size() || saved.layout.fingerprint() != m.layout.fingerprint()) {
    log(LogLevel::kInfo, fmt::format("{}: re-partitioned from {} to {} ranks ({} -> {})", folder, old_world,
                                     m.comm.world_size(), saved.layout.fingerprint(), m.layout.fingerprint()));
  }
  ZINF_RETURN_IF_ERROR(m.restore(e.counters).with_context(folder));
  return e.client_state;
}

}  // namespace detail

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
        read_exact(detail::rank_file(m.folder, r), at, out.data() + range.begin, range.size() * sizeof(float)));
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
