// Memory estimator: the reference's ZeRO-3 model-state formulas plus NVMe-offload rows.
#include "zinf/zero3/estimate.h"

#include <algorithm>

#include <fmt/format.h>

namespace zinf::zero3 {
namespace {

// Bytes per parameter of model states: fp16 param (2) + fp16 grad (2) + fp32 master, m, v (12)
// = 16; the reference counts 18 when parameters are offloaded too (fp32 grads on the CPU side).
constexpr double kStatesOffloadAll = 18.0;
constexpr double kStatesOffloadOptim = 16.0;

}  // namespace

std::vector<EstimateRow> estimate_model_states(const EstimateInput& in) {
  const double n = static_cast<double>(in.total_params);
  const double l = static_cast<double>(in.largest_layer_params);
  const double g = std::max(1, in.gpus_per_node);
  const double m = std::max(1, in.nodes);
  const double t = g * m;
  const double f = in.buffer_factor;
  const double largest = 4.0 * l;
  std::vector<EstimateRow> rows;
  for (bool zero_init : {true, false}) {
    // Parameters and optimizer on the CPU.
    const double cpu_all = zero_init ? n * kStatesOffloadAll / m * f
                                     : n * std::max(4.0 * g, kStatesOffloadAll / m) * f;
    rows.push_back({"cpu", "cpu", zero_init, cpu_all, largest, 0});
  }
  for (bool zero_init : {true, false}) {
    const double cpu_opt = zero_init ? n * kStatesOffloadOptim / m * f
                                     : n * std::max(4.0 * g, kStatesOffloadOptim / m) * f;
    rows.push_back({"none", "cpu", zero_init, cpu_opt, largest + static_cast<double>(static_cast<std::uint64_t>(2.0 * n / t)), 0});
  }
  for (bool zero_init : {true, false}) {
    const double cpu_none = zero_init ? l * 4.0 * g * f : n * 4.0 * g * f;
    rows.push_back({"none", "none", zero_init, cpu_none, largest + static_cast<double>(static_cast<std::uint64_t>(18.0 * n / t)), 0});
  }
  // zinf NVMe rows (zero_init-style partitioned construction): the states move to swap files
  // and the CPU keeps the staging buffers of the largest layer (x buffer factor) per GPU.
  const double staging = largest * g * f;
  rows.push_back({"nvme", "nvme", true, staging, largest, n * kStatesOffloadAll / m * f});
  rows.push_back({"cpu", "nvme", true, n * 2.0 / m * f + staging, largest, n * kStatesOffloadOptim / m * f});
  rows.push_back({"none", "nvme", true, staging, largest + static_cast<double>(static_cast<std::uint64_t>(2.0 * n / t)),
                  n * kStatesOffloadOptim / m * f});
  return rows;
}

std::string format_estimate(const EstimateInput& in, const std::vector<EstimateRow>& rows) {
  auto gb = [](double bytes) { return fmt::format("{:.2f}GB", bytes / (1u << 30)); };
  std::string out = "Estimated memory needed for params, optim states and gradients for a:\n";
  out += fmt::format("HW: Setup with {} node{}, {} GPU{} per node.\n", in.nodes, in.nodes == 1 ? "" : "s",
                     in.gpus_per_node, in.gpus_per_node == 1 ? "" : "s");
  out += fmt::format("SW: Model with {}M total params, {}M largest layer params.\n",
                     static_cast<std::uint64_t>(in.total_params / 1e6 + 0.5),
                     static_cast<std::uint64_t>(in.largest_layer_params / 1e6 + 0.5));
  out += "  per CPU |  per GPU |  per NVMe |   Options\n";
  for (const EstimateRow& r : rows) {
    out += fmt::format("{:>9} | {:>8} | {:>9} | offload_param={:<4}, offload_optimizer={:<4}, zero_init={}\n",
                       gb(r.cpu_bytes), gb(r.gpu_bytes), r.nvme_bytes > 0 ? gb(r.nvme_bytes) : "-",
                       r.offload_param, r.offload_optimizer, r.zero_init ? 1 : 0);
  }
  return out;
}

}  // namespace zinf::zero3
