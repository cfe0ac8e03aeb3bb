// How the model describes its parameters and modules, and the interface through which the
// parameter owner (the ZeRO-3 engine, or LocalParams) hands them to the model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/status.h"

namespace zinf::model {

// How a parameter starts (GPT-2 init).
enum class ParamInit { kNormal, kZeros, kOnes };

// One parameter tensor. GptModel's names follow Hugging Face GPT-2 ("wte.weight",
// "h.3.attn.c_attn.bias"). Linear weights are stored [out, in] row-major (torch nn.Linear, llm.c);
// HF's Conv1D keeps the transpose, [in, out], so an HF checkpoint's c_attn/c_proj/c_fc weights
// must be transposed.
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  size_t numel = 0;
  int index = 0;   // position in Model::params()
  int module = 0;  // owning module: the first to use it in forward, the last in backward
  ParamInit init = ParamInit::kNormal;
  float init_std = 0.0f;  // for kNormal
};

// Modules are the unit of fetch and release, listed in forward order. A parameter may appear in
// more than one module (the tied LM head lists wte again). A module may hold any number of
// parameters; the engine gathers all of a module's owned parameters with one collective.
struct ModuleSpec {
  std::string name;  // GptModel: "wte_wpe", "h.0.ln_1", "h.0.attn", "h.0.ln_2", "h.0.mlp", ..., "lm_head"
  std::vector<int> params;  // indices into Model::params()
  // False when the module's backward does not read its parameter values (the embeddings): then
  // backward asks only for its gradient buffers, with no acquire/release.
  bool backward_reads_values = true;
};

// Why the model wants a module's parameters.
enum class Phase {
  kForward,    // forward of forward_backward(); a backward follows
  kEval,       // forward of forward_loss(); no backward follows
  kRecompute,  // activation-checkpoint recompute of a block inside backward
  kBackward,
};
std::string_view phase_name(Phase phase);

// Implemented by whoever owns parameter storage. The model calls it from the thread that called
// forward_backward()/forward_loss(), one call at a time, in this order per module m:
//   forward / eval / recompute:  acquire(m, phase) ... compute ... release(m, phase)
//   backward:  [acquire(m, kBackward)] grad_buffers(m) ... compute ... [release(m, kBackward)]
//              grads_ready(m)        (acquire/release only if backward_reads_values)
// GptModel goes in ModuleSpec order in forward and in reverse order in backward; with activation
// checkpointing each block's four modules are re-acquired with kRecompute (in forward order)
// just before that block's backward, except the last block, whose activations are still in
// memory from forward. The tied wte is used by "lm_head" (end of forward, start of backward)
// and by "wte_wpe" (start of forward, end of backward). Any Model may choose its own order, but
// the sequence must be the same every step for the same configuration, so that an engine can
// record it once and prefetch from it. module_calls.h runs one module under this protocol.
// An error from any call stops the pass and is returned from forward_backward()/forward_loss();
// the model releases a module it acquired before returning (ignoring a second error), and
// makes no further calls for that pass.
class ParamAccess {
 public:
  virtual ~ParamAccess() = default;

  // Fill values[k] with the gathered fp32 values of parameter modules()[module].params[k]
  // (values.size() == params.size()). The pointers must stay valid and unchanged until the
  // matching release(); the model only reads through them.
  virtual Status acquire(int module, Phase phase, std::span<const float*> values) = 0;
  // Optional, for a model that computes in bf16 where the owner keeps the values (a GPU model
  // whose engine holds the whole state in the GPU's memory): fill values[k] with parameter k's
  // values as bf16 bits in that memory, the bits acquire's fp32 values would round to, without a
  // gather or a cast. kUnsupported, with nothing acquired, where the owner has no such copy: the
  // model then calls acquire. Otherwise as acquire (same order, released by release()).
  virtual Status acquire_bf16(int /*module*/, Phase /*phase*/, std::span<const std::uint16_t*> /*values*/) {
    return Status::unsupported("no bf16 copy of the parameters to hand out");
  }
  // The model is done with module's values for this phase.
  virtual Status release(int module, Phase phase) = 0;

  // Backward: fill grads[k] with fp32 buffers where the model ADDS the gradient of
  // (loss * loss_scale) for parameter params[k]; the owner decides whether they start at zero
  // or hold an earlier micro-batch's sum. The same parameter in two modules (wte) must get
  // the same buffer both times. Valid until grads_ready(module).
  virtual Status grad_buffers(int module, std::span<float*> grads) = 0;
  // The model has added all of module's contribution for this micro-batch. A parameter's
  // gradient is complete once grads_ready has been called for its owning module
  // (ParamSpec::module), which is the last module in backward that touches it.
  virtual Status grads_ready(int module) = 0;
};

// Writes elements [element_offset, element_offset + out.size()) of parameter `spec` as
// initialised from `seed` (GPT-2 init: normal(0, init_std) weights, zero biases, unit LayerNorm
// weights). Element i depends only on (seed, spec.index, i), computed with integer hashing and
// IEEE-exact arithmetic, so any shard or chunk can be made alone and every machine gets the same
// bits. Long spans are filled on default_thread_pool() (same bits). Thread-safe; requires
// element_offset + out.size() <= spec.numel.
void init_param(const ParamSpec& spec, uint64_t seed, std::span<float> out, size_t element_offset);

}  // namespace zinf::model
