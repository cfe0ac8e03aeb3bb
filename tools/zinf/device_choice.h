// `--device cpu|cuda|auto`: which processor a run computes on, from what was asked, what the
// build has and what the machine has. resolve_device and fit_device_to_model are pure (tested on
// any machine); probe_devices and place_model come from device_gpu.cpp or device_nogpu.cpp,
// whichever the build has.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "device/step_times.h"
#include "zinf/model/model.h"
#include "zinf/status.h"

namespace zinf::cli {

enum class ComputeDevice { kCpu, kCuda };

// What the build and the machine offer.
struct DeviceProbe {
  bool build_has_gpu = false;  // zinf was built with the GPU layer (src/gpu)
  int device_count = 0;        // usable CUDA devices
  std::string why_none;        // device_count == 0: CUDA's reason ("no CUDA device: ...")
  std::string first_device;    // device 0 in a few words: "NVIDIA H100 80GB HBM3, 79.6 GiB"
  std::string first_name;      // device 0's name: "NVIDIA H100 80GB HBM3"
};

struct DeviceChoice {
  ComputeDevice device = ComputeDevice::kCpu;
  bool explicit_request = false;  // --device cpu or cuda, not auto
  std::string detail;             // why, or which GPU
  // The start-up line: "device: cuda (NVIDIA H100 80GB HBM3, 79.6 GiB)", "device: cpu (no CUDA device: ...)".
  std::string line() const { return "device: " + describe(); }
  // The same without "device: ": "cpu (--device cpu)".
  std::string describe() const;
};

// requested: "cpu", "cuda" or "auto". auto is cuda when the build has the GPU layer and a device
// is usable, else cpu (saying why). cuda without either: unsupported, naming why. "cpu" never
// looks at the probe.
Result<DeviceChoice> resolve_device(std::string_view requested, const DeviceProbe& probe);
// The GPT and the Llama family (every HF folder --model-dir takes) run on the GPU; another model
// (a user's) on cuda is unsupported when cuda was asked for, and falls back to cpu (saying why)
// under auto.
Result<DeviceChoice> fit_device_to_model(DeviceChoice choice, std::string_view model_type);

// What this build and machine have (calls into CUDA only in a GPU build).
DeviceProbe probe_devices();
// The model that computes on `choice`'s device: `cpu_model` itself for cpu; for cuda the GPT or
// Llama on GPU 0 with the same parameters and modules (checkpoints are interchangeable).
Result<std::unique_ptr<model::Model>> place_model(std::unique_ptr<model::Model> cpu_model, const DeviceChoice& choice);

// The device workspace (activations and scratch) the GPU model for `cpu_model` (a GPT or a
// Llama) binds at `rows` = micro-batch x window, as zinf train --device cuda sizes it; computed
// on the host, no GPU needed. Unsupported in a build without the GPU layer or for another model.
Result<std::uint64_t> gpu_workspace_bytes(const model::Model& cpu_model, int rows);

// GPU 0's free memory now (cudaMemGetInfo). Not part of probe_devices: it makes a CUDA context on
// GPU 0, which a rank that trains on another GPU must not hold.
Result<std::uint64_t> gpu0_free_bytes();

// zinf plan's copy-rate probe of GPU 0: 64 MiB copies each way between zinf's pinned memory and
// the device through its copy engine (the engine's own path), the median of 5 of each; GB/s of
// the slower direction. Unsupported without the GPU layer or a GPU.
Result<double> probe_gpu_copy_gbps();

// Where a GPU model's passes spent their time, summed since it was made (gpu::GpuModelTimes), and
// its model flops per token at the training window T. nullopt for a model on the CPU.
struct DeviceTimes {
  device::StepTimes times;
  // 6 N + 12 L C T (forward and backward of every parameter, plus attention's Q K^T and A V over
  // the full T x T, PaLM's and nanoGPT's estimate_mfu convention; causal masking not discounted);
  // for Llama C is the attention width Q = n_head * head_dim.
  double flops_per_token = 0;
  std::string flops_formula;  // "6*N + 12*L*C*T, N = 124439808, L = 12, C = 768, T = 1024" (Llama: Q for C)
};
std::optional<DeviceTimes> device_times(const model::Model& model, int T);
// b's times minus a's, field by field (the flops stay b's).
DeviceTimes operator-(const DeviceTimes& b, const DeviceTimes& a);

}  // namespace zinf::cli
