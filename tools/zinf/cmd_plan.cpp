// `zinf plan`: the fastest ds_config that fits a model on this machine, and its predicted speed.
#include <algorithm>
#include <cctype>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "auto_options.h"
#include "commands.h"
#include "default_config.h"
#include "device_choice.h"
#include "model_options.h"
#include "plan_cli.h"
#include "zinf/model/gpt.h"
#include "zinf/zero3/hf_folder.h"

namespace zinf::cli {
namespace {

std::string gib(std::uint64_t b) { return fmt::format("{:.2f}", static_cast<double>(b) / (1u << 30)); }

std::string roof_line(const char* what, const zero3::Roof& r, const char* unit) {
  return fmt::format("  {:<14} {:>8.2f} {:<8} {}\n", what, r.value, unit, r.source);
}

nlohmann::json candidate_json(const zero3::Candidate& c) {
  nlohmann::json memory = nlohmann::json::array();
  for (const zero3::MemoryTerm& t : c.memory.host) memory.push_back({{"name", t.name}, {"bytes", t.bytes}, {"pinned", t.pinned}});
  nlohmann::json gpu_memory = nlohmann::json::array();
  for (const zero3::MemoryTerm& t : c.memory.gpu_terms) gpu_memory.push_back({{"name", t.name}, {"bytes", t.bytes}});
  return {{"label", c.label()},
          {"compute", c.on_gpu ? "cuda" : "cpu"},
          {"fits", c.fits},
          {"why_not", c.why_not},
          {"offload_param", std::string(config::offload_device_name(c.param_device))},
          {"offload_optimizer", std::string(config::offload_device_name(c.optimizer_device))},
          {"micro_batch", c.micro_batch},
          {"gradient_accumulation_steps", c.grad_accum},
          {"activation_checkpointing", c.activation_checkpointing},
          {"sub_group_size", c.sub_group_size},
          {"stage3_max_live_parameters", c.max_live_parameters},
          {"stage3_max_reuse_distance", c.max_reuse_distance},
          {"reduce_bucket_size", c.reduce_bucket_size},
          {"host_memory_budget", c.host_memory_budget},
          {"least_host_memory_budget", c.memory.least_budget},
          {"predicted_nvme_bytes_per_step", c.nvme_bytes},
          {"gathers_per_step", c.gathers},
          {"predicted_step_s", c.step_s},
          {"predicted_tokens_per_s", c.tokens_per_s},
          {"predicted_peak_host_bytes", c.memory.host_bytes()},
          {"predicted_pinned_host_bytes", c.memory.pinned_bytes()},
          {"predicted_disk_bytes", c.memory.disk_bytes()},
          {"predicted_gpu_bytes", c.memory.gpu},
          {"bottleneck", c.bottleneck},
          {"time_terms_s",
           {{"compute", c.compute_s},
            {"gather_and_gradients", c.gather_s},
            {"host_gpu_copies", c.pcie_s},
            {"param_nvme_reads", c.param_io_s},
            {"param_nvme_exposed", c.param_io_exposed_s},
            {"gradient_nvme", c.grad_io_s},
            {"optimizer", c.optimizer_s},
            {"optimizer_nvme", c.optimizer_io_s},
            {"optimizer_nvme_exposed", c.optimizer_exposed_s}}},
          {"host_memory_terms", memory},
          {"gpu_memory_terms", gpu_memory}};
}

nlohmann::json roof_json(const zero3::Roof& r) {
  return {{"value", r.value}, {"source", r.source}, {"measured", r.measured}};
}

struct PlanOptions {
  ModelOptions model;
  AutoOptions autos;
  PlanMachineOptions machine;
  std::string model_dir;
  std::string model_config;  // an HF config.json (or its folder): the architecture without weights
  std::string device = "auto";  // --device: plan for the CPU or a GPU
  bool json = false;
  bool show_dropped = false;
  std::string write_path;
  std::string calibrate_log, calibrate_config;  // --calibrate LOG --calibrate-config CFG
  std::string predict_path;                     // --predict CFG: that config's prediction too
};

// The medians of a zinf train --json-log's forward_s + backward_s and optimizer_s, the first
// step (warm-up) dropped when there are more.
Result<std::pair<double, double>> step_breakdown(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::sys_error("--calibrate " + path, errno);
  std::vector<double> passes, optimizer;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      passes.push_back(j.at("forward_s").get<double>() + j.at("backward_s").get<double>());
      optimizer.push_back(j.at("optimizer_s").get<double>());
    } catch (const nlohmann::json::exception& e) {
      return Status::invalid_argument(fmt::format(
          "--calibrate {} line {}: expected zinf train --json-log objects with forward_s, backward_s and "
          "optimizer_s ({})",
          path, n, e.what()));
    }
  }
  if (passes.empty()) return Status::invalid_argument(fmt::format("--calibrate {}: no steps", path));
  auto median = [](std::vector<double> v) {
    if (v.size() > 1) v.erase(v.begin());
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return std::make_pair(median(passes), median(optimizer));
}

// The request's batch, ranks, precision and optimizer blocks from the train-style options, the
// share of host memory it may fill, and the GPU models' workspace sizes (zinf plan and zinf train
// --plan alike).
void set_run_shape(zero3::PlanRequest& r, const config::AutoContext& ctx, double host_fraction) {
  r.micro_batch = ctx.micro_batch;
  r.grad_accum = ctx.grad_accum;
  r.train_batch = ctx.train_batch;
  r.world_size = static_cast<int>(ctx.world_size);
  r.precision = ctx.precision.value_or(config::Precision::kBf16);
  r.host_fraction = host_fraction;
  r.optimizer_json = optimizer_blocks(ctx);
  r.gpu_workspace = gpu_workspace_bytes;
}

// The request from the options: the model (an HF folder or a preset), its window and batch.
Result<zero3::PlanRequest> plan_request(const PlanOptions& o, int* hidden) {
  zero3::PlanRequest r;
  if (!o.model_dir.empty() && !o.model_config.empty()) {
    return Status::invalid_argument("--model-dir and --model-config both give the model: use one");
  }
  if (!o.model_config.empty()) {
    ZINF_ASSIGN_OR_RETURN(r.make_model, model_from_config_option(o.model_config));
  } else if (!o.model_dir.empty()) {
    auto hf = zero3::HfFolder::open(o.model_dir);
    if (!hf.is_ok()) return hf.status().with_context("--model-dir");
    auto folder = std::make_shared<const zero3::HfFolder>(std::move(hf).value());
    r.make_model = [folder](bool recompute) { return folder->make_model(recompute); };
  } else {
    ZINF_ASSIGN_OR_RETURN(model::GptConfig gpt, o.model.resolve(50257));
    r.make_model = [gpt](bool recompute) -> Result<std::unique_ptr<model::Model>> {
      model::GptConfig c = gpt;
      c.activation_checkpointing = recompute;
      ZINF_ASSIGN_OR_RETURN(std::unique_ptr<model::GptModel> m, model::GptModel::create(c));
      return std::unique_ptr<model::Model>(std::move(m));
    };
  }
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> m, r.make_model(false));
  *hidden = m->hidden_size();
  // The window as zinf train takes it: --seq, else a preset's positions, else min(positions, 2048).
  const bool hf_model = !o.model_dir.empty() || !o.model_config.empty();
  r.seq = o.model.seq.value_or(hf_model ? std::min(m->max_seq(), 2048) : m->max_seq());
  if (r.seq < 1 || r.seq > m->max_seq()) {
    return Status::invalid_argument(fmt::format("--seq {} must be between 1 and the model's max positions ({})", r.seq,
                                                m->max_seq()));
  }
  ZINF_ASSIGN_OR_RETURN(config::AutoContext ctx, o.autos.context(std::nullopt));
  set_run_shape(r, ctx, o.machine.host_fraction);
  return r;
}

