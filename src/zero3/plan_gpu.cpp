// The planner's GPU facts: a GPU's dense bf16 peak and memory bandwidth by name, and the copy rate.
#include <array>
#include <string_view>

#include <fmt/format.h>

#include "zinf/zero3/plan.h"

namespace zinf::zero3 {
namespace {

struct KnownGpu {
  std::string_view match;  // a substring of the CUDA device name; the first match wins
  double tflops;           // dense bf16 tensor-core peak (no sparsity)
  double hbm_gbps;
  bool pcie_gen5;          // Hopper and later: PCIe gen 5 x16
};

// From the vendors' datasheets. Order matters: the more specific name first.
constexpr std::array<KnownGpu, 16> kKnown = {{
    {"GH200", 989, 4000, true},
    {"H200", 989, 4800, true},
    {"H100 NVL", 835, 3900, true},
    {"H100 PCIe", 756, 2000, true},
    {"H100", 989, 3350, true},  // SXM (HBM3)
    {"H800", 989, 3350, true},
    {"B200", 2250, 8000, true},
    {"A100-SXM4-80GB", 312, 2039, false},
    {"A100 80GB", 312, 1935, false},  // PCIe
    {"A100", 312, 1555, false},       // 40 GB
    {"A800", 312, 2039, false},
    {"L40S", 362, 864, false},
    {"L4", 121, 300, false},
    {"A10G", 70, 600, false},
    {"A10", 125, 600, false},
    {"RTX 4090", 165, 1008, false},
}};

// gpu_copy_bench through pinned memory on the H100 and H200 machines (docs/gpu.md, run 22):
// 55.4 GB/s up, 55.3 down on PCIe gen 5 x16; gen 4 x16 is half the signalling rate.
constexpr double kGen5CopyGbps = 55.0;
constexpr double kGen4CopyGbps = 25.0;

}  // namespace

Result<PlanGpu> plan_gpu(const std::string& name, std::uint64_t room, const std::string& room_source,
                         std::optional<double> tflops, std::optional<double> hbm_gbps,
                         std::optional<double> pcie_gbps) {
  if (room == 0) return Status::invalid_argument(fmt::format("the GPU {}: no memory to plan with ({})", name, room_source));
  const KnownGpu* known = nullptr;
  for (const KnownGpu& k : kKnown) {
    if (!name.empty() && name.find(k.match) != std::string::npos) {
      known = &k;
      break;
    }
  }
  PlanGpu g;
  g.name = name.empty() ? "an unnamed GPU" : name;
  g.room_bytes = room;
  g.room_source = room_source;
  if (tflops) {
    g.tflops = Roof{*tflops, "given (--gpu-tflops)", false};
  } else if (known != nullptr) {
    g.tflops = Roof{known->tflops, fmt::format("from the datasheet ({}, dense bf16)", known->match), false};
  } else if (name.empty()) {
    return Status::invalid_argument(
        "a GPU without a name: give --gpu-name (as CUDA names it, e.g. \"NVIDIA H100 80GB HBM3\") for zinf plan's "
        "table to give its peak, or the peak itself with --gpu-tflops");
  } else {
    return Status::invalid_argument(fmt::format(
        "the GPU \"{}\" is not in zinf plan's table: give its dense bf16 tensor-core peak with --gpu-tflops "
        "(e.g. 989 for an H100 SXM), and its memory bandwidth with --gpu-hbm-gbps",
        name));
  }
  if (hbm_gbps) {
    g.hbm_gbps = Roof{*hbm_gbps, "given (--gpu-hbm-gbps)", false};
  } else if (known != nullptr) {
    g.hbm_gbps = Roof{known->hbm_gbps, fmt::format("from the datasheet ({})", known->match), false};
  } else {
    g.hbm_gbps = Roof{1000, "assumed: 1000 GB/s (give --gpu-hbm-gbps)", false};
  }
  if (pcie_gbps) {
    g.pcie_gbps = Roof{*pcie_gbps, "given (--pcie-gbps)", false};
  } else if (known != nullptr && known->pcie_gen5) {
    g.pcie_gbps = Roof{kGen5CopyGbps, "assumed: PCIe gen 5 x16 through pinned memory (gpu_copy_bench, docs/gpu.md run 22)",
                       false};
  } else {
    g.pcie_gbps = Roof{kGen4CopyGbps, "assumed: PCIe gen 4 x16 through pinned memory (give --pcie-gbps)", false};
  }
  for (const Roof* r : {&g.tflops, &g.hbm_gbps, &g.pcie_gbps}) {
    if (!(r->value > 0)) return Status::invalid_argument(fmt::format("the GPU {}: a roof is not positive ({})", name, r->source));
  }
  return g;
}

}  // namespace zinf::zero3
