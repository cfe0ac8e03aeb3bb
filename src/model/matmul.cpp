// Matmul: dispatch between the fp32 OpenBLAS products and the bf16 backend, and the run-time choice.
#include "zinf/model/matmul.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "model/bf16_matmul.h"
#include "model/kernels.h"
#include "zinf/log.h"

namespace zinf::model {

std::string_view matmul_kind_name(MatmulKind kind) { return kind == MatmulKind::kBf16 ? "bf16" : "fp32"; }

MatmulSupport matmul_support() { return detail::probe_matmul_support(); }

namespace detail {

MatmulKind choose_by_rates(const MatmulRates& rates) {
  return rates.bf16_gflops >= kBf16Margin * rates.fp32_gflops ? MatmulKind::kBf16 : MatmulKind::kFp32;
}

Result<MatmulRates> measure_matmul_rates() {
  constexpr int N = 512, C = 1024, OC = 1024;
  std::vector<float> inp(static_cast<size_t>(N) * C), weight(static_cast<size_t>(OC) * C);
  std::vector<float> out(static_cast<size_t>(N) * OC), dinp(inp.size()), dweight(weight.size(), 0.0f);
  // Small, deterministic values: no denormals, no overflow in dweight's accumulation.
  for (size_t i = 0; i < inp.size(); i++) inp[i] = static_cast<float>((i * 7919) % 1009) / 1009.0f - 0.5f;
  for (size_t i = 0; i < weight.size(); i++) weight[i] = static_cast<float>((i * 104729) % 997) / 31904.0f - 0.0156f;
  // One layer's products: forward, then backward with out as dout (3 products of N*C*OC).
  const auto rate = [&](Matmul& mm) {
    double best = std::numeric_limits<double>::infinity();
    for (int rep = 0; rep < 3; rep++) {  // rep 0 warms up (primitive creation, thread start)
      const auto t0 = std::chrono::steady_clock::now();
      mm.forward(out.data(), inp.data(), weight.data(), nullptr, N, C, OC);
      mm.backward(dinp.data(), dweight.data(), nullptr, out.data(), inp.data(), weight.data(), N, C, OC);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rep > 0) best = std::min(best, s);
    }
    return 3.0 * 2.0 * N * C * OC / best / 1e9;
  };
  Matmul fp32, bf16;
  ZINF_RETURN_IF_ERROR(bf16.use(MatmulKind::kBf16));
  MatmulRates rates;
  rates.fp32_gflops = rate(fp32);
  rates.bf16_gflops = rate(bf16);
  return rates;
}

}  // namespace detail

namespace {

// auto's choice for a 16-bit run, measured once per process, and why (for the start-up line).
std::pair<MatmulKind, std::string> auto_choice(const MatmulSupport& s) {
  if (!s.dnnl_built) return {MatmulKind::kFp32, "built without oneDNN"};
  if (!s.bf16_units) return {MatmulKind::kFp32, fmt::format("no bf16 units: {}", s.isa)};
  static std::once_flag once;
  static std::optional<Result<detail::MatmulRates>> measured;
  std::call_once(once, [] { measured.emplace(detail::measure_matmul_rates()); });
  if (!measured->is_ok()) return {MatmulKind::kFp32, measured->status().message()};
  const detail::MatmulRates& r = measured->value();
  const MatmulKind kind = detail::choose_by_rates(r);
  return {kind, fmt::format("auto on {}: measured fp32 {:.0f} GFLOP/s, bf16 {:.0f} GFLOP/s, bf16 taken at >= {:.2f}x; "
                            "ZINF_MATMUL=fp32|bf16 pins it",
                            s.isa, r.fp32_gflops, r.bf16_gflops, detail::kBf16Margin)};
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
    std::tie(kind, why) = auto_choice(s);
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
