// The Llama shapes and families the GPU tests compare with the CPU LlamaModel (gpu_llama_test on a
// GPU, gpu_llama_host_test on the host kernels): grouped-query attention, head size 128 (apart
// from hidden and as hidden / n_head), tied and untied heads, q/k/v and o_proj biases, q/k norms
// and RoPE scaling.
#pragma once

#include <vector>

#include "zinf/model/llama.h"

namespace zinf::gpu::testing {

inline model::LlamaConfig base_config(bool checkpointing = false) {
  model::LlamaConfig c;
  c.vocab_size = 100;  // not a multiple of 8: the logits rows are padded
  c.max_seq = 40;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;  // two query heads per kv head
  c.n_embd = 64;    // head size 16
  c.intermediate_size = 96;
  c.rms_norm_eps = 1e-5;
  c.activation_checkpointing = checkpointing;
  return c;
}

struct Variant {
  const char* name;
  model::LlamaConfig config;
};

// The shapes and families every GPU comparison runs.
inline std::vector<Variant> variants() {
  std::vector<Variant> v;
  v.push_back({"GQA, untied", base_config()});
  model::LlamaConfig tied = base_config();
  tied.tie_word_embeddings = true;
  v.push_back({"GQA, tied", tied});
  model::LlamaConfig bias = base_config();  // Llama's attention_bias
  bias.qkv_bias = bias.o_bias = true;
  v.push_back({"Llama attention_bias", bias});
  model::LlamaConfig qwen2 = base_config();
  qwen2.family = model::LlamaFamily::kQwen2;
  qwen2.qkv_bias = true;
  qwen2.tie_word_embeddings = true;
  v.push_back({"Qwen2: q/k/v biases, tied", qwen2});
  model::LlamaConfig qwen3 = base_config();
  qwen3.family = model::LlamaFamily::kQwen3;
  qwen3.qk_norm = true;
  qwen3.head_dim = 32;  // Q = 128, hidden 64
  qwen3.rope_scaling.type = model::RopeType::kLinear;
  qwen3.rope_scaling.factor = 2.0;
  v.push_back({"Qwen3: q/k norms, head_dim 32 on hidden 64, linear RoPE scaling", qwen3});
  model::LlamaConfig wide = base_config();
  wide.family = model::LlamaFamily::kMistral;
  wide.n_head = 2;
  wide.n_kv_head = 1;
  wide.head_dim = 128;  // Q = 256, hidden 64
  v.push_back({"head_dim 128 on hidden 64, 2 query heads on 1 kv head", wide});
  model::LlamaConfig mha = base_config();
  mha.n_embd = 256;
  mha.n_head = 2;
  mha.n_kv_head = 2;  // head size 128, no grouping
  mha.intermediate_size = 128;
  v.push_back({"hidden 256 / 2 heads = head size 128, multi-head", mha});
  return v;
}

}  // namespace zinf::gpu::testing
