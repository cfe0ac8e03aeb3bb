// zinf CLI subcommands: each registers its options on a CLI11 subcommand and runs after parsing.
#pragma once

#include <CLI/CLI.hpp>

namespace zinf::cli {

// zinf train's --steps when not given; `zinf config check` resolves an "auto" total_num_steps
// with it too, so that a config that trains also checks.
inline constexpr int kTrainDefaultSteps = 50;

// Each returns the process exit status through *exit_code when its subcommand ran.
void add_estimate_command(CLI::App& app, int* exit_code);
void add_config_command(CLI::App& app, int* exit_code);
void add_train_command(CLI::App& app, int* exit_code);
void add_consolidate_command(CLI::App& app, int* exit_code);
void add_eval_command(CLI::App& app, int* exit_code);
void add_plan_command(CLI::App& app, int* exit_code);

}  // namespace zinf::cli
