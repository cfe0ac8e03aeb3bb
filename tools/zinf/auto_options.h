// zinf CLI: the options that fill ds_config "auto" values (shared by train and config check).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "zinf/config/ds_config.h"
#include "zinf/status.h"

namespace zinf::cli {

struct AutoOptions {
  std::optional<double> lr, eps, weight_decay, clip;
  std::optional<std::int64_t> micro_batch, grad_accum, train_batch, warmup_steps, total_steps, world_size;
  std::vector<double> betas;
  std::string precision;
  bool strict_auto = false;  // --strict-auto: an "auto" no option fills is an error, not the Trainer's default

  // Adds the options with the spellings config error messages name (config::cli_option).
  void add_to(CLI::App& cmd);
  // An AutoContext from the options; hidden_size is the model's (if known).
  Result<config::AutoContext> context(std::optional<std::int64_t> hidden_size) const;
};

}  // namespace zinf::cli
