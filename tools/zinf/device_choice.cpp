// --device resolution: pure functions of the request, the build and the machine.
#include "device_choice.h"

#include <fmt/format.h>

namespace zinf::cli {

std::string DeviceChoice::describe() const {
  return fmt::format("{} ({})", device == ComputeDevice::kCuda ? "cuda" : "cpu", detail);
}

Result<DeviceChoice> resolve_device(std::string_view requested, const DeviceProbe& probe) {
  DeviceChoice c;
  if (requested == "cpu") {
    c.explicit_request = true;
    c.detail = "--device cpu";
    return c;
  }
  if (requested != "cuda" && requested != "auto") {
    return Status::invalid_argument(fmt::format("--device {}: use cpu, cuda or auto", requested));
  }
  c.explicit_request = requested == "cuda";
  std::string why_not;
  if (!probe.build_has_gpu) {
    why_not = "this zinf was built without the GPU layer (meson found no CUDA toolkit with nvcc and cuBLAS)";
  } else if (probe.device_count < 1) {
    why_not = probe.why_none.empty() ? "no CUDA device" : probe.why_none;
  }
  if (!why_not.empty()) {
    if (c.explicit_request) return Status::unsupported(fmt::format("--device cuda: {}", why_not));
    c.detail = why_not;
    return c;
  }
  c.device = ComputeDevice::kCuda;
  c.detail = probe.device_count > 1 ? fmt::format("{}; GPU 0 of {}", probe.first_device, probe.device_count)
                                    : probe.first_device;
  return c;
}

Result<DeviceChoice> fit_device_to_model(DeviceChoice choice, std::string_view model_type) {
  if (choice.device != ComputeDevice::kCuda || model_type == "gpt" || model_type == "llama") return choice;
  const std::string why = fmt::format("{} runs on the CPU only for now", model_type);
  if (choice.explicit_request) return Status::unsupported(fmt::format("--device cuda: {}; use --device cpu", why));
  choice.device = ComputeDevice::kCpu;
  choice.detail = why;
  return choice;
}

DeviceTimes operator-(const DeviceTimes& b, const DeviceTimes& a) {
  DeviceTimes d = b;
  d.times = b.times - a.times;
  return d;
}

}  // namespace zinf::cli
