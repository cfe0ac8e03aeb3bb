// Internal: a checkpoint folder's names and rules: the one tag rule, `latest`, the rank files,
// and the save's folder sequence (lock, temporary folder, renames, then `latest`).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "common/file_io.h"
#include "zinf/status.h"

namespace zinf::zero3::detail {

// A checkpoint tag must name a folder directly inside the checkpoint folder: non-empty, at most
// kMaxTagLength bytes, no '/', not "." or "..", no NUL or control characters, not "latest" and not
// ending in ".tmp" or ".old" (the save's own temporary names). InvalidArgument naming `where`.
// The one check for tags given to save, given to load, and read from `latest`.
Status check_checkpoint_tag(std::string_view tag, std::string_view where);

// The tag in the text of `dir`/latest (trailing whitespace dropped), checked with
// check_checkpoint_tag; Corruption naming the file otherwise. No I/O.
Result<std::string> parse_latest_tag(std::string_view text, const std::string& dir);

// <folder>/rank<rank>.state
std::string rank_file(const std::string& folder, int rank);
// <dir>/<tag>.tmp, where a save writes before it renames the folder into place.
std::string tmp_tag_folder(const std::string& dir, const std::string& tag);

// <dir>/.zinf_save.lock, taken at once or refused at once: whoever changes which checkpoint
// folders `dir` holds (a save, the removal of old ones) holds it.
Result<fileio::FileLock> lock_save_folder(const std::string& dir);

// The writing rank's first part of a save into `dir`: creates it (0700), takes
// <dir>/.zinf_save.lock into *lock for the save's life (a second save into the folder is refused
// at once), removes what a killed save left, puts back a <tag>.old that is the only copy of
// `tag`, and creates tmp_tag_folder(dir, tag).
Status prepare_save_folder(const std::string& dir, const std::string& tag, std::optional<fileio::FileLock>* lock);

// The writing rank's last part: moves tmp_tag_folder(dir, tag) into place as <dir>/<tag> (an
// older folder of that tag goes only after that succeeded), then writes `latest`.
Status install_tag_folder(const std::string& dir, const std::string& tag);

// The writing rank's guard over tmp_tag_folder(dir, tag): removes it (and what the ranks wrote
// into it) when destroyed, so a save that fails part way (a full disk, say) leaves no temporary
// folder behind; after install_tag_folder there is none left to remove. Declare it after the save
// lock, so that it runs while the lock is still held. An empty folder name guards nothing.
class TmpFolderGuard {
 public:
  explicit TmpFolderGuard(std::string folder) : folder_(std::move(folder)) {}
  ~TmpFolderGuard();
  TmpFolderGuard(const TmpFolderGuard&) = delete;
  TmpFolderGuard& operator=(const TmpFolderGuard&) = delete;

 private:
  std::string folder_;
};

// Test-only (ZINF_TEST_SLOW_SAVE_MS=<ms>): announce each phase of a save on stderr and pause
// there, so that the kill tests can stop a process inside a save. Unset: nothing happens.
void save_phase(const char* phase);

}  // namespace zinf::zero3::detail
