// Internal: building parameter and module lists in forward order, and GPT-2's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zinf/model/config.h"
#include "zinf/model/llama.h"
#include "zinf/model/params.h"

namespace zinf::model::detail {

// `field (value) must be between lo and hi`.
Status check_range(std::string_view field, int value, int lo, int hi);
// The dimensions every decoder shares, checked in this order with the field named: vocab_size,
// max_seq, n_layer, n_embd, n_head in range, and n_embd divisible by n_head.
Status check_decoder_dims(int vocab_size, int max_seq, int n_layer, int n_embd, int n_head);

// Appends modules and parameters in forward order; a parameter's owner is the module open when
// it is added, and reuse() lists an earlier parameter in the open module (a tied head).
class LayoutBuilder {
 public:
  LayoutBuilder(std::vector<ParamSpec>* params, std::vector<ModuleSpec>* modules)
      : params_(params), modules_(modules) {}

  void begin_module(std::string name, bool backward_reads_values = true) {
    modules_->push_back(ModuleSpec{std::move(name), {}, backward_reads_values});
  }
  void add(std::string name, std::vector<int64_t> shape, ParamInit init, float std_dev = 0.0f) {
    ParamSpec p;
    p.name = std::move(name);
    p.numel = 1;
    for (int64_t d : shape) p.numel *= static_cast<size_t>(d);
    p.shape = std::move(shape);
    p.index = static_cast<int>(params_->size());
    p.module = static_cast<int>(modules_->size()) - 1;
    p.init = init;
    p.init_std = std_dev;
    modules_->back().params.push_back(p.index);
    params_->push_back(std::move(p));
  }
  void reuse(int param) { modules_->back().params.push_back(param); }

 private:
  std::vector<ParamSpec>* params_;
  std::vector<ModuleSpec>* modules_;
};

// Parameter order: wte, wpe, then per layer ln_1.{weight,bias}, attn.c_attn.{weight,bias},
// attn.c_proj.{weight,bias}, ln_2.{weight,bias}, mlp.c_fc.{weight,bias}, mlp.c_proj.{weight,bias},
// then ln_f.{weight,bias}. Modules as documented in gpt.h (module_* helpers).
void build_layout(const GptConfig& config, std::vector<ParamSpec>* params,
                  std::vector<ModuleSpec>* modules);

// A Llama configuration's widths, as the CPU and GPU models use them: Q = n_head * head_dim (the
// query and attention-output width; C unless head_dim is set apart), KV = n_kv_head * head_dim,
// I = intermediate_size.
struct LlamaDims {
  int C, NH, NKV, hd, Q, KV, I, V, L;
  explicit LlamaDims(const LlamaConfig& c)
      : C(c.n_embd),
        NH(c.n_head),
        NKV(c.n_kv_head),
        hd(c.head_size()),
        Q(c.head_size() * c.n_head),
        KV(c.head_size() * c.n_kv_head),
        I(c.intermediate_size),
        V(c.vocab_size),
        L(c.n_layer) {}
};

// HF LlamaForCausalLM's parameter names in forward order: model.embed_tokens.weight, per layer
// input_layernorm, self_attn.{q,k,v}_proj (.weight, then .bias with qkv_bias), o_proj (.weight,
// .bias with o_bias), q_norm and k_norm (qk_norm), post_attention_layernorm, mlp.{gate,up,down}_proj
// (.weight), then model.norm.weight and, untied, lm_head.weight. Modules as in llama.h.
void build_llama_layout(const LlamaConfig& config, std::vector<ParamSpec>* params,
                        std::vector<ModuleSpec>* modules);

}  // namespace zinf::model::detail