Status run_plan(const PlanOptions& o) {
  int hidden = 0;
  ZINF_ASSIGN_OR_RETURN(zero3::PlanRequest request, plan_request(o, &hidden));
  ZINF_ASSIGN_OR_RETURN(zero3::Machine machine, o.machine.machine(request.precision, hidden, o.device));
  if (o.calibrate_log.empty() != o.calibrate_config.empty()) {
    return Status::invalid_argument("--calibrate and --calibrate-config go together: the run's log and its config");
  }
  if (!o.calibrate_log.empty()) {
    ZINF_ASSIGN_OR_RETURN(const auto measured, step_breakdown(o.calibrate_log));
    config::AutoContext ctx;
    ctx.world_size = request.world_size;
    ctx.trainer_defaults = true;
    ZINF_ASSIGN_OR_RETURN(const config::DsConfig ran, config::load_ds_config(o.calibrate_config, ctx));
    ZINF_ASSIGN_OR_RETURN(request.calibration, zero3::calibrate(request, machine, ran, measured.first,
                                                                measured.second, o.calibrate_log));
  }
  ZINF_ASSIGN_OR_RETURN(zero3::Plan plan, zero3::make_plan(request, machine));
  std::optional<zero3::Candidate> given;
  if (!o.predict_path.empty()) {
    config::AutoContext ctx;
    ctx.world_size = request.world_size;
    ctx.trainer_defaults = true;
    ZINF_ASSIGN_OR_RETURN(const config::DsConfig ds, config::load_ds_config(o.predict_path, ctx));
    Result<zero3::Candidate> c = zero3::predict_config(request, machine, ds);
    if (!c.is_ok()) return c.status().with_context("--predict " + o.predict_path);
    given = std::move(c).value();
  }
  if (o.json) {
    std::cout << plan_json(plan, machine, given ? &*given : nullptr, o.predict_path);
  } else {
    print_plan(std::cout, plan, machine, o.machine.top, o.show_dropped);
    if (given) {
      const zero3::Candidate& c = *given;
      const std::string against =
          plan.fitting.empty() ? "" : fmt::format("; {:.2f}x the plan's #1", c.step_s / plan.fitting.front().step_s);
      std::cout << fmt::format("--predict {}: {}: {:.3f} s/step ({:.0f} tokens/s), peak host {} GiB, disk {} GiB{}, "
                               "bound by {}{}. {}\n",
                               o.predict_path, c.label(), c.step_s, c.tokens_per_s, gib(c.memory.host_bytes()),
                               gib(c.memory.disk_bytes()), c.on_gpu ? fmt::format(", GPU {} GiB", gib(c.memory.gpu)) : "",
                               c.bottleneck, against, c.fits ? "It fits." : "It does not fit: " + c.why_not);
    }
  }
  if (plan.fitting.empty()) return Status::resource_exhausted(plan.shortfall);
  if (!o.write_path.empty()) {
    std::ofstream f(o.write_path);
    f << plan.fitting.front().ds_config;
    f.close();
    if (!f) return Status::sys_error("--write " + o.write_path, errno);
    if (!o.json) std::cout << fmt::format("wrote {}\n", o.write_path);
  }
  return Status::ok();
}

}  // namespace

