// --device in a build without the GPU layer: no GPU to probe, and every model computes on the CPU.
#include <fmt/format.h>

#include "device_choice.h"

namespace zinf::cli {

DeviceProbe probe_devices() { return DeviceProbe{}; }

Result<std::unique_ptr<model::Model>> place_model(std::unique_ptr<model::Model> cpu_model, const DeviceChoice& choice) {
  if (choice.device == ComputeDevice::kCpu) return cpu_model;
  return Status::unsupported("--device cuda: this zinf was built without the GPU layer");
}

Result<std::uint64_t> gpu_workspace_bytes(const model::Model&, int) {
  return Status::unsupported("this zinf was built without the GPU layer: it plans for the CPU only (--device cpu)");
}

Result<std::uint64_t> gpu0_free_bytes() { return Status::unsupported("this zinf was built without the GPU layer"); }

Result<double> probe_gpu_copy_gbps() { return Status::unsupported("this zinf was built without the GPU layer"); }

std::optional<DeviceTimes> device_times(const model::Model&, int) { return std::nullopt; }

}  // namespace zinf::cli
