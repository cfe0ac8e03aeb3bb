// Internal: what the whole-model GPU passes (GptGpu, LlamaGpu) share: the device ParamAccess they
// call, the interface GpuModelBridge drives them through, the module-call wrappers, 256-byte
// aligned workspace views, and a pass's token ids on the device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "gpu/blas.h"
#include "gpu/launch_geometry.h"
#include "gpu/numerics.h"
#include "zinf/model/module_calls.h"
#include "zinf/model/params.h"
#include "zinf/status.h"

namespace zinf::gpu {

// The device twin of model::ParamAccess (params.h): the same calls in the same order for the
// same modules and phases, with bf16 parameter values and fp32 gradient buffers in device
// memory. The model ADDS the gradient of (loss * loss_scale) to the buffers grad_buffers()
// gives (the owner decides whether they start at zero); a parameter listed by two modules
// (a tied embedding) must get the same buffer both times.
//
// Stream ordering: the models only enqueue work on their stream, so when release(m) or
// grads_ready(m) is called the kernels reading m's values or writing m's gradients may not
// have run yet. The owner must order itself after them: record an event on the model's stream
// in release()/grads_ready() and wait for it (or on it) before reusing or reading the memory.
class GpuParamAccess {
 public:
  virtual ~GpuParamAccess() = default;
  virtual Status acquire(int module, model::Phase phase, std::span<const bf16*> values) = 0;
  virtual Status release(int module, model::Phase phase) = 0;
  virtual Status grad_buffers(int module, std::span<float*> grads) = 0;
  virtual Status grads_ready(int module) = 0;
};

// A whole model's forward and backward on the GPU over a GpuParamAccess (GptGpu, LlamaGpu): what
// GpuModelBridge (model_bridge.h) needs of it.
class GpuNet {
 public:
  virtual ~GpuNet() = default;
  // Bytes of device workspace for passes of up to max_bt = B*T positions (0 for max_bt < 1).
  virtual uint64_t workspace_bytes_for(int max_bt) const = 0;
  // Passes use `base`: device memory, 256-byte aligned, `bytes` >= workspace_bytes_for(max_bt),
  // owned by the caller and left alone until the next bind or this object's end.
  virtual Status bind_workspace(void* base, uint64_t bytes, int max_bt) = 0;
  // One micro-batch: inputs and targets are (B, T) host token ids in [0, vocab_size), with
  // 1 <= T <= max_seq and B*T <= the bound max_bt. Returns the mean cross-entropy and ADDS the
  // gradients of (loss * loss_scale) to the buffers access.grad_buffers() gives.
  virtual Result<float> forward_backward(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B,
                                         int T, GpuParamAccess& access, float loss_scale) = 0;
  // Evaluation: the same loss, no gradients (Phase::kEval).
  virtual Result<float> forward_loss(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B, int T,
                                     GpuParamAccess& access) = 0;
};

inline constexpr uint64_t kViewAlign = 256;

// 256-byte aligned views of one device allocation; with base == nullptr it only counts, so
// one function both sizes and points the workspace (as model/carver.h on the CPU).
class Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  template <typename T>
  T* take(size_t n) {
    T* p = base_ != nullptr ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += (n * sizeof(T) + kViewAlign - 1) / kViewAlign * kViewAlign;
    return p;
  }
  uint64_t used() const { return used_; }

 private:
  char* base_;
  uint64_t used_ = 0;
};

// The checks every bind_workspace makes: max_bt in [1, INT_MAX / 4], base non-null and 256-byte
// aligned, bytes >= need; invalid_argument naming `who` otherwise.
Status check_workspace(std::string_view who, const void* base, uint64_t bytes, int max_bt, uint64_t need);

namespace detail {
inline Status in_gpu_module(const Status& s, const model::ModuleSpec& spec, std::string_view what) {
  return s.with_context("gpu " + spec.name + " " + std::string(what));
}
}  // namespace detail

// acquire(m, phase), body(values), release(m, phase); a failed body still releases (a second
// error is dropped) and its error is returned, naming the module and phase.
template <typename Body>
Status run_forward(GpuParamAccess& access, std::span<const model::ModuleSpec> modules, int m, model::Phase phase,
                   Body&& body) {
  const model::ModuleSpec& spec = modules[static_cast<size_t>(m)];
  model::PointerSlots<const bf16*> values(spec.params.size());
  Status s = access.acquire(m, phase, values.span());
  if (!s.is_ok()) return detail::in_gpu_module(s, spec, model::phase_name(phase));
  const Status b = body(values.data());
  s = access.release(m, phase);
  if (!b.is_ok()) return detail::in_gpu_module(b, spec, model::phase_name(phase));
  if (!s.is_ok()) return detail::in_gpu_module(s, spec, model::phase_name(phase));
  return Status::ok();
}

// [acquire(m, kBackward)], grad_buffers(m), body(values, grads), [release], grads_ready(m);
// grads_ready is not called when the body failed (the gradients are incomplete).
template <typename Body>
Status run_backward(GpuParamAccess& access, std::span<const model::ModuleSpec> modules, int m, Body&& body) {
  const model::ModuleSpec& spec = modules[static_cast<size_t>(m)];
  const size_t n = spec.params.size();
  model::PointerSlots<const bf16*> values(n);
  model::PointerSlots<float*> grads(n);
  const bool reads = spec.backward_reads_values;
  Status s;
  if (reads) s = access.acquire(m, model::Phase::kBackward, values.span());
  if (!s.is_ok()) return detail::in_gpu_module(s, spec, "backward");
  s = access.grad_buffers(m, grads.span());
  if (!s.is_ok()) {
    if (reads) (void)access.release(m, model::Phase::kBackward);
    return detail::in_gpu_module(s, spec, "backward");
  }
  const Status b = body(values.data(), grads.data());
  if (reads) s = access.release(m, model::Phase::kBackward);
  if (!b.is_ok()) return detail::in_gpu_module(b, spec, "backward");
  if (s.is_ok()) s = access.grads_ready(m);
  if (!s.is_ok()) return detail::in_gpu_module(s, spec, "backward");
  return Status::ok();
}

