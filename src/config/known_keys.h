// Internal: keys the reference (DeepSpeed) knows but zinf does not implement, per config level.
//
// Such keys are accepted and named in one warning; only keys that appear neither here nor among
// the keys zinf reads are errors. Sources: DeepSpeed's runtime/config.py, constants.py,
// zero/config.py, zero/offload_config.py, swap_tensor/constants.py, precision_config.py,
// model_checkpointing/constants.py and the config-json documentation page.
#pragma once

#include <span>
#include <string_view>

namespace zinf::config::detail {

std::span<const std::string_view> ignored_top_level_keys();
std::span<const std::string_view> ignored_zero_keys();
std::span<const std::string_view> ignored_offload_optimizer_keys();
std::span<const std::string_view> ignored_aio_keys();
std::span<const std::string_view> ignored_fp16_keys();
std::span<const std::string_view> ignored_bf16_keys();
std::span<const std::string_view> ignored_checkpoint_keys();
std::span<const std::string_view> ignored_optimizer_keys();  // beside type and params

}  // namespace zinf::config::detail
