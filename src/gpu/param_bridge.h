// Internal: the bookkeeping of GptGpuModel's bridge from a host model::ParamAccess to the device
// (what to upload at acquire, which gradient buffers to create, zero and download when), kept
// free of CUDA so that the host tests check it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "zinf/model/params.h"
#include "zinf/status.h"

namespace zinf::gpu {

// Byte offsets of tensors of `numels` elements of `elem_bytes` each, packed into one allocation
// with every view aligned to `align` bytes (a power of two). bytes: the allocation's size.
struct PackedLayout {
  std::vector<std::size_t> offsets;
  std::size_t bytes = 0;
};
PackedLayout pack_layout(std::span<const std::size_t> numels, std::size_t elem_bytes, std::size_t align = 256);

// Follows one pass's protocol calls (params.h) and says what each one must move. Gradients: a
// parameter gets one device fp32 buffer per pass, created and zeroed at the first grad_buffers()
// of a module that lists it, handed out again to every later module that lists it (the tied
// wte), and downloaded and added into the host's gradient at grads_ready() of its owning module
// (ParamSpec::module, the last in backward to touch it), after which it is dropped. So the tied
// wte crosses to the host once per pass, with the sum of both modules' contributions.
//
// Every call checks the protocol (a module acquired twice, released or made ready without being
// opened, a gradient left on the device) and names the module or parameter. Not thread-safe.
class BridgeLedger {
 public:
  static Result<BridgeLedger> create(std::span<const model::ParamSpec> params,
                                     std::span<const model::ModuleSpec> modules);

  // Forgets the previous pass (also one that ended in an error).
  void begin_pass();
  Status acquire(int module);
  Status release(int module);
  // Parameter indices of `module` whose device gradient buffer must be created and zeroed now.
  Result<std::vector<int>> open_grads(int module);
  // Parameter indices whose gradient is complete at grads_ready(module): download them, add
  // them into the host buffers, then drop their device buffers.
  Result<std::vector<int>> close_grads(int module);
  // After a pass that returned OK: nothing acquired, no module's gradients open, no gradient
  // left on the device.
  Status check_pass_end() const;

  bool acquired(int module) const { return acquired_[static_cast<std::size_t>(module)]; }
  bool grad_live(int param) const { return grad_live_[static_cast<std::size_t>(param)]; }
  // Packed bf16 values of `module`'s parameters (one upload), and packed fp32 gradients of the
  // parameters it owns (one staging area for their downloads).
  const PackedLayout& value_layout(int module) const { return value_layouts_[static_cast<std::size_t>(module)]; }
  const PackedLayout& owned_grad_layout(int module) const { return grad_layouts_[static_cast<std::size_t>(module)]; }
  // The parameters `module` owns, in the order of owned_grad_layout(module).
  std::span<const int> owned(int module) const { return owned_[static_cast<std::size_t>(module)]; }
  // The pinned staging the bridge needs: the largest of the value and owned-gradient layouts.
  std::size_t staging_bytes() const { return staging_bytes_; }

 private:
  BridgeLedger() = default;
  Status check_module(int module, const char* call) const;

  std::vector<model::ParamSpec> params_;
  std::vector<model::ModuleSpec> modules_;
  std::vector<PackedLayout> value_layouts_, grad_layouts_;
  std::vector<std::vector<int>> owned_;
  std::size_t staging_bytes_ = 0;
  std::vector<bool> acquired_, grads_open_, grad_live_;
};

}  // namespace zinf::gpu
