// Checkpoint tools that need no running engine: a checkpoint's model and full fp32 weights
// (CheckpointReader), and consolidation into one safetensors file.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "zinf/model/params.h"
#include "zinf/status.h"

namespace zinf::zero3 {

// The longest tag zinf accepts (a folder name, with room for the ".tmp" and ".old" of a save).
inline constexpr std::size_t kMaxTagLength = 200;

// Whether `tag` may name a checkpoint folder: not empty, at most kMaxTagLength bytes, no '/' and no
// control character (NUL included), not "." or "..", not "latest", not ending in ".tmp" or ".old"
// (a save's temporaries). InvalidArgument naming the tag and the rule otherwise. The one rule for
// tags given to a save or a load and read from `latest`.
Status check_tag_name(const std::string& tag);

// The folder that holds checkpoint `tag` of `dir`: <dir>/<tag>, or <dir>/<tag>.old when a re-save of
// that tag was cut off between moving the old folder aside and moving the new one in (the old
// folder is complete: it was <dir>/<tag> until then). NotFound when neither is a folder.
Result<std::string> checkpoint_tag_folder(const std::string& dir, const std::string& tag);

// The tag `<dir>/latest` names, checked with check_tag_name and checkpoint_tag_folder: never a
// path outside `dir`, never a folder that does not exist. Every reader of `latest` uses this
// (Engine::load_checkpoint, CheckpointReader::open, the CLI's resume). Errors name `dir`.
Result<std::string> read_latest_tag(const std::string& dir);

// Reads a checkpoint without an engine: what the model said of itself (config_json(), the
// parameter and module lists) and each parameter's full fp32 master value, gathered from the
// per-rank files of any world size. open() verifies every rank file's size and checksum first;
// errors name the file and what is wrong with it. Needs no code of the model that saved it.
class CheckpointReader {
 public:
  // `checkpoint` is a folder holding `latest`, or one tag's folder.
  static Result<CheckpointReader> open(const std::string& checkpoint);
  CheckpointReader(CheckpointReader&&) noexcept;
  CheckpointReader& operator=(CheckpointReader&&) noexcept;
  ~CheckpointReader();

  const std::string& folder() const;             // the tag's folder that was opened
  const std::string& model_config_json() const;  // {"type": ..., ...} (a GPT's "type" filled in)
  const std::string& client_state() const;       // what the saver passed to save_checkpoint (may be empty)
  std::span<const model::ParamSpec> params() const;
  std::span<const model::ModuleSpec> modules() const;
  // Parameter `index`'s full value (params()[index].numel elements).
  Status read_param(std::size_t index, std::span<float> out) const;

 private:
  struct Impl;
  explicit CheckpointReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Rebuilds every parameter's full fp32 value from a checkpoint's per-rank master partitions
// (each parameter's ceil(n/W) slices concatenated across ranks and cut to n) and writes them
// as a safetensors file (atomically). `checkpoint` is a folder holding `latest`, or one tag's
// folder. Errors name the file and what is wrong with it.
Status consolidate_checkpoint(const std::string& checkpoint, const std::string& out_path);

}  // namespace zinf::zero3
