// Checkpoint folders: the one tag rule, `latest`, the rank files, and the save's folder sequence.
#include "zero3/checkpoint_folder.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "zero3/file_util.h"
#include "zinf/log.h"
#include "zinf/zero3/checkpoint.h"

namespace zinf::zero3 {
namespace {

// Checkpoint folders are private (0700), as their files are (0600).
Status make_dir(const std::string& path) { return fileio::make_dir(path, fileio::kPrivateDirMode); }

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

Status check_checkpoint_tag(std::string_view tag, std::string_view where) {
  const auto bad = [&](std::string_view why) {
    return Status::invalid_argument(fmt::format("{}: checkpoint tag '{}': {}; a tag names a folder directly inside "
                                                "the checkpoint folder",
                                                where, tag.size() > 80 ? std::string(tag.substr(0, 77)) + "..." : std::string(tag),
                                                why));
  };
  if (tag.empty()) return bad("empty");
  if (tag.size() > kMaxTagLength) {
    return bad(fmt::format("{} bytes, more than the {} zinf accepts (a save adds \".tmp\" or \".old\" to it, and a file "
                           "name has at most 255)", tag.size(), kMaxTagLength));
  }
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

std::string rank_file(const std::string& folder, int rank) { return fmt::format("{}/rank{}.state", folder, rank); }

std::string tmp_tag_folder(const std::string& dir, const std::string& tag) { return fmt::format("{}/{}.tmp", dir, tag); }

Result<fileio::FileLock> lock_save_folder(const std::string& dir) {
  return fileio::FileLock::acquire(dir + "/.zinf_save.lock", fmt::format("checkpoint folder {}", dir));
}

Status prepare_save_folder(const std::string& dir, const std::string& tag, std::optional<fileio::FileLock>* lock) {
  const std::string final_dir = dir + "/" + tag;
  ZINF_RETURN_IF_ERROR(make_dir(dir));
  ZINF_ASSIGN_OR_RETURN(*lock, lock_save_folder(dir));
  remove_stale_temporaries(dir);
  // A re-save of this tag that was cut off between its renames left only <tag>.old: put it
  // back first, so that removing <tag>.old below never loses the only copy `latest` names.
  const std::string old_dir = final_dir + ".old";
  if (!is_folder(final_dir) && is_folder(old_dir)) ZINF_RETURN_IF_ERROR(fileio::rename_path(old_dir, final_dir));
  return make_dir(tmp_tag_folder(dir, tag));
}

Status install_tag_folder(const std::string& dir, const std::string& tag) {
  const std::string final_dir = dir + "/" + tag;
  const std::string tmp_dir = tmp_tag_folder(dir, tag);
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
  return Status::ok();
}

TmpFolderGuard::~TmpFolderGuard() {
  if (folder_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(folder_, ec);
}

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

}  // namespace detail

Status check_tag_name(const std::string& tag) { return detail::check_checkpoint_tag(tag, "checkpoint"); }

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
  auto folder = checkpoint_tag_folder(dir, tag);
  if (!folder.is_ok()) return Status::corruption(fmt::format("{}/latest names '{}': {}", dir, tag, folder.status().message()));
  return tag;
}

}  // namespace zinf::zero3
