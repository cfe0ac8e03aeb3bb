// Internal: the parameter and module lists of a GPT-2 model, in forward order.
#pragma once

#include <vector>

#include "zinf/model/config.h"
#include "zinf/model/params.h"

namespace zinf::model::detail {

// Parameter order: wte, wpe, then per layer ln_1.{weight,bias}, attn.c_attn.{weight,bias},
// attn.c_proj.{weight,bias}, ln_2.{weight,bias}, mlp.c_fc.{weight,bias}, mlp.c_proj.{weight,bias},
// then ln_f.{weight,bias}. Modules as documented in gpt.h (module_* helpers).
void build_layout(const GptConfig& config, std::vector<ParamSpec>* params,
                  std::vector<ModuleSpec>* modules);

}  // namespace zinf::model::detail
