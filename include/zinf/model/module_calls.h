// Helpers that run one module's forward or backward under the ParamAccess protocol (params.h),
// so that a Model implementation cannot forget a release() or a grads_ready().
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "zinf/model/params.h"
#include "zinf/status.h"

namespace zinf::model {

// Pointer slots for one module's parameters: inline up to kInline, on the heap beyond (modules
// may have any number of parameters; the common case allocates nothing).
template <typename T>
class PointerSlots {
 public:
  static constexpr std::size_t kInline = 8;
  explicit PointerSlots(std::size_t n) : n_(n) {
    if (n > kInline) heap_.resize(n);
  }
  T* data() { return n_ > kInline ? heap_.data() : inline_.data(); }
  std::span<T> span() { return {data(), n_}; }

 private:
  std::size_t n_;
  std::array<T, kInline> inline_{};
  std::vector<T> heap_;
};

namespace detail {
inline Status in_module(const Status& s, const ModuleSpec& spec, std::string_view what) {
  return s.with_context(std::string(spec.name) + " " + std::string(what));
}
}  // namespace detail

// acquire(m, phase), body(values), release(m, phase). values[k] is parameter
// modules[m].params[k]. Errors from the access name the module and phase.
template <typename Body>
Status run_module_forward(ParamAccess& access, std::span<const ModuleSpec> modules, int m, Phase phase,
                          Body&& body) {
  const ModuleSpec& spec = modules[static_cast<std::size_t>(m)];
  PointerSlots<const float*> values(spec.params.size());
  Status s = access.acquire(m, phase, values.span());
  if (!s.is_ok()) return detail::in_module(s, spec, phase_name(phase));
  body(values.data());
  s = access.release(m, phase);
  if (!s.is_ok()) return detail::in_module(s, spec, phase_name(phase));
  return Status::ok();
}

// [acquire(m, kBackward)], grad_buffers(m), body(values, grads), [release], grads_ready(m).
// values is all null when the module's backward reads no values (backward_reads_values false).
template <typename Body>
Status run_module_backward(ParamAccess& access, std::span<const ModuleSpec> modules, int m, Body&& body) {
  const ModuleSpec& spec = modules[static_cast<std::size_t>(m)];
  const std::size_t n = spec.params.size();
  PointerSlots<const float*> values(n);
  PointerSlots<float*> grads(n);
  const bool reads = spec.backward_reads_values;
  Status s;
  if (reads) s = access.acquire(m, Phase::kBackward, values.span());
  if (!s.is_ok()) return detail::in_module(s, spec, "backward");
  s = access.grad_buffers(m, grads.span());
  if (!s.is_ok()) {
    if (reads) (void)access.release(m, Phase::kBackward);
    return detail::in_module(s, spec, "backward");
  }
  body(values.data(), grads.data());
  if (reads) s = access.release(m, Phase::kBackward);
  if (s.is_ok()) s = access.grads_ready(m);
  if (!s.is_ok()) return detail::in_module(s, spec, "backward");
  return Status::ok();
}

}  // namespace zinf::model
