// zinf CLI: the built-in ds_config used when `zinf train` gets no --config.
#pragma once

#include <string>

namespace zinf::cli {

// ZeRO-3 with parameters and optimizer state offloaded to NVMe under `nvme_path`, bf16,
// AdamW with a short warmup: a small end-to-end ZeRO-Infinity run on any machine.
std::string default_ds_config(const std::string& nvme_path);

}  // namespace zinf::cli
