// BridgedGpuModel: a whole-model GPU pass (GptGpu, LlamaGpu) behind model::Model, bridging the
// engine's host ParamAccess to the pass's device one through pinned staging, synchronously,
// module by module.
#include "gpu/model_bridge.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "device/caching_allocator.h"
#include "gpu/blas.h"
#include "gpu/copy_engine.h"
#include "gpu/cuda_device.h"
#include "gpu/cuda_error.h"
#include "gpu/device.h"
#include "gpu/device_allocator.h"
#include "gpu/gpu_pass.h"
#include "gpu/host_staging.h"
#include "gpu/kernels.h"
#include "gpu/param_bridge.h"
#include "gpu/stream.h"
#include "zinf/optim/half.h"

namespace zinf::gpu {

// Members are declared so that they are destroyed in a safe order: blocks before their
// allocator, the net before its Blas, the allocator (which waits for its fences) before the
// streams those fences are on.
class GpuModelBridge final : public GpuParamAccess {
 public:
  std::unique_ptr<model::Model> cpu;  // the parameter and module lists, config_json, describe
  std::string label;                  // "GPT", "Llama": names the streams, events and memory
  int device = 0;
  DeviceInfo info;
  Stream compute;
  Event compute_mark;  // the compute stream's work so far, for copies into reused blocks
  std::unique_ptr<CopyEngine> copies;
  std::unique_ptr<CachingAllocator> alloc;
  std::unique_ptr<Blas> blas;
  std::unique_ptr<GpuNet> net;
  std::unique_ptr<BridgeLedger> ledger;
  HostStaging staging;  // bf16 values on the way up, fp32 gradients on the way down
  DeviceBlock workspace;
  int max_bt = 0;
  GpuModelTimes times;
  // Timing events on the compute stream, pairs (start, end) of its busy segments in the current
  // pass; grown on demand and reused across passes.
  std::vector<Event> marks;
  std::size_t marks_used = 0;
  // The device interface over the streams and allocator above (model::Model::compute_device());
  // declared after them, so it goes first. With device_memory the engine gathers into it.
  std::unique_ptr<device::Device> device_view;
  bool device_memory = false;

  // The current pass.
  model::ParamAccess* host = nullptr;
  std::vector<DeviceBlock> values;               // per module, while acquired
  std::vector<DeviceBlock> grads;                // per parameter, from its first grad_buffers to its owner's grads_ready
  std::vector<std::vector<float*>> host_grads;   // per module, from host grad_buffers
  std::vector<const float*> host_values;
  std::vector<const std::uint16_t*> bf16_values;
  bool no_bf16_in_place = false;  // the engine answered acquire_bf16 with kUnsupported once

  const model::ModuleSpec& module_spec(int m) const { return cpu->modules()[static_cast<std::size_t>(m)]; }
  const model::ParamSpec& param_spec(int p) const { return cpu->params()[static_cast<std::size_t>(p)]; }

  Status reserve_bt(int bt);
  Result<float> pass(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B, int T,
                     model::ParamAccess& access, const float* loss_scale);
  void drop_pass_memory();

  Status acquire(int m, model::Phase phase, std::span<const bf16*> out) override;
  Status release(int m, model::Phase phase) override;
  Status grad_buffers(int m, std::span<float*> out) override;
  Status grads_ready(int m) override;

