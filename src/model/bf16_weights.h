// Internal: the bf16 copies of the weights a model's bf16 products read, each rounded once per
// step and read by that weight's forward product and by its backward product.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "zinf/model/matmul.h"
#include "zinf/model/params.h"

namespace zinf::model::detail {

// Without it every bf16 product rounds its weight again: forward, backward, and a recompute
// under activation checkpointing. With it a weight is rounded at its first product of a pass
// and the copy serves every later product of that forward_backward() or forward_loss() call.
//
// Why the copy stays valid from a module's forward to its backward although the owner gathers
// the module again in between (and may hand out another pointer): a parameter's values do not
// change between its module's first acquire in a pass and the end of that module's backward.
// The optimizer steps between calls, or, overlapped with backward, steps only parameters whose
// gradients are final, i.e. whose modules' backward is done and whose copies no later product of
// the pass reads. So both gathers hold the same values and round to the same bits. begin_pass()
// drops every copy before the next pass.
//
// Memory: one bf16 copy of every weight matrix a product reads, allocated at its first use and
// kept (no allocation in later steps): half the fp32 matrices' bytes, counted by bytes_for()
// and in the models' activation_bytes(); within limit_bytes() when that is lower (a model whose
// weights live on NVMe would otherwise hold 2 bytes per parameter). Not thread-safe (the model's
// calling thread only).
class Bf16Weights {
 public:
  // on: the products read bf16 (Matmul::reads_bf16_inputs()); off: get() rounds nothing.
  // params: the model's parameter list (Model::params()); copies are indexed by ParamSpec::index.
  // Keeps the limit (limit_bytes).
  void configure(std::span<const ParamSpec> params, bool on);
  // At most `bytes` of copies are kept (the first weights get() sees, in pass order); get() hands
  // the others out without a copy, so their product rounds them (the same bits). Default: no limit.
  void limit_bytes(uint64_t bytes) { limit_ = bytes; }
  bool on() const { return on_; }

  // Forgets every copy (their storage stays). The models call it at the start of each pass.
  void begin_pass();

  // weight: parameter `param`'s gathered values (rows x cols, row-major, the ParamSpec's numel),
  // with its bf16 copy when on(): rounded now if this pass has none yet, else the earlier copy
  // (the same bits, see above). The copy is valid until the next begin_pass() or configure().
  MatmulInput get(int param, const float* weight, int rows, int cols);

  // Bytes of the copies of the matrices in `matrices` (parameter indices), as get() allocates
  // them: what a model with these weight matrices keeps when on.
  static size_t bytes_for(std::span<const ParamSpec> params, std::span<const int> matrices);

  // How many times get() rounded a weight since configure() (tests: once per weight per pass).
  uint64_t roundings() const { return roundings_; }

 private:
  struct Copy {
    std::vector<uint16_t> bits;
    bool valid = false;
  };
  std::vector<Copy> copies_;  // by ParamSpec::index
  size_t held_ = 0;             // bytes of the copies' storage
  uint64_t limit_ = UINT64_MAX;
  bool on_ = false;
  uint64_t roundings_ = 0;
};

}  // namespace zinf::model::detail
