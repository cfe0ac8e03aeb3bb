// GPT-2 style model dimensions: named presets from tiny to multi-billion parameters, validation.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/status.h"

namespace zinf::model {

// The dimensions of a decoder-only transformer (GPT-2 layout, LM head tied to wte).
// Field names double as option names in error messages.
struct GptConfig {
  int vocab_size = 256;  // tokens 0..vocab_size-1 (256 for byte-level text, 50257 for GPT-2 BPE)
  int max_seq = 64;      // n_positions: rows of wpe, the longest sequence T the model accepts
  int n_layer = 2;
  int n_head = 4;
  int n_embd = 64;  // must be divisible by n_head
  // Keep only block inputs in forward; recompute each block in backward.
  bool activation_checkpointing = false;

  bool operator==(const GptConfig&) const = default;
};

// Checks every field; the error names the offending field and its value, e.g.
// "n_embd (100) must be divisible by n_head (3)".
Status validate_config(const GptConfig& config);

// A named preset with the given vocabulary ("tiny", "mini", "small", "gpt2", "gpt2-medium",
// "gpt2-large", "1.3b", "gpt2-xl", "2.7b", "6.7b", "13b"). Unknown names give an error
// listing the known ones.
Result<GptConfig> gpt_preset(std::string_view name, int vocab_size);

// The preset names, smallest first.
std::vector<std::string> gpt_preset_names();

// The architecture as JSON text: {"type": "gpt", "vocab_size", "max_seq", "n_layer", "n_head",
// "n_embd"} (activation_checkpointing, a run-time choice, is left out).
std::string gpt_config_json(const GptConfig& config);
// Reads that object back (a missing "type" is taken as "gpt", as checkpoints before the Model
// interface wrote it) and validates it; errors name `source` and the key.
Result<GptConfig> gpt_config_from_json(std::string_view text, std::string_view source);

// Parameter count of a model with this configuration (tied head counted once), without
// building it: V*C + S*C + L*(12*C*C + 13*C) + 2*C.
uint64_t gpt_num_params(const GptConfig& config);

}  // namespace zinf::model