 private:
  // Records the next timing event on the compute stream: segment starts and ends alternate.
  Status mark();
  // Adds the current pass's busy segments to times.gpu_compute_s (the stream must be idle).
  Status add_segments();
  Status values_to_device(int m, std::span<const bf16*> out);
  Status download_and_add(int m, std::span<const int> done);
};

Status GpuModelBridge::reserve_bt(int bt) {
  if (bt <= max_bt) return Status::ok();
  const uint64_t bytes = net->workspace_bytes_for(bt);
  // The old workspace goes back to the compute stream's cache: stream order protects its last pass.
  workspace.reset();
  max_bt = 0;
  ZINF_ASSIGN_OR_RETURN(workspace, alloc->allocate(bytes, compute.key(),
                                                   fmt::format("{} workspace for B*T = {} positions", label, bt)));
  ZINF_RETURN_IF_ERROR(net->bind_workspace(workspace.data(), bytes, bt));
  max_bt = bt;
  return Status::ok();
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Status GpuModelBridge::mark() {
  if (marks_used == marks.size()) {
    ZINF_ASSIGN_OR_RETURN(Event e, Event::create(device, label + " compute timing", /*timing=*/true));
    marks.push_back(std::move(e));
  }
  return marks[marks_used++].record(compute);
}

Status GpuModelBridge::add_segments() {
  double ms = 0;
  for (std::size_t i = 0; i + 1 < marks_used; i += 2) {
    ZINF_ASSIGN_OR_RETURN(const float seg, marks[i + 1].elapsed_ms_since(marks[i]));
    ms += seg;
  }
  times.gpu_compute_s += ms / 1e3;
  marks_used = 0;
  return Status::ok();
}

void GpuModelBridge::drop_pass_memory() {
  // Returned on the compute stream they were allocated for (stream order protects queued
  // kernels); copies into them are declared with record_use.
  for (DeviceBlock& b : values) b.reset();
  for (DeviceBlock& b : grads) b.reset();
  host = nullptr;
}

Result<float> GpuModelBridge::pass(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B, int T,
                                    model::ParamAccess& access, const float* loss_scale) {
  ZINF_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::enter(device));
  ZINF_RETURN_IF_ERROR(reserve_bt(B * T));
  ledger->begin_pass();
  drop_pass_memory();
  host = &access;
  const auto t0 = Clock::now();
  marks_used = 0;
  ZINF_RETURN_IF_ERROR(mark());
  Result<float> loss = loss_scale != nullptr ? net->forward_backward(inputs, targets, B, T, *this, *loss_scale)
                                             : net->forward_loss(inputs, targets, B, T, *this);
  drop_pass_memory();
  if (!loss.is_ok()) return loss.status();
  ZINF_RETURN_IF_ERROR(mark());
  ZINF_RETURN_IF_ERROR(compute.synchronize());
  ZINF_RETURN_IF_ERROR(add_segments());
  times.pass_s += seconds_since(t0);
  ++times.passes;
  ZINF_RETURN_IF_ERROR(ledger->check_pass_end());
  return loss;
}

Status GpuModelBridge::acquire(int m, model::Phase phase, std::span<const bf16*> out) {
  ZINF_RETURN_IF_ERROR(ledger->acquire(m));
  const model::ModuleSpec& mod = module_spec(m);
  if (out.size() != mod.params.size()) {
    (void)ledger->release(m);
    return Status::internal(fmt::format("acquire '{}': {} value slots for {} parameters", mod.name, out.size(),
                                        mod.params.size()));
  }
  auto t0 = Clock::now();
  if (device_memory && !no_bf16_in_place) {
    // The engine's own bf16 copy in GPU memory (the state on the device): read in place.
    bf16_values.assign(mod.params.size(), nullptr);
    Status in_place = host->acquire_bf16(m, phase, bf16_values);
    times.host_acquire_s += seconds_since(t0);
    if (in_place.is_ok()) {
      for (std::size_t k = 0; k < mod.params.size(); ++k) out[k] = reinterpret_cast<const bf16*>(bf16_values[k]);
      return Status::ok();
    }
    if (in_place.code() != ErrorCode::kUnsupported) {
      (void)ledger->release(m);
      return in_place;
    }
    no_bf16_in_place = true;  // the engine keeps no such copy: fp32 values from now on
    t0 = Clock::now();
  }
  host_values.assign(mod.params.size(), nullptr);
  Status s = host->acquire(m, phase, host_values);
  times.host_acquire_s += seconds_since(t0);
  if (!s.is_ok()) {
    (void)ledger->release(m);
    return s;
  }
  t0 = Clock::now();
  s = values_to_device(m, out);
  times.upload_s += seconds_since(t0);
  if (!s.is_ok()) {
    // Not acquired as far as the model knows: undo the host side (a second error is dropped).
    values[static_cast<std::size_t>(m)].reset();
    (void)ledger->release(m);
    (void)host->release(m, phase);
    return s;
  }
  return Status::ok();
}

// Module m's values as bf16 in one device block (the ledger's layout), from host_values: cast on
// the host into pinned staging and uploaded in one copy, waited for (the bridge); or, with device
// memory, cast on the compute stream from the engine's fp32 device values, which kernels enqueued
// from now on may read (the engine made the compute stream wait for their upload). Both casts are
// optim::f32_to_bf16_bits, bit for bit.
Status GpuModelBridge::values_to_device(int m, std::span<const bf16*> out) {
  const model::ModuleSpec& mod = module_spec(m);
  const PackedLayout& l = ledger->value_layout(m);
  const std::string what = fmt::format("module '{}' values ({} parameters, {} bytes bf16)", mod.name,
                                       mod.params.size(), l.bytes);
  ZINF_ASSIGN_OR_RETURN(DeviceBlock block, alloc->allocate(l.bytes, compute.key(), what));
  for (std::size_t k = 0; k < mod.params.size(); ++k) {
    const float* src = host_values[k];
    if (src == nullptr) {
      return Status::internal(fmt::format("{}: the engine gave no values for '{}'", what, param_spec(mod.params[k]).name));
    }
    const std::size_t n = param_spec(mod.params[k]).numel;
    if (device_memory) {
      auto* dst = reinterpret_cast<bf16*>(static_cast<std::byte*>(block.data()) + l.offsets[k]);
      ZINF_RETURN_IF_ERROR(cast_to_bf16(dst, src, n, compute.get()).with_context(what));
    } else {
      auto* dst = reinterpret_cast<uint16_t*>(staging.bytes() + l.offsets[k]);
      for (std::size_t i = 0; i < n; ++i) dst[i] = optim::f32_to_bf16_bits(src[i]);
    }
  }
  if (!device_memory) {
    // A block reused from the cache may still be read by queued kernels: the copy waits for them.
    // The compute stream's busy segment ends here and resumes once the upload has landed.
    ZINF_RETURN_IF_ERROR(mark());
    ZINF_RETURN_IF_ERROR(compute_mark.record(compute));
    block.record_use(copies->h2d_stream().key());
    ZINF_ASSIGN_OR_RETURN(Event copied, copies->copy_h2d(block.data(), staging.data(), l.bytes, &compute_mark, what));
    ZINF_RETURN_IF_ERROR(compute.wait(copied));
    ZINF_RETURN_IF_ERROR(mark());
    ZINF_RETURN_IF_ERROR(copied.synchronize().with_context(what));  // staging is free again
    times.upload_bytes += l.bytes;
  }
  for (std::size_t k = 0; k < mod.params.size(); ++k) {
    out[k] = reinterpret_cast<const bf16*>(static_cast<const std::byte*>(block.data()) + l.offsets[k]);
  }
  values[static_cast<std::size_t>(m)] = std::move(block);
  return Status::ok();
}

Status GpuModelBridge::release(int m, model::Phase phase) {
  ZINF_RETURN_IF_ERROR(ledger->release(m));
  // Back to the compute stream's cache: later kernels on it run after the ones that read it,
  // and an upload into it waits for compute_mark. The host values were consumed at acquire.
  values[static_cast<std::size_t>(m)].reset();
  return host->release(m, phase);
}

Status GpuModelBridge::grad_buffers(int m, std::span<float*> out) {
  const model::ModuleSpec& mod = module_spec(m);
  if (out.size() != mod.params.size()) {
    return Status::internal(fmt::format("grad_buffers '{}': {} slots for {} parameters", mod.name, out.size(),
                                        mod.params.size()));
  }
  std::vector<float*>& hg = host_grads[static_cast<std::size_t>(m)];
  hg.assign(mod.params.size(), nullptr);
  ZINF_RETURN_IF_ERROR(host->grad_buffers(m, hg));
  ZINF_ASSIGN_OR_RETURN(const std::vector<int> fresh, ledger->open_grads(m));
  if (device_memory) {
    // The engine's device buffers, zeroed on the compute stream; the net adds into them.
    for (std::size_t k = 0; k < mod.params.size(); ++k) {
      if (hg[k] == nullptr) {
        return Status::internal(fmt::format("the engine gave no gradient buffer for '{}'", param_spec(mod.params[k]).name));
      }
      out[k] = hg[k];
    }
    return Status::ok();
  }
  for (const int p : fresh) {
    const model::ParamSpec& s = param_spec(p);
    const std::size_t bytes = s.numel * sizeof(float);
    const std::string what = fmt::format("gradient of '{}' ({} fp32)", s.name, s.numel);
    ZINF_ASSIGN_OR_RETURN(grads[static_cast<std::size_t>(p)], alloc->allocate(bytes, compute.key(), what));
    ZINF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(grads[static_cast<std::size_t>(p)].data(), 0, bytes, compute.get()),
                              fmt::format("zero the {}", what));
  }
  for (std::size_t k = 0; k < mod.params.size(); ++k) out[k] = grads[static_cast<std::size_t>(mod.params[k])].as<float>();
  return Status::ok();
}

