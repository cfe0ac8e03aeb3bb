// --save-keep: the newest step checkpoints of a folder stay, older ones go (checkpoint_keep.h).
#include "zinf/zero3/checkpoint_keep.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "zero3/checkpoint_folder.h"
#include "zinf/zero3/checkpoint.h"

namespace zinf::zero3 {
namespace {

constexpr std::string_view kStepPrefix = "global_step";

}  // namespace

std::string step_tag(std::int64_t step) { return fmt::format("{}{}", kStepPrefix, step); }

std::optional<std::int64_t> step_of_tag(const std::string& tag) {
  if (!tag.starts_with(kStepPrefix) || tag.size() == kStepPrefix.size()) return std::nullopt;
  std::int64_t step = 0;
  const char* first = tag.data() + kStepPrefix.size();
  const char* last = tag.data() + tag.size();
  if (*first < '0' || *first > '9') return std::nullopt;  // from_chars would take a '-'
  const auto [end, ec] = std::from_chars(first, last, step);
  if (ec != std::errc() || end != last) return std::nullopt;
  return step;
}

std::vector<StepCheckpoint> list_step_checkpoints(const std::string& dir) {
  std::vector<StepCheckpoint> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const std::optional<std::int64_t> step = step_of_tag(name);
    std::error_code e2;
    if (!step || !entry.is_directory(e2) || entry.is_symlink(e2)) continue;
    if (!std::filesystem::exists(entry.path() / "engine.json", e2)) continue;  // not a complete save
    out.push_back(StepCheckpoint{name, *step});
  }
  std::sort(out.begin(), out.end(), [](const StepCheckpoint& a, const StepCheckpoint& b) { return a.step < b.step; });
  return out;
}

Result<std::vector<std::string>> keep_newest_checkpoints(const std::string& dir, std::size_t keep) {
  if (keep == 0) return Status::invalid_argument("--save-keep must keep at least one checkpoint");
  ZINF_ASSIGN_OR_RETURN(fileio::FileLock lock, detail::lock_save_folder(dir));
  auto latest = read_latest_tag(dir);
  if (!latest.is_ok()) return latest.status().with_context(fmt::format("--save-keep {}: nothing removed", keep));
  const std::vector<StepCheckpoint> all = list_step_checkpoints(dir);
  // The newest `keep`, `latest` among them whether or not it is one of the newest.
  std::size_t kept = 0;
  std::vector<std::string> removed;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (kept < keep) {
      ++kept;
      continue;
    }
    if (it->tag == latest.value()) continue;  // older than the newest `keep`, and still never removed
    const std::string folder = dir + "/" + it->tag;
    const std::string doomed = detail::tmp_tag_folder(dir, it->tag);
    std::error_code ec;
    std::filesystem::remove_all(doomed, ec);
    ZINF_RETURN_IF_ERROR(fileio::rename_path(folder, doomed).with_context("--save-keep"));
    std::filesystem::remove_all(doomed, ec);
    if (ec) return Status::sys_error(fmt::format("--save-keep: remove {}", doomed), ec.value());
    removed.push_back(it->tag);
  }
  return removed;
}

}  // namespace zinf::zero3
