// zinf CLI "auto" options: command-line values that resolve ds_config "auto" keys.
#include "auto_options.h"

#include <fmt/format.h>

namespace zinf::cli {

void AutoOptions::add_to(CLI::App& cmd) {
  namespace opt = config::cli_option;
  cmd.add_option(std::string(opt::kLr), lr, "learning rate (optimizer lr, scheduler warmup_max_lr)");
  cmd.add_option(std::string(opt::kBetas), betas, "Adam betas B1,B2")->delimiter(',')->expected(2);
  cmd.add_option(std::string(opt::kEps), eps, "optimizer eps");
  cmd.add_option(std::string(opt::kWeightDecay), weight_decay, "optimizer weight_decay");
  cmd.add_option(std::string(opt::kMicroBatch), micro_batch, "train_micro_batch_size_per_gpu");
  cmd.add_option(std::string(opt::kGradAccum), grad_accum, "gradient_accumulation_steps");
  cmd.add_option(std::string(opt::kTrainBatch), train_batch, "train_batch_size");
  cmd.add_option(std::string(opt::kWarmupSteps), warmup_steps, "scheduler warmup_num_steps");
  cmd.add_option(std::string(opt::kTotalSteps), total_steps, "scheduler total_num_steps (the schedule's length)");
  cmd.add_option(std::string(opt::kClip), clip, "gradient_clipping");
  cmd.add_option(std::string(opt::kPrecision), precision, "fp32, fp16 or bf16")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  cmd.add_option(std::string(opt::kWorldSize), world_size, "data-parallel ranks (default: 1, or the MPI world)");
  cmd.add_flag("--strict-auto", strict_auto,
               "an \"auto\" no option fills is an error naming the option (default: the Hugging Face Trainer's "
               "default, noted)");
}

Result<config::AutoContext> AutoOptions::context(std::optional<std::int64_t> hidden_size) const {
  config::AutoContext ctx;
  ctx.trainer_defaults = !strict_auto;
  ctx.hidden_size = hidden_size;
  if (world_size) {
    if (*world_size < 1) return Status::invalid_argument(fmt::format("--world-size {}: must be at least 1", *world_size));
    ctx.world_size = *world_size;
  }
  ctx.lr = lr;
  ctx.eps = eps;
  ctx.weight_decay = weight_decay;
  ctx.micro_batch = micro_batch;
  ctx.grad_accum = grad_accum;
  ctx.train_batch = train_batch;
  ctx.warmup_steps = warmup_steps;
  ctx.total_steps = total_steps;
  ctx.gradient_clipping = clip;
  if (!betas.empty()) ctx.betas = std::array<double, 2>{betas[0], betas[1]};
  if (precision == "fp32") ctx.precision = config::Precision::kFp32;
  if (precision == "fp16") ctx.precision = config::Precision::kFp16;
  if (precision == "bf16") ctx.precision = config::Precision::kBf16;
  return ctx;
}

}  // namespace zinf::cli
