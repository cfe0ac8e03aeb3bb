// zinf CLI subcommands: each registers its options on a CLI11 subcommand and runs after parsing.
#pragma once

#include <CLI/CLI.hpp>

namespace zinf::cli {

// Each returns the process exit status through *exit_code when its subcommand ran.
void add_estimate_command(CLI::App& app, int* exit_code);
void add_config_command(CLI::App& app, int* exit_code);
void add_train_command(CLI::App& app, int* exit_code);
void add_consolidate_command(CLI::App& app, int* exit_code);
void add_eval_command(CLI::App& app, int* exit_code);

}  // namespace zinf::cli
