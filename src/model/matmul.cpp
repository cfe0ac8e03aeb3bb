// Matmul: dispatch between the fp32 OpenBLAS products and the bf16 backend, and the run-time choice.
#include "zinf/model/matmul.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "model/bf16_matmul.h"
#include "model/kernels.h"
#include "zinf/log.h"

namespace zinf::model {

std::string_view matmul_kind_name(MatmulKind kind) { return kind == MatmulKind::kBf16 ? "bf16" : "fp32"; }

MatmulSupport matmul_support() { return detail::probe_matmul_support(); }

namespace detail {

MatmulKind auto_matmul_kind(const MatmulSupport& s) {
  return s.dnnl_built && s.amx ? MatmulKind::kBf16 : MatmulKind::kFp32;
}

}  // namespace detail

namespace {

// Why auto chose what it did, for the start-up line.
std::string auto_reason(const MatmulSupport& s) {
  if (!s.dnnl_built) return "built without oneDNN";
  if (s.amx) return fmt::format("auto: AMX, {}", s.isa);
  if (s.bf16_units) {
    return fmt::format("auto: {}, AVX512-BF16 without AMX, where bf16 products measured 0.5x fp32 on a Xeon; "
                       "ZINF_MATMUL=bf16 uses them, build/bench/matmul_bench compares the two here",
                       s.isa);
  }
  return fmt::format("auto: no bf16 units, {}", s.isa);
}

}  // namespace

Result<MatmulKind> resolve_matmul(ComputePrecision precision) {
  if (precision == ComputePrecision::kFp32) return MatmulKind::kFp32;
  const char* env = std::getenv("ZINF_MATMUL");
  const std::string want = env != nullptr ? env : "auto";
  const MatmulSupport s = matmul_support();
  MatmulKind kind;
  std::string why;
  if (want == "fp32") {
    kind = MatmulKind::kFp32;
    why = "ZINF_MATMUL=fp32";
  } else if (want == "bf16") {
    if (!s.dnnl_built) {
      return Status::invalid_argument("ZINF_MATMUL=bf16: zinf was built without oneDNN (meson option dnnl)");
    }
    kind = MatmulKind::kBf16;
    why = fmt::format("ZINF_MATMUL=bf16, {}", s.isa);
  } else if (want == "auto" || want.empty()) {
    kind = detail::auto_matmul_kind(s);
    why = auto_reason(s);
  } else {
    return Status::invalid_argument(fmt::format("ZINF_MATMUL={}: expected auto, fp32 or bf16", want));
  }
  const std::string line = kind == MatmulKind::kBf16
                               ? fmt::format("matmul: oneDNN bf16 inputs, fp32 accumulation ({})", why)
                               : fmt::format("matmul: OpenBLAS fp32 ({})", why);
  log_once(LogLevel::kNotice, line, line);
  return kind;
}

Matmul::Matmul() = default;
Matmul::Matmul(Matmul&&) noexcept = default;
Matmul& Matmul::operator=(Matmul&&) noexcept = default;
Matmul::~Matmul() = default;

Status Matmul::use(MatmulKind kind) {
  if (kind == MatmulKind::kBf16 && bf16_ == nullptr) {
    ZINF_ASSIGN_OR_RETURN(bf16_, detail::make_bf16_matmul_backend());
  }
  kind_ = kind;
  return Status::ok();
}

void Matmul::forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC) {
  if (kind_ == MatmulKind::kBf16) {
    bf16_->forward(out, inp, weight, bias, N, C, OC);
  } else {
    kernels::matmul_forward(out, inp, weight, bias, N, C, OC);
  }
}

void Matmul::backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                      const float* weight, int N, int C, int OC) {
  if (kind_ == MatmulKind::kBf16) {
    bf16_->backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  } else {
    kernels::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }
}

}  // namespace zinf::model