void PlanMachineOptions::add_to(CLI::App& cmd, bool with_nvme_path) {
  if (with_nvme_path) {
    cmd.add_option("--nvme-path", nvme_paths,
                   "folders for NVMe offload (one or more; the first takes the optimizer state, a second the "
                   "parameters); none: only in-memory plans")
        ->check(CLI::ExistingDirectory);
  }
  cmd.add_option("--aio-summary", aio_summary, "an aio_bench summary.json: the drive's bandwidth and aio block");
  cmd.add_flag("--probe-io", probe_io, "measure the drive with a quick built-in probe (256 MiB written and read)");
  cmd.add_option("--host-memory", host_memory, "host memory a plan may use, e.g. 16G (default: MemAvailable now)");
  cmd.add_option("--host-fraction", host_fraction, "share of that memory a plan may fill (default 0.9)")
      ->check(CLI::Range(0.05, 1.0));
  cmd.add_option("--matmul-gflops", matmul_gflops, "the matrix rate to plan with (default: measured, ~0.3 s)")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--memory-gbps", memory_gbps, "the memory bandwidth to plan with (default: measured triad, ~0.3 s)")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--top", top, "candidates shown (default 5)")->check(CLI::PositiveNumber);
  cmd.add_option("--gpu-name", gpu_name, "plan for this GPU (e.g. \"H100 SXM\") instead of this machine's GPU 0");
  cmd.add_option("--gpu-memory", gpu_memory,
                 "GPU memory a run may take, e.g. 79G (default: GPU 0's free memory now); with no GPU here, plans "
                 "for one of this size");
  cmd.add_option("--gpu-tflops", gpu_tflops, "the GPU's dense bf16 peak, TFLOP/s (default: zinf's table by name)")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--gpu-hbm-gbps", gpu_hbm_gbps, "the GPU's memory bandwidth, GB/s (default: zinf's table by name)")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--pcie-gbps", pcie_gbps, "host <-> GPU copy rate through pinned memory, GB/s (default: assumed by generation)")
      ->check(CLI::PositiveNumber);
}

