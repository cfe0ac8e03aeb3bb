// zinf CLI: the planner's machine options and its report, shared by `zinf plan` and `zinf train --plan`.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "zinf/status.h"
#include "zinf/zero3/plan.h"

namespace zinf::cli {

struct PlanMachineOptions {
  std::vector<std::string> nvme_paths;  // --nvme-path (one or more existing folders)
  std::string aio_summary;              // --aio-summary: an aio_bench summary.json
  bool probe_io = false;                // --probe-io: a quick built-in drive probe
  std::string host_memory;              // --host-memory: e.g. 16G (default: MemAvailable)
  double host_fraction = 0.9;           // --host-fraction
  std::optional<double> matmul_gflops;  // given roofs skip their probes
  std::optional<double> memory_gbps;
  int top = 5;
  // The GPU to plan for: this machine's GPU 0 unless given (--gpu-name, --gpu-memory), its roofs
  // from zinf's table unless given.
  std::string gpu_name, gpu_memory;
  std::optional<double> gpu_tflops, gpu_hbm_gbps, pcie_gbps;

  // Adds the options to `cmd`. `zinf train --plan` names its own swap folder (with_nvme_path
  // false) and has its own --device.
  void add_to(CLI::App& cmd, bool with_nvme_path);
  // The machine: free space, memory, the roofs (probed unless given or read from the summary).
  // device: "cpu" plans for the CPU; "cuda" for a GPU (this machine's, or the one the --gpu-*
  // options describe), an error without one; "auto" for a GPU when --gpu-name or --gpu-memory
  // describes one, or the build has the GPU layer and this machine a GPU.
  Result<zero3::Machine> machine(config::Precision precision, int hidden, const std::string& device) const;
};

// "16G", "512M", "1024" (bytes) -> bytes; errors name the option and the value.
Result<std::uint64_t> parse_bytes(const std::string& option, const std::string& text);

// The report: the machine's roofs and their sources, the best `top` candidates as a table, why
// the winner wins (or what is short), and the assumed terms.
void print_plan(std::ostream& out, const zero3::Plan& plan, const zero3::Machine& machine, int top,
                bool show_dropped);

// The plan as one JSON object: config, predicted_step_s, predicted_peak_host_bytes,
// predicted_disk_bytes, candidates, ...; with `predicted` (--predict), predicted_config too.
std::string plan_json(const zero3::Plan& plan, const zero3::Machine& machine,
                      const zero3::Candidate* predicted = nullptr, const std::string& predicted_path = "");

// `zinf train --plan`: plans for the model `make_model` makes, at window `seq` and the batch and
// precision in `ctx` (the train options), with NVMe folders from the options or else `scratch`;
// prints the plan to `out` and returns the winner. Nothing fits: ResourceExhausted with the
// shortfall.
// On a GPU (gpu true: zinf train --device cuda) every candidate is a GPU run.
struct PlannedRun {
  std::string ds_config;        // the winner's
  double step_s = 0;            // its predicted step time
  std::uint64_t peak_host_bytes = 0;
};
// The end-of-run line of `zinf train --plan`: the predicted step time and peak host memory beside
// the measured median step (the first step left out when there are more) and peak RSS.
std::string planned_against_measured(const PlannedRun& plan, std::vector<double> step_seconds,
                                     std::uint64_t peak_rss_bytes);
Result<PlannedRun> plan_for_train(const PlanMachineOptions& options, const config::AutoContext& ctx,
                                   const std::function<Result<std::unique_ptr<model::Model>>(bool)>& make_model,
                                   int seq, const std::string& scratch, bool gpu, std::ostream& out);

// The built-in config's optimizer, scheduler and clipping (what `zinf train` runs without
// --config), with the values the options give (--lr, --betas, --eps, --weight-decay,
// --warmup-steps, --clip), for the planner to write.
std::string optimizer_blocks(const config::AutoContext& ctx);

}  // namespace zinf::cli
