// `zinf config check FILE [model options]`: validate a ds_config.json and print it resolved.
#include <iostream>
#include <memory>

#include "auto_options.h"
#include "commands.h"
#include "model_options.h"
#include "zinf/config/config_check.h"

namespace zinf::cli {

void add_config_command(CLI::App& app, int* exit_code) {
  auto* config = app.add_subcommand("config", "work with ds_config.json files");
  config->require_subcommand(1);
  auto* check = config->add_subcommand(
      "check", "validate FILE; print the resolved config (exit 0) or the error (exit 2)");
  struct Opts {
    std::string file;
    ModelOptions model;
    AutoOptions autos;
    std::optional<std::int64_t> steps;
  };
  auto o = std::make_shared<Opts>();
  check->add_option("FILE", o->file, "the ds_config.json")->required();
  o->model.add_to(*check, "", "256");
  o->autos.add_to(*check);
  check->add_option("--steps", o->steps,
                    "the run's length, as zinf train --steps (default 50, train's): fills an \"auto\" "
                    "total_num_steps when --total-steps is not given, as zinf train does")
      ->check(CLI::PositiveNumber);
  check->callback([o, exit_code] {
    std::optional<std::int64_t> hidden;
    if (o->model.given()) {
      auto m = o->model.resolve(256);
      if (!m.is_ok()) {
        std::cerr << "error: " << m.status().message() << "\n";
        *exit_code = config::kConfigCheckInvalid;
        return;
      }
      hidden = m->n_embd;
    }
    auto ctx = o->autos.context(hidden);
    if (!ctx.is_ok()) {
      std::cerr << "error: " << ctx.status().message() << "\n";
      *exit_code = config::kConfigCheckInvalid;
      return;
    }
    // What zinf train resolves: its --steps, or its default, fills an "auto" total_num_steps.
    ctx->run_steps = o->steps.value_or(kTrainDefaultSteps);
    *exit_code = config::run_config_check(o->file, ctx.value(), std::cout, std::cerr);
  });
}

}  // namespace zinf::cli