Result<std::uint64_t> parse_bytes(const std::string& option, const std::string& text) {
  Result<std::uint64_t> bytes = config::parse_byte_size(text);
  if (!bytes.is_ok()) return Status::invalid_argument(fmt::format("{}: {}", option, bytes.status().message()));
  return bytes;
}

Result<zero3::Machine> PlanMachineOptions::machine(config::Precision precision, int hidden,
                                                   const std::string& device) const {
  ZINF_ASSIGN_OR_RETURN(zero3::Machine m, zero3::describe_machine(nvme_paths));
  if (!host_memory.empty()) {
    ZINF_ASSIGN_OR_RETURN(m.host_available, parse_bytes("--host-memory", host_memory));
    m.host_source = "given (--host-memory)";
  }
  if (matmul_gflops) {
    m.matmul_gflops = zero3::Roof{*matmul_gflops, "given (--matmul-gflops)", false};
  } else {
    zero3::probe_matmul(m, precision, hidden);
  }
  m.memory_gbps = memory_gbps ? zero3::Roof{*memory_gbps, "given (--memory-gbps)", false} : zero3::probe_memory_gbps();
  const DeviceProbe gpu = probe_devices();
  m.gpus = gpu.device_count;
  m.gpu_detail = gpu.device_count > 0 ? gpu.first_device : gpu.why_none;
  const bool described = !gpu_memory.empty() || !gpu_name.empty();
  const bool want_gpu =
      device == "cuda" || (device == "auto" && (described || (gpu.build_has_gpu && gpu.device_count > 0)));
  if (device == "cpu" && described) {
    return Status::invalid_argument("--gpu-name and --gpu-memory describe a GPU to plan for: drop them with --device cpu");
  }
  if (want_gpu) {
    if (!gpu.build_has_gpu) {
      return Status::unsupported("a plan for a GPU: this zinf was built without the GPU layer, so it plans for the CPU only");
    }
    if (!gpu_name.empty() && gpu_memory.empty()) {
      return Status::invalid_argument(fmt::format("--gpu-name {}: give its memory too (--gpu-memory, e.g. 79G)", gpu_name));
    }
    if (gpu.device_count == 0 && gpu_memory.empty()) {
      return Status::invalid_argument(fmt::format(
          "--device cuda: no GPU here ({}); to plan for one elsewhere, give --gpu-name and --gpu-memory", gpu.why_none));
    }
    const std::string name = !gpu_name.empty() ? gpu_name : gpu.device_count > 0 ? gpu.first_name : "";
    std::uint64_t room = 0;
    std::string room_source = "free on GPU 0 now";
    if (!gpu_memory.empty()) {
      ZINF_ASSIGN_OR_RETURN(room, parse_bytes("--gpu-memory", gpu_memory));
      room_source = "given (--gpu-memory)";
    } else {
      Result<std::uint64_t> free_now = gpu0_free_bytes();
      if (!free_now.is_ok()) return free_now.status().with_context("the free memory of GPU 0 (--gpu-memory gives it)");
      room = *free_now;
    }
    ZINF_ASSIGN_OR_RETURN(m.gpu, zero3::plan_gpu(name, room, room_source, gpu_tflops, gpu_hbm_gbps, pcie_gbps));
    // This machine's GPU: its copy rate measured (about 0.1 s), unless given.
    if (gpu_name.empty() && gpu.device_count > 0 && !pcie_gbps) {
      Result<double> copy = probe_gpu_copy_gbps();
      if (copy.is_ok()) {
        m.gpu->pcie_gbps = zero3::Roof{*copy, "measured: 64 MiB copies through pinned memory, the slower way", true};
      } else {
        m.gpu->pcie_gbps.source += fmt::format(" (the probe failed: {})", copy.status().message());
      }
    }
  }
  if (!aio_summary.empty()) ZINF_RETURN_IF_ERROR(zero3::read_aio_summary(aio_summary, m));
  if (probe_io) ZINF_RETURN_IF_ERROR(zero3::probe_drive(m, std::uint64_t{256} << 20));
  return m;
}

