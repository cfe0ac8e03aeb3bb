// `zinf estimate`: the model-state memory table (reference-semantics §10) for every offload option.
#include <algorithm>
#include <iostream>
#include <memory>

#include "commands.h"
#include "model_options.h"
#include "zinf/model/gpt.h"
#include "zinf/zero3/estimate.h"

namespace zinf::cli {

void add_estimate_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("estimate", "memory needed for params, gradients and optimizer states");
  struct Opts {
    ModelOptions model;
    int gpus_per_node = 1;
    int nodes = 1;
    double buffer_factor = 1.5;
  };
  auto o = std::make_shared<Opts>();
  o->model.add_to(*cmd, "gpt2", "50257, GPT-2's; zinf train takes the data's, 256 for its built-in corpus");
  cmd->add_option("--gpus-per-node", o->gpus_per_node, "GPUs (ranks) per node")->check(CLI::PositiveNumber);
  cmd->add_option("--nodes", o->nodes, "nodes")->check(CLI::PositiveNumber);
  cmd->add_option("--buffer-factor", o->buffer_factor, "headroom factor")->check(CLI::PositiveNumber);
  cmd->callback([o, exit_code] {
    auto config = o->model.resolve(50257);
    if (!config.is_ok()) {
      std::cerr << "zinf estimate: " << config.status().message() << "\n";
      *exit_code = 2;
      return;
    }
    // The model only describes itself here: no parameters or activations are allocated.
    auto gpt = model::GptModel::create(config.value());
    if (!gpt.is_ok()) {
      std::cerr << "zinf estimate: " << gpt.status().message() << "\n";
      *exit_code = 2;
      return;
    }
    std::uint64_t largest = 0;
    for (const model::ModuleSpec& m : (*gpt)->modules()) {
      std::uint64_t n = 0;
      for (int p : m.params) n += (*gpt)->params()[static_cast<std::size_t>(p)].numel;
      largest = std::max(largest, n);
    }
    zero3::EstimateInput in{(*gpt)->num_params(), largest, o->gpus_per_node, o->nodes, o->buffer_factor};
    std::cout << zero3::format_estimate(in, zero3::estimate_model_states(in));
    *exit_code = 0;
  });
}

}  // namespace zinf::cli
