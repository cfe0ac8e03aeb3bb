// Internal: the bf16 matrix-product backend behind Matmul (matmul_dnnl.cpp implements it with
// oneDNN; matmul_nodnnl.cpp, built without oneDNN, reports it missing).
#pragma once

#include <memory>

#include "zinf/model/matmul.h"
#include "zinf/status.h"

namespace zinf::model {

// Contracts as Matmul::forward / Matmul::backward of kind kBf16. Owns its bf16 scratch, so one
// call at a time.
class Bf16MatmulBackend {
 public:
  virtual ~Bf16MatmulBackend() = default;
  virtual void forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                       int C, int OC) = 0;
  virtual void backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, int N, int C, int OC) = 0;
  // One line naming the implementation, e.g. "oneDNN 2.6.3 bf16 (avx512_core_bf16)".
  virtual std::string describe() const = 0;
};

namespace detail {
// unsupported when zinf was built without oneDNN, or when oneDNN has no fast bf16 matmul on this
// CPU (only its reference loops).
Result<std::unique_ptr<Bf16MatmulBackend>> make_bf16_matmul_backend();
MatmulSupport probe_matmul_support();

// `auto`'s rule for a 16-bit run on a CPU with bf16 units: bf16 products only when they measured
// at least kBf16Margin times the fp32 rate (conversions included), else fp32. A CPU with
// AVX512-BF16 but no AMX can run its bf16 products at half its fp32 rate (docs/model.md).
inline constexpr double kBf16Margin = 1.15;
struct MatmulRates {
  double fp32_gflops = 0;  // OpenBLAS sgemm, through Matmul kFp32
  double bf16_gflops = 0;  // oneDNN, through Matmul kBf16 (its input conversions included)
};
MatmulKind choose_by_rates(const MatmulRates& rates);
// Times one linear layer's forward and backward (N 512, C 1024, OC 1024: 3.2 GFLOP) in each kind,
// best of 2 after a warm-up: ~0.1 s. unsupported when a bf16 Matmul cannot be made here.
Result<MatmulRates> measure_matmul_rates();
}  // namespace detail

}  // namespace zinf::model