std::string optimizer_blocks(const config::AutoContext& ctx) {
  const nlohmann::ordered_json builtin = nlohmann::ordered_json::parse(default_ds_config("/unused"));
  nlohmann::ordered_json out;
  for (const char* key : {"optimizer", "scheduler", "gradient_clipping"}) out[key] = builtin[key];
  nlohmann::ordered_json& opt = out["optimizer"]["params"];
  nlohmann::ordered_json& sched = out["scheduler"]["params"];
  if (ctx.lr) opt["lr"] = sched["warmup_max_lr"] = *ctx.lr;
  if (ctx.betas) opt["betas"] = {(*ctx.betas)[0], (*ctx.betas)[1]};
  if (ctx.eps) opt["eps"] = *ctx.eps;
  if (ctx.weight_decay) opt["weight_decay"] = *ctx.weight_decay;
  if (ctx.warmup_steps) sched["warmup_num_steps"] = *ctx.warmup_steps;
  if (ctx.gradient_clipping) out["gradient_clipping"] = *ctx.gradient_clipping;
  return out.dump();
}

Result<PlannedRun> plan_for_train(const PlanMachineOptions& options, const config::AutoContext& ctx,
                                   const std::function<Result<std::unique_ptr<model::Model>>(bool)>& make_model,
                                   int seq, const std::string& scratch, bool gpu, std::ostream& out) {
  zero3::PlanRequest r;
  r.make_model = make_model;
  r.seq = seq;
  set_run_shape(r, ctx, options.host_fraction);
  PlanMachineOptions with_drive = options;
  if (with_drive.nvme_paths.empty()) with_drive.nvme_paths = {scratch};
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> m, make_model(false));
  ZINF_ASSIGN_OR_RETURN(zero3::Machine machine, with_drive.machine(r.precision, m->hidden_size(), gpu ? "cuda" : "cpu"));
  ZINF_ASSIGN_OR_RETURN(zero3::Plan plan, zero3::make_plan(r, machine));
  out << "plan:\n";
  print_plan(out, plan, machine, options.top, false);
  if (plan.fitting.empty()) return Status::resource_exhausted(plan.shortfall);
  const zero3::Candidate& w = plan.fitting.front();
  out << fmt::format("plan: training with #1 (predicted {:.3f} s/step, peak host {} GiB, disk {} GiB{})\n", w.step_s,
                     gib(w.memory.host_bytes()), gib(w.memory.disk_bytes()),
                     w.on_gpu ? fmt::format(", GPU {} GiB", gib(w.memory.gpu)) : "")
      << std::flush;
  return PlannedRun{w.ds_config, w.step_s, w.memory.host_bytes()};
}

std::string planned_against_measured(const PlannedRun& plan, std::vector<double> steps, std::uint64_t peak_rss) {
  if (steps.empty()) return "";
  if (steps.size() > 1) steps.erase(steps.begin());  // the first step warms up
  std::sort(steps.begin(), steps.end());
  const double median = steps[steps.size() / 2];
  return fmt::format("plan: predicted {:.3f} s/step, measured {:.3f} (median of {}; predicted / measured {:.2f}); "
                     "peak host predicted {} GiB, measured {} GiB ({:.2f})\n",
                     plan.step_s, median, steps.size(), plan.step_s / median, gib(plan.peak_host_bytes), gib(peak_rss),
                     static_cast<double>(plan.peak_host_bytes) / static_cast<double>(std::max<std::uint64_t>(peak_rss, 1)));
}