Status GpuModelBridge::grads_ready(int m) {
  ZINF_ASSIGN_OR_RETURN(const std::vector<int> done, ledger->close_grads(m));
  // With device memory the engine downloads the gradients after the kernels enqueued so far.
  if (!done.empty() && !device_memory) {
    const auto t0 = Clock::now();
    ZINF_RETURN_IF_ERROR(mark());  // the compute stream idles from here until the next kernel
    ZINF_RETURN_IF_ERROR(download_and_add(m, done));
    ZINF_RETURN_IF_ERROR(mark());
    times.download_s += seconds_since(t0);
  }
  const auto t1 = Clock::now();
  Status s = host->grads_ready(m);
  times.host_grads_ready_s += seconds_since(t1);
  return s;
}

// Copies the gradients complete at grads_ready(m) into pinned staging once the kernels that
// wrote them have run, ADDS them into the host's buffers, and drops the device buffers.
Status GpuModelBridge::download_and_add(int m, std::span<const int> done) {
  const model::ModuleSpec& mod = module_spec(m);
  const PackedLayout& l = ledger->owned_grad_layout(m);
  ZINF_RETURN_IF_ERROR(compute_mark.record(compute));
  Event last;
  for (std::size_t j = 0; j < done.size(); ++j) {
    const model::ParamSpec& s = param_spec(done[j]);
    DeviceBlock& g = grads[static_cast<std::size_t>(done[j])];
    g.record_use(copies->d2h_stream().key());
    ZINF_ASSIGN_OR_RETURN(last, copies->copy_d2h(staging.bytes() + l.offsets[j], g.data(), s.numel * sizeof(float),
                                                 j == 0 ? &compute_mark : nullptr,
                                                 fmt::format("gradient of '{}' ({} fp32)", s.name, s.numel)));
  }
  // One stream: the last copy's completion means all of them are done.
  ZINF_RETURN_IF_ERROR(last.synchronize().with_context(fmt::format("gradients of module '{}'", mod.name)));
  const std::vector<float*>& hg = host_grads[static_cast<std::size_t>(m)];
  for (std::size_t j = 0; j < done.size(); ++j) {
    const auto k = static_cast<std::size_t>(std::find(mod.params.begin(), mod.params.end(), done[j]) - mod.params.begin());
    float* dst = hg[k];
    const model::ParamSpec& s = param_spec(done[j]);
    if (dst == nullptr) return Status::internal(fmt::format("the host gave no gradient buffer for '{}'", s.name));
    const auto* src = reinterpret_cast<const float*>(staging.bytes() + l.offsets[j]);
    for (std::size_t i = 0; i < s.numel; ++i) dst[i] += src[i];
    times.download_bytes += s.numel * sizeof(float);
    grads[static_cast<std::size_t>(done[j])].reset();
  }
  return Status::ok();
}

