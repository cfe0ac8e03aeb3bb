// Internal: the bf16 matrix-product backend behind Matmul (matmul_dnnl.cpp implements it with
// oneDNN; matmul_nodnnl.cpp, built without oneDNN, reports it missing).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "zinf/model/matmul.h"
#include "zinf/status.h"

namespace zinf::model {

// Contracts as Matmul::forward / Matmul::backward of kind kBf16. Owns its bf16 scratch, so one
// call at a time.
class Bf16MatmulBackend {
 public:
  virtual ~Bf16MatmulBackend() = default;
  virtual void forward(float* out, MatmulInput inp, MatmulInput weight, const float* bias, int N, int C,
                       int OC) = 0;
  virtual void backward(float* dinp, float* dweight, float* dbias, MatmulInput dout, MatmulInput inp,
                        MatmulInput weight, int N, int C, int OC) = 0;
  // One line naming the implementation, e.g. "oneDNN 2.6.3 bf16 (avx512_core_bf16)".
  virtual std::string describe() const = 0;
};

namespace detail {
// unsupported when zinf was built without oneDNN, or when oneDNN has no fast bf16 matmul on this
// CPU (only its reference loops).
Result<std::unique_ptr<Bf16MatmulBackend>> make_bf16_matmul_backend();
MatmulSupport probe_matmul_support();

// auto_matmul_choice(s).kind.
MatmulKind auto_matmul_kind(const MatmulSupport& s);

// Tests: while on, the bf16 backend compares every bf16 copy it is handed (MatmulInput::bf16:
// a producer's activation or gradient copy, a model's weight copy) with the rounding of the
// fp32 values beside it, and counts the elements that differ: a stale or half-written copy shows
// up as a count above zero. Off by default (it rounds every input again). Thread-safe.
void set_check_bf16_copies(bool on);
uint64_t bf16_copy_mismatches();
}  // namespace detail

}  // namespace zinf::model