void print_plan(std::ostream& out, const zero3::Plan& plan, const zero3::Machine& machine, int top,
                bool show_dropped) {
  out << fmt::format("machine: {} cores, host memory {} GiB ({})\n", machine.cores, gib(machine.host_available),
                     machine.host_source);
  out << fmt::format("  gpu: {} ({}){}\n", machine.gpus, machine.gpu_detail.empty() ? "none" : machine.gpu_detail,
                     machine.gpus > 0 && !machine.gpu ? "; the plan is for the CPU (--device cpu)" : "");
  if (machine.gpu) {
    out << fmt::format("  computing on: {}, {} GiB of its memory ({})\n", machine.gpu->name, gib(machine.gpu->room_bytes),
                       machine.gpu->room_source);
  }
  for (const zero3::Machine::Drive& d : machine.drives) out << fmt::format("  drive {}: {} GiB free\n", d.path, gib(d.free_bytes));
  out << "roofs:\n"
      << roof_line("matmul", machine.matmul_gflops, "GFLOP/s") << roof_line("memory", machine.memory_gbps, "GB/s")
      << roof_line("NVMe read", machine.nvme_read_gbps, "GB/s") << roof_line("NVMe write", machine.nvme_write_gbps, "GB/s");
  if (machine.gpu) {
    out << roof_line("GPU peak", machine.gpu->tflops, "TFLOP/s") << roof_line("GPU memory", machine.gpu->hbm_gbps, "GB/s")
        << roof_line("host<->GPU", machine.gpu->pcie_gbps, "GB/s");
  }
  out << fmt::format("{} candidates: {} fit, {} dropped; {} tokens per step\n", plan.fitting.size() + plan.dropped.size(),
                     plan.fitting.size(), plan.dropped.size(), plan.tokens_per_step);
  if (!plan.fitting.empty()) {
    const bool gpu = machine.gpu.has_value();
    out << fmt::format("{:>2}  {:<6} {:<6} {:>9} {:>5} {:>9} {:>11} {:>8} {:>10} {:>9} {:>8}{} {:>8} {:>9}  {}\n", "#",
                       "params", "optim", "micro×acc", "ckpt", "sub_group", "max_live", "budget", "host GiB", "pinned",
                       "disk GiB", gpu ? fmt::format(" {:>8}", "GPU GiB") : "", "step s", "tok/s", "bottleneck");
    const int n = std::min<int>(top, static_cast<int>(plan.fitting.size()));
    for (int i = 0; i < n; ++i) {
      const zero3::Candidate& c = plan.fitting[static_cast<std::size_t>(i)];
      out << fmt::format("{:>2}  {:<6} {:<6} {:>9} {:>5} {:>9} {:>11} {:>8} {:>10} {:>9} {:>8}{} {:>8.3f} {:>9.0f}  {}\n",
                         i + 1, config::offload_device_name(c.param_device),
                         config::offload_device_name(c.optimizer_device), fmt::format("{}×{}", c.micro_batch, c.grad_accum),
                         c.activation_checkpointing ? "on" : "off", zero3::count_name(c.sub_group_size),
                         // The whole state on the GPU gathers nothing: no live budget.
                         c.on_gpu && c.gathers == 0 ? std::string("-") : zero3::count_name(c.max_live_parameters),
                         c.host_memory_budget > 0 ? gib(c.host_memory_budget) : std::string("-"), gib(c.memory.host_bytes()),
                         gib(c.memory.pinned_bytes()), gib(c.memory.disk_bytes()),
                         gpu ? fmt::format(" {:>8}", gib(c.memory.gpu)) : "", c.step_s, c.tokens_per_s,
                         c.bottleneck);
    }
    out << "why: " << plan.why_winner << "\n";
  } else {
    out << plan.shortfall << "\n";
  }
  if (show_dropped) {
    for (const zero3::Candidate& c : plan.dropped) out << fmt::format("dropped: {}: {}\n", c.label(), c.why_not);
  } else if (!plan.dropped.empty()) {
    out << fmt::format("dropped {} (--show-dropped lists them), e.g. {}: {}\n", plan.dropped.size(),
                       plan.dropped.front().label(), plan.dropped.front().why_not);
  }
  if (!plan.calibration.empty()) out << plan.calibration << "\n";
  out << "assumed, not measured:\n";
  for (const std::string& a : plan.assumptions) out << "  - " << a << "\n";
}