Status BridgedGpuModel::attach(std::unique_ptr<model::Model> cpu, std::string label, GpuModelOptions options,
                               const MakeGpuNet& make_net) {
  auto impl = std::make_unique<GpuModelBridge>();
  impl->cpu = std::move(cpu);
  impl->label = std::move(label);
  const std::string& name = impl->label;
  const int d = options.device;
  impl->device = d;
  ZINF_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::enter(d));
  ZINF_ASSIGN_OR_RETURN(impl->info, device_info(d));
  ZINF_ASSIGN_OR_RETURN(impl->compute, Stream::create(d, name + " compute"));
  ZINF_ASSIGN_OR_RETURN(impl->compute_mark, Event::create(d, name + " compute mark"));
  ZINF_ASSIGN_OR_RETURN(impl->copies, CopyEngine::create(d));
  ZINF_ASSIGN_OR_RETURN(impl->alloc, make_device_allocator(d, options.memory_cap));
  ZINF_ASSIGN_OR_RETURN(Blas blas, Blas::create());
  impl->blas = std::make_unique<Blas>(std::move(blas));
  ZINF_ASSIGN_OR_RETURN(impl->net, make_net(impl->blas.get(), impl->compute.get()));
  ZINF_ASSIGN_OR_RETURN(BridgeLedger ledger, BridgeLedger::create(impl->cpu->params(), impl->cpu->modules()));
  impl->ledger = std::make_unique<BridgeLedger>(std::move(ledger));
  const std::size_t staging_bytes = impl->ledger->staging_bytes();
  ZINF_ASSIGN_OR_RETURN(impl->staging,
                        HostStaging::allocate(staging_bytes, name + " pinned staging", options.staging_host_alloc));
  impl->values.resize(impl->cpu->modules().size());
  impl->grads.resize(impl->cpu->params().size());
  impl->host_grads.resize(impl->cpu->modules().size());
  ZINF_ASSIGN_OR_RETURN(impl->device_view, make_cuda_device_view(d, impl->compute, *impl->copies, *impl->alloc));
  bridge_ = std::move(impl);
  return Status::ok();
}

