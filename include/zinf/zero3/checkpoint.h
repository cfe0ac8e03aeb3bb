// Checkpoint tools that need no running engine: consolidation into full fp32 weights.
#pragma once

#include <string>

#include "zinf/status.h"

namespace zinf::zero3 {

// Rebuilds every parameter's full fp32 value from a checkpoint's per-rank master partitions
// (each parameter's ceil(n/W) slices concatenated across ranks and cut to n) and writes them
// as a safetensors file (atomically). `checkpoint` is a folder holding `latest`, or one tag's
// folder. Errors name the file and what is wrong with it.
Status consolidate_checkpoint(const std::string& checkpoint, const std::string& out_path);

}  // namespace zinf::zero3