std::string plan_json(const zero3::Plan& plan, const zero3::Machine& machine, const zero3::Candidate* predicted,
                      const std::string& predicted_path) {
  nlohmann::json j;
  nlohmann::json cands = nlohmann::json::array();
  for (const zero3::Candidate& c : plan.fitting) cands.push_back(candidate_json(c));
  for (const zero3::Candidate& c : plan.dropped) cands.push_back(candidate_json(c));
  if (!plan.fitting.empty()) {
    const zero3::Candidate& w = plan.fitting.front();
    j["config"] = nlohmann::json::parse(w.ds_config);
    j["predicted_step_s"] = w.step_s;
    j["predicted_tokens_per_s"] = w.tokens_per_s;
    j["predicted_peak_host_bytes"] = w.memory.host_bytes();
    j["predicted_pinned_host_bytes"] = w.memory.pinned_bytes();
    j["predicted_disk_bytes"] = w.memory.disk_bytes();
    j["predicted_gpu_bytes"] = w.memory.gpu;
    j["bottleneck"] = w.bottleneck;
    j["why"] = plan.why_winner;
  } else {
    j["config"] = nullptr;
    j["shortfall"] = plan.shortfall;
  }
  j["tokens_per_step"] = plan.tokens_per_step;
  j["machine"] = {{"cores", machine.cores},
                  {"gpus", machine.gpus},
                  {"gpu", machine.gpu_detail},
                  {"host_available_bytes", machine.host_available},
                  {"host_source", machine.host_source},
                  {"matmul_gflops", roof_json(machine.matmul_gflops)},
                  {"memory_gbps", roof_json(machine.memory_gbps)},
                  {"nvme_read_gbps", roof_json(machine.nvme_read_gbps)},
                  {"nvme_write_gbps", roof_json(machine.nvme_write_gbps)},
                  {"aio_source", machine.aio_source}};
  if (machine.gpu) {
    const zero3::PlanGpu& g = *machine.gpu;
    j["machine"]["compute_gpu"] = {{"name", g.name},
                                   {"room_bytes", g.room_bytes},
                                   {"room_source", g.room_source},
                                   {"tflops", roof_json(g.tflops)},
                                   {"hbm_gbps", roof_json(g.hbm_gbps)},
                                   {"pcie_gbps", roof_json(g.pcie_gbps)}};
  }
  j["compute"] = machine.gpu ? "cuda" : "cpu";
  j["assumptions"] = plan.assumptions;
  j["calibration"] = plan.calibration;
  j["candidates"] = cands;
  if (predicted != nullptr) {
    j["predicted_config"] = candidate_json(*predicted);
    j["predicted_config"]["path"] = predicted_path;
  }
  return j.dump(2) + "\n";
}

void add_plan_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("plan", "the fastest ZeRO-3 configuration that fits this model on this machine");
  auto o = std::make_shared<PlanOptions>();
  o->model.add_to(*cmd, "gpt2", "50257, GPT-2's; zinf train takes the data's, 256 for its built-in corpus");
  o->autos.add_to(*cmd);
  cmd->add_option("--model-dir", o->model_dir, "a Hugging Face model folder (its config.json decides the model)");
  cmd->add_option("--model-config", o->model_config,
                  "a Hugging Face config.json, or a folder holding one: the model (no weights needed)");
  o->machine.add_to(*cmd, true);
  cmd->add_option("--device", o->device,
                  "plan for the CPU or a GPU: auto (default) plans for the GPU --gpu-name/--gpu-memory describe, else "
                  "for GPU 0 when this build and machine have one")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_flag("--json", o->json, "print the plan as one JSON object");
  cmd->add_flag("--show-dropped", o->show_dropped, "list every candidate that does not fit, with the reason");
  cmd->add_option("--calibrate", o->calibrate_log,
                  "a zinf train --json-log of this model and shape: its step breakdown scales the predicted passes "
                  "and optimizer step (with --calibrate-config, the config that run used)");
  cmd->add_option("--calibrate-config", o->calibrate_config, "the ds_config the --calibrate run trained with");
  cmd->add_option("--predict", o->predict_path,
                  "a ds_config.json (a hand-written one, or one a run used): print its predicted memory and time "
                  "beside the plan");
  cmd->add_option("--write", o->write_path, "write the winner's ds_config.json here (zinf train --config reads it)");
  cmd->callback([o, exit_code] {
    Status s = run_plan(*o);
    if (s.is_ok()) {
      *exit_code = 0;
      return;
    }
    std::cout << std::flush;
    std::cerr << "zinf plan: " << s.message() << "\n";
    // Nothing fits: 3, apart from usage errors (2) and failures (1).
    *exit_code = s.code() == ErrorCode::kResourceExhausted ? 3
                 : s.code() == ErrorCode::kInvalidArgument || s.code() == ErrorCode::kNotFound ? 2
                                                                                                : 1;
  });
}

}  // namespace zinf::cli