BridgedGpuModel::BridgedGpuModel() = default;
BridgedGpuModel::~BridgedGpuModel() = default;

const model::Model& BridgedGpuModel::cpu_model() const { return *bridge_->cpu; }
std::string_view BridgedGpuModel::type() const { return bridge_->cpu->type(); }
std::string BridgedGpuModel::describe() const {
  return fmt::format("{} on GPU {} ({})", bridge_->cpu->describe(), bridge_->device, bridge_->info.name);
}
std::string BridgedGpuModel::config_json() const { return bridge_->cpu->config_json(); }
std::span<const model::ParamSpec> BridgedGpuModel::params() const { return bridge_->cpu->params(); }
std::span<const model::ModuleSpec> BridgedGpuModel::modules() const { return bridge_->cpu->modules(); }
GpuModelTimes BridgedGpuModel::times() const { return bridge_->times; }
device::Device* BridgedGpuModel::compute_device() { return bridge_->device_view.get(); }
Status BridgedGpuModel::use_device_memory() {
  bridge_->device_memory = true;
  return Status::ok();
}
int BridgedGpuModel::vocab_size() const { return bridge_->cpu->vocab_size(); }
int BridgedGpuModel::max_seq() const { return bridge_->cpu->max_seq(); }
int BridgedGpuModel::hidden_size() const { return bridge_->cpu->hidden_size(); }

Result<float> BridgedGpuModel::forward_backward(std::span<const int32_t> inputs, std::span<const int32_t> targets,
                                                int B, int T, model::ParamAccess& access, float loss_scale) {
  ZINF_RETURN_IF_ERROR(model::check_batch(*this, inputs, targets, B, T));
  return bridge_->pass(inputs, targets, B, T, access, &loss_scale);
}

Result<float> BridgedGpuModel::forward_loss(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B,
                                            int T, model::ParamAccess& access) {
  ZINF_RETURN_IF_ERROR(model::check_batch(*this, inputs, targets, B, T));
  return bridge_->pass(inputs, targets, B, T, access, nullptr);
}

Status BridgedGpuModel::reserve(int B, int T) {
  if (B < 1 || T < 1 || T > max_seq()) {
    return Status::invalid_argument(fmt::format("reserve: B {} and T {} (1 <= T <= {})", B, T, max_seq()));
  }
  ZINF_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::enter(bridge_->device));
  return bridge_->reserve_bt(B * T);
}

uint64_t BridgedGpuModel::activation_bytes(int B, int T) const { return bridge_->net->workspace_bytes_for(B * T); }

}  // namespace zinf::gpu
