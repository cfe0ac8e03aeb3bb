// Model: the interface the ZeRO-3 engine trains. A network describes its parameters and the
// modules that use them, and runs forward and backward reading parameters through a ParamAccess.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "zinf/model/matmul.h"
#include "zinf/model/params.h"
#include "zinf/status.h"

namespace zinf::device {
class Device;  // src/device/device.h (internal)
}  // namespace zinf::device

namespace zinf::model {

// A token model: inputs and targets are (B, T) token ids, the loss is a mean over positions.
// GptModel implements it; so can a C++ user's own network (examples/mlp_model).
//
// The model owns no parameters: it lists them (params(), modules()) and reads them through the
// ParamAccess it is given, module by module, following the protocol in params.h. It owns its
// activations. The engine partitions, gathers, offloads and updates the parameters; it needs
// nothing else from the model, so any implementation that keeps the protocol trains under every
// ZeRO-3 configuration zinf supports (memory, CPU or NVMe offload, any number of ranks).
//
// Contract for params() and modules() (validate_layout() checks it; the engine calls it):
// - params()[i].index == i; names are unique and non-empty; numel is the product of shape.
// - params()[i].module is the module that owns parameter i: it lists i, and its grads_ready() is
//   the last one in backward to touch i (the engine reduces i's gradient after it).
// - modules()[m].params lists distinct parameter indices; a parameter may be listed by several
//   modules (a tied embedding), and every parameter by at least its owner.
// - Both lists are fixed for the model's life, and every pass requests modules in an order
//   that depends only on the configuration (the engine records it once and prefetches by it).
//
// Not thread-safe: one pass at a time.
class Model {
 public:
  virtual ~Model() = default;

  // Short architecture name, stored in checkpoints: "gpt", or the user's own.
  virtual std::string_view type() const = 0;
  // One line for start-up output, e.g. "gpt: 6 layers, hidden 384, 6 heads, seq 256, vocab 256".
  virtual std::string describe() const = 0;
  // The architecture as a JSON object text with at least {"type": type()}. Checkpoints record
  // it, a resume compares it, and models with equal config_json() have the same params() and
  // modules(). Run-time choices that change no result bit (activation checkpointing) stay out.
  virtual std::string config_json() const = 0;

  virtual std::span<const ParamSpec> params() const = 0;
  virtual std::span<const ModuleSpec> modules() const = 0;

  // Token ids a batch may hold are [0, vocab_size()); sequences are 1..max_seq() long.
  virtual int vocab_size() const = 0;
  virtual int max_seq() const = 0;
  // The width ds_config's "auto" bucket sizes derive from (HF's config.hidden_size); 0 when the
  // model has none, and then those "auto" values need --hidden-size.
  virtual int hidden_size() const { return 0; }

  // One training micro-batch: (B, T) inputs and targets. Returns the mean loss over the B*T
  // positions and ADDS the gradients of (loss * loss_scale) to the buffers given by
  // access.grad_buffers(). An error (bad batch, or one returned by `access`) ends the pass.
  virtual Result<float> forward_backward(std::span<const int32_t> inputs, std::span<const int32_t> targets,
                                         int B, int T, ParamAccess& access, float loss_scale) = 0;
  // Evaluation: the same loss, no gradients (Phase::kEval, no backward).
  virtual Result<float> forward_loss(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B,
                                     int T, ParamAccess& access) = 0;

  // Allocates activations for (B, T) now (a pass does it on demand); resource_exhausted when
  // the memory is not there.
  virtual Status reserve(int B, int T) = 0;
  // Bytes of activations and scratch a pass with (B, T) needs.
  virtual uint64_t activation_bytes(int B, int T) const = 0;
  // Of activation_bytes(): the bf16 copies of the weights its products read, kept for a pass so
  // that each weight is rounded once (0 where the model keeps none). They grow with the model,
  // not the batch; limit_weight_copies() trades them for speed.
  virtual uint64_t weight_copy_bytes() const { return 0; }
  // Keep at most `bytes` of those copies: the products of the other weights round them each time
  // (the same bits, more work). The host-memory budget calls it when the copies do not fit.
  virtual void limit_weight_copies(uint64_t bytes) { (void)bytes; }

  // The engine calls this once, before the first pass, with the run's precision (ds_config's
  // bf16 / fp16, or neither). A model may then compute where 16 bits are close enough in 16 bits;
  // GptModel and LlamaModel pick their matrix products with resolve_matmul() (matmul.h). The
  // default ignores it. An error (an override that cannot be honoured) fails Engine::create.
  virtual Status set_compute_precision(ComputePrecision) { return Status::ok(); }

  // A model whose kernels run on a device of its own (the GPU models) returns it; nullptr (the
  // default): the model computes on the host. The engine may then gather into that device's
  // memory (EngineDevice kModelDevice) and calls use_device_memory() once, before any pass; from
  // then on the ParamAccess of every pass hands out pointers into the device's memory: fp32
  // values that work enqueued on its compute stream after acquire() returns may read, and fp32
  // gradient buffers zeroed on that stream. The engine orders its copies after the compute work
  // enqueued before release() and grads_ready(), so the model only enqueues (no host waits).
  virtual device::Device* compute_device() { return nullptr; }
  virtual Status use_device_memory() {
    return Status::unsupported("this model reads parameters in host memory only");
  }

  // Parameter elements, each tensor counted once.
  uint64_t num_params() const;
};

// Checks params() and modules() against the contract above; the error names the parameter or
// module and what is wrong ("module 'h.0.attn' lists parameter 7 twice").
Status validate_layout(std::span<const ParamSpec> params, std::span<const ModuleSpec> modules);
inline Status validate_layout(const Model& model) { return validate_layout(model.params(), model.modules()); }

// Checks a micro-batch against the model's limits: B >= 1, 1 <= T <= max_seq(), inputs and
// targets of B*T ids each in [0, vocab_size()). Errors name the offending value and position.
Status check_batch(const Model& model, std::span<const int32_t> inputs, std::span<const int32_t> targets, int B,
                   int T);

}  // namespace zinf::model
