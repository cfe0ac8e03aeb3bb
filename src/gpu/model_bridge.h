// Internal: BridgedGpuModel, a model::Model that runs a whole-model GPU pass (GptGpu, LlamaGpu;
// gpu_pass.h GpuNet) while the engine keeps owning, gathering and updating the parameters on the
// host. GptGpuModel and LlamaGpuModel are it with their configurations.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "device/step_times.h"
#include "zinf/model/model.h"
#include "zinf/status.h"

namespace zinf::gpu {

class Blas;
class GpuNet;

struct GpuModelOptions {
  int device = 0;               // CUDA ordinal
  std::size_t memory_cap = 0;   // bytes the caching allocator may hold; 0: the device's memory
  // Staging comes from cudaHostAlloc as where cudaHostRegister is refused (tests; normally the
  // registered pinned buffer is tried first, host_staging.h).
  bool staging_host_alloc = false;
};

// Where the passes' time went, summed since create() (device/step_times.h): host clocks around
// the bridge's work, and cudaEvents on the compute stream between the points where the host
// makes it wait (each upload at acquire, each gradient download at grads_ready).
using GpuModelTimes = device::StepTimes;

class GpuModelBridge;  // internal: the device, streams, allocator, the net and the bridge

// The same model as the CPU model it is made from (type(), params(), modules() and config_json()
// are that model's, so checkpoints and HF folders move freely between --device cpu and cuda),
// computed on the GPU in bf16 with fp32 gradients (docs/gpu-kernels.md). It bridges the host
// ParamAccess the engine gives to the net's device one, synchronously, module by module:
//  - acquire(m): host acquire (gathered fp32 values) -> cast to bf16 into pinned staging ->
//    one H2D copy into a device block (caching allocator) held until release(m); the copy
//    completes before acquire returns, and kernels are ordered after it.
//  - release(m): waits for the kernels that read m's values, returns the block, host release.
//  - grad_buffers(m): host grad_buffers; device fp32 buffers, zeroed, one per parameter per
//    pass (a tied embedding keeps one buffer across the head and the embedding; BridgeLedger).
//  - grads_ready(m): waits for m's backward kernels, copies the gradients of the parameters m
//    owns D2H into pinned staging, ADDS them into the host buffers, then host grads_ready.
// The loss scale is applied on the device as on the CPU. Nothing is prefetched or overlapped.
//
// Not thread-safe: one pass at a time, from any thread (each pass makes its device current).
class BridgedGpuModel : public model::Model {
 public:
  ~BridgedGpuModel() override;
  BridgedGpuModel(const BridgedGpuModel&) = delete;
  BridgedGpuModel& operator=(const BridgedGpuModel&) = delete;

  std::string_view type() const override;
  // The CPU model's line, then " on GPU <n> (<name>)".
  std::string describe() const override;
  std::string config_json() const override;
  std::span<const model::ParamSpec> params() const override;
  std::span<const model::ModuleSpec> modules() const override;
  int vocab_size() const override;
  int max_seq() const override;
  int hidden_size() const override;

  Result<float> forward_backward(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B, int T,
                                 model::ParamAccess& access, float loss_scale) override;
  Result<float> forward_loss(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B, int T,
                             model::ParamAccess& access) override;
  // Device memory: the GPU workspace (activations and scratch) for B*T positions.
  Status reserve(int B, int T) override;
  uint64_t activation_bytes(int B, int T) const override;
  GpuModelTimes times() const;

  // The device interface over this model's compute stream, copy streams and allocator: an engine
  // that gathers into it (EngineDevice kModelDevice) calls use_device_memory(), and from then on
  // acquire() casts the engine's fp32 device values to bf16 on the compute stream, the net adds
  // into the engine's device gradient buffers, and nothing is staged, uploaded or downloaded
  // here: the engine's copies run on the copy streams, prefetched and overlapped (docs/zero3.md).
  device::Device* compute_device() override;
  Status use_device_memory() override;

  // The GPU computes in bf16 with fp32 accumulation whatever the run's precision.
  Status set_compute_precision(model::ComputePrecision) override { return Status::ok(); }

 protected:
  // Makes the net once the bridge has its cuBLASLt handle and compute stream.
  using MakeGpuNet = std::function<Result<std::unique_ptr<GpuNet>>(Blas*, cudaStream_t)>;
  // MakeGpuNet for a net with Net::create(config, blas, stream) (instantiated where Net is complete).
  template <typename Net, typename Config>
  static MakeGpuNet net_of(Config config) {
    return [config = std::move(config)](Blas* blas, cudaStream_t stream) -> Result<std::unique_ptr<GpuNet>> {
      ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Net> net, Net::create(config, blas, stream));
      return std::unique_ptr<GpuNet>(std::move(net));
    };
  }
  BridgedGpuModel();
  // Once, before any other call: `cpu` is the CPU model of the same configuration (its lists,
  // config_json, describe); `label` names the streams, events and memory in messages ("GPT",
  // "Llama"). unsupported when there is no CUDA device; the net's error (e.g. a head size the
  // kernels lack); the CUDA error naming the step otherwise.
  Status attach(std::unique_ptr<model::Model> cpu, std::string label, GpuModelOptions options,
                const MakeGpuNet& make_net);
  const model::Model& cpu_model() const;

 private:
  std::unique_ptr<GpuModelBridge> bridge_;
};

}  // namespace zinf::gpu
