// How many checkpoints a folder keeps: `zinf train --save-keep N` (the HF Trainer's
// save_total_limit) removes the oldest step checkpoints after each save, never the one `latest`
// names, so that periodic saves do not fill the disk.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zinf/status.h"

namespace zinf::zero3 {

// A step checkpoint: a folder "global_step<N>" of the checkpoint folder that holds engine.json
// (a complete save). Folders with other names are the user's and never counted or removed.
struct StepCheckpoint {
  std::string tag;
  std::int64_t step = 0;
};

// The tag zinf train gives the checkpoint of optimizer step `step`, and its inverse (nullopt
// for any other name).
std::string step_tag(std::int64_t step);
std::optional<std::int64_t> step_of_tag(const std::string& tag);

// The step checkpoints in `dir`, oldest (smallest N) first; none when `dir` does not exist.
std::vector<StepCheckpoint> list_step_checkpoints(const std::string& dir);

// Removes the oldest step checkpoints of `dir` until at most `keep` (>= 1) remain besides the one
// `latest` names, which is never removed (it counts among the `keep` when it is a step
// checkpoint). Holds the folder's save lock meanwhile; each folder is first renamed to
// "<tag>.tmp", so one cut off part way is cleared by the next save. When `latest` cannot be
// read nothing is removed and that error is returned. Returns the removed tags.
Result<std::vector<std::string>> keep_newest_checkpoints(const std::string& dir, std::size_t keep);

}  // namespace zinf::zero3
