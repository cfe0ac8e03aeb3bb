// Model-state memory estimate for ZeRO-3 (reference-semantics §10), for every offload option.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zinf::zero3 {

struct EstimateInput {
  std::uint64_t total_params = 0;          // N
  std::uint64_t largest_layer_params = 0;  // L
  int gpus_per_node = 1;                   // G
  int nodes = 1;                           // M
  double buffer_factor = 1.5;
};

struct EstimateRow {
  std::string offload_param;      // "none", "cpu" or "nvme"
  std::string offload_optimizer;  // "none", "cpu" or "nvme"
  bool zero_init = true;
  double cpu_bytes = 0;   // per node (the reference's "per CPU")
  double gpu_bytes = 0;   // per GPU
  double nvme_bytes = 0;  // per node, model states kept in swap files (0 unless an nvme option)
};

// The reference's six rows (param cpu/none x optimizer cpu/none x zero_init 1/0, in its order),
// then zinf's NVMe rows: optimizer on NVMe (params on GPU, on CPU, on NVMe).
std::vector<EstimateRow> estimate_model_states(const EstimateInput& in);

// The table as the reference prints it, with an NVMe column added.
std::string format_estimate(const EstimateInput& in, const std::vector<EstimateRow>& rows);

}  // namespace zinf::zero3
