// `zinf config check FILE [model options]`: validate a ds_config.json and print it resolved.
#include <iostream>
#include <memory>

#include "commands.h"
#include "model_options.h"
#include "zinf/config/config_check.h"

namespace zinf::cli {

void add_config_command(CLI::App& app, int* exit_code) {
  auto* config = app.add_subcommand("config", "work with ds_config.json files");
  config->require_subcommand(1);
  auto* check = config->add_subcommand("check", "validate FILE; print the resolved config (exit 0) or the error (exit 2)");
  struct Opts {
    std::string file;
    ModelOptions model;
    config::AutoContext ctx;
    std::optional<double> lr, clip, weight_decay;
    std::optional<std::int64_t> micro_batch, grad_accum, train_batch, warmup, total_steps, world_size;
  };
  auto o = std::make_shared<Opts>();
  check->add_option("FILE", o->file, "the ds_config.json")->required();
  o->model.add_to(*check, "");
  check->add_option("--lr", o->lr, "learning rate for \"auto\"");
  check->add_option("--micro-batch", o->micro_batch, "train_micro_batch_size_per_gpu for \"auto\"");
  check->add_option("--grad-accum", o->grad_accum, "gradient_accumulation_steps for \"auto\"");
  check->add_option("--train-batch", o->train_batch, "train_batch_size for \"auto\"");
  check->add_option("--warmup-steps", o->warmup, "scheduler warmup_num_steps for \"auto\"");
  check->add_option("--total-steps", o->total_steps, "scheduler total_num_steps for \"auto\"");
  check->add_option("--clip", o->clip, "gradient_clipping for \"auto\"");
  check->add_option("--weight-decay", o->weight_decay, "optimizer weight_decay for \"auto\"");
  check->add_option("--world-size", o->world_size, "data-parallel ranks (default 1)");
  check->callback([o, exit_code] {
    config::AutoContext ctx;
    if (o->model.given()) {
      auto m = o->model.resolve(256);
      if (!m.is_ok()) {
        std::cerr << "error: " << m.status().message() << "\n";
        *exit_code = config::kConfigCheckInvalid;
        return;
      }
      ctx.hidden_size = m->n_embd;
    }
    if (o->world_size) ctx.world_size = *o->world_size;
    ctx.lr = o->lr;
    ctx.micro_batch = o->micro_batch;
    ctx.grad_accum = o->grad_accum;
    ctx.train_batch = o->train_batch;
    ctx.warmup_steps = o->warmup;
    ctx.total_steps = o->total_steps;
    ctx.gradient_clipping = o->clip;
    ctx.weight_decay = o->weight_decay;
    *exit_code = config::run_config_check(o->file, ctx, std::cout, std::cerr);
  });
}

}  // namespace zinf::cli