// One pass's token ids on the device: inputs and targets (N), and for a training pass the
// embedding backward's buckets (make_embedding_buckets) of the inputs.
class PassTokens {
 public:
  // Views for passes of up to max_bt positions (Carver: counts, or points into the workspace).
  void carve(Carver& cv, size_t max_bt);
  // After carve() into a bound workspace. Checks a pass before anything is enqueued (invalid_argument naming `who`): B, T >= 1,
  // T <= max_seq, B*T <= max_bt, B*T ids and targets, every target and input id in [0, vocab);
  // then copies the ids (and, with backward, the buckets) to the device on `stream`.
  Status begin(std::string_view who, std::span<const int32_t> inputs, std::span<const int32_t> targets, int B, int T,
               int vocab, int max_seq, int max_bt, bool backward, cudaStream_t stream);

  const int32_t* inputs() const { return inputs_; }
  const int32_t* targets() const { return targets_; }
  const int32_t* bucket_tokens() const { return bucket_tokens_; }
  const int32_t* bucket_starts() const { return bucket_starts_; }
  const int32_t* bucket_positions() const { return bucket_positions_; }
  int num_buckets() const { return static_cast<int>(buckets_.tokens.size()); }

 private:
  int32_t* inputs_ = nullptr;            // (N)
  int32_t* targets_ = nullptr;           // (N)
  int32_t* bucket_tokens_ = nullptr;     // (<= N) EmbeddingBuckets
  int32_t* bucket_starts_ = nullptr;     // (<= N+1)
  int32_t* bucket_positions_ = nullptr;  // (N)
  EmbeddingBuckets buckets_;             // of the current pass's inputs (host)
};

// The pass every whole-model net runs (GptGpu, LlamaGpu): check and upload the batch's ids
// (PassTokens), the forward on the stream (and the backward), then read the mean loss back (one
// stream synchronisation). The net supplies the workspace and the passes.
class GpuPassNet : public GpuNet {
 public:
  Result<float> forward_backward(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B, int T,
                                 GpuParamAccess& access, float loss_scale) final;
  Result<float> forward_loss(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B, int T,
                             GpuParamAccess& access) final;
  cudaStream_t stream() const { return stream_; }

 protected:
  // `name` names the net in errors ("GptGpu"); vocab and max_seq bound the batch's ids and T.
  GpuPassNet(const char* name, cudaStream_t stream, int vocab, int max_seq)
      : name_(name), stream_(stream), vocab_(vocab), max_seq_(max_seq) {}

  // The bound workspace's token views and mean loss; nullptr before bind_workspace.
  virtual PassTokens* pass_tokens() = 0;
  virtual const float* pass_loss() const = 0;
  // A net's own limit on T beyond max_seq (Llama's sliding window); OK by default.
  virtual Status check_seq(int /*T*/) const { return Status::ok(); }
  // Enqueues the forward (Phase::kForward: and d(loss * loss_scale)/dlogits; kEval: the loss).
  virtual Status forward_pass(int B, int T, GpuParamAccess& access, model::Phase phase, float loss_scale) = 0;
  // Enqueues the backward after a kForward forward_pass.
  virtual Status backward_pass(int B, int T, GpuParamAccess& access) = 0;

  // The LM head (module `head`, tied or not) and the loss: logits (N, logits_ld(V)) = x (N,C) @
  // W^T, the per-position cross-entropies `losses` (N) and their mean `loss` (1); with
  // Phase::kForward the logits are then overwritten by d(loss * loss_scale)/dlogits (the mean
  // puts 1/N on every row).
  // padded_weight: head_weight_pad_elems(V, C) elements (nullptr when that is 0): the head's
  // weight is copied there with zero rows up to logits_ld(V), and the products use it.
  struct HeadBuffers {
    bf16* logits;
    float* losses;
    float* loss;
    const int32_t* targets;
    bf16* padded_weight;
  };
  Status head_forward(Blas& blas, GpuParamAccess& access, std::span<const model::ModuleSpec> modules, int head,
                      model::Phase phase, const bf16* x, const HeadBuffers& h, int N, int C, float loss_scale);
  // Its backward from those logits: dx (N,C) bf16 overwritten, the weight's gradient added; then
  // dres (N,C) fp32, the residual stream's gradient, zeroed for the layers below to add into.
  Status head_backward(Blas& blas, GpuParamAccess& access, std::span<const model::ModuleSpec> modules, int head,
                       const bf16* x, const bf16* logits, bf16* padded_weight, bf16* dx, float* dres, int N, int C);

  const char* name_;
  cudaStream_t stream_;
  int max_bt_ = 0;  // of the bound workspace

 private:
  // The head's weight for its products: `w` itself, or its copy in `padded` (zero rows up to
  // logits_ld(V)); `rows` is set to the rows the products see.
  Result<const bf16*> head_weight(const bf16* w, bf16* padded, int C, int* rows);
  Status begin_pass(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B, int T, bool backward);
  Result<float> read_loss();
  int vocab_, max_seq_;
};

}  // namespace zinf::gpu
