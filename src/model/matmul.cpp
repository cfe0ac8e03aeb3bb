// Matmul: dispatch between the fp32 OpenBLAS products and the bf16 backend, and the run-time choice.
#include "zinf/model/matmul.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "model/bf16_matmul.h"
#include "model/kernels.h"
#include "zinf/log.h"

namespace zinf::model {

std::string_view matmul_kind_name(MatmulKind kind) { return kind == MatmulKind::kBf16 ? "bf16" : "fp32"; }

CpuIdentity cpu_identity() {
  CpuIdentity id;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return id;
  char vendor[12];
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  id.vendor.assign(vendor, sizeof vendor);
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return id;
  const int base_family = static_cast<int>((a >> 8) & 0xf), base_model = static_cast<int>((a >> 4) & 0xf);
  const int ext_family = static_cast<int>((a >> 20) & 0xff), ext_model = static_cast<int>((a >> 16) & 0xf);
  id.family = base_family == 0xf ? base_family + ext_family : base_family;
  id.model = base_family == 0x6 || base_family == 0xf ? (ext_model << 4) + base_model : base_model;
#endif
  return id;
}

MatmulSupport matmul_support() {
  MatmulSupport s = detail::probe_matmul_support();
  s.cpu = cpu_identity();
  return s;
}

namespace {

// One row of auto's table: CPUs with bf16 units (AVX512-BF16 or AMX) and oneDNN built, by
// vendor, family and AMX. Each row's kind is the one measured faster on such a CPU
// (build/bench/matmul_bench at GPT `small`'s shapes where it was run); docs/model.md ("Matrix
// products") has the figures and how each was taken, and a new row needs its measurement there.
struct MatmulRow {
  const char* name;
  const char* vendor;  // CPUID vendor; nullptr: any
  int family;          // display family; 0: any
  bool amx;            // the row covers CPUs with AMX tiles (true) or without (false)
  MatmulKind kind;
};

constexpr MatmulRow kMatmulRows[] = {
    {"AMX tiles", nullptr, 0, true, MatmulKind::kBf16},
    {"Intel AVX512-BF16 without AMX", "GenuineIntel", 6, false, MatmulKind::kFp32},
    {"AMD Zen 4", "AuthenticAMD", 25, false, MatmulKind::kBf16},
};

std::string cpu_name(const CpuIdentity& cpu) {
  if (cpu.vendor.empty()) return "a CPU without CPUID";
  return fmt::format("{} family {} model {}", cpu.vendor, cpu.family, cpu.model);
}

}  // namespace

MatmulChoice auto_matmul_choice(const MatmulSupport& s) {
  if (!s.dnnl_built) return {MatmulKind::kFp32, true, "no oneDNN", "built without oneDNN"};
  if (!s.bf16_units) {
    return {MatmulKind::kFp32, true, "no bf16 units", fmt::format("auto: no bf16 units, {}", s.isa)};
  }
  for (const MatmulRow& row : kMatmulRows) {
    if (row.amx != s.amx) continue;
    if (row.vendor != nullptr && s.cpu.vendor != row.vendor) continue;
    if (row.family != 0 && s.cpu.family != row.family) continue;
    return {row.kind, true, row.name,
            fmt::format("auto: {} ({}, {}), where {} products measured faster; docs/model.md, \"Matrix products\"",
                        row.name, cpu_name(s.cpu), s.isa, matmul_kind_name(row.kind))};
  }
  return {MatmulKind::kFp32, false, "not in the table",
          fmt::format("auto: {} with {} is not in zinf's table of CPUs, so the safe choice; "
                      "build/bench/matmul_bench measures both kinds here, and ZINF_MATMUL=bf16 or fp32 pins "
                      "the faster one (docs/model.md, \"Matrix products\")",
                      cpu_name(s.cpu), s.isa)};
}

namespace detail {

MatmulKind auto_matmul_kind(const MatmulSupport& s) { return auto_matmul_choice(s).kind; }

}  // namespace detail

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
    MatmulChoice choice = auto_matmul_choice(s);
    kind = choice.kind;
    why = std::move(choice.why);
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

void Matmul::forward(float* out, MatmulInput inp, MatmulInput weight, const float* bias, int N, int C, int OC) {
  if (kind_ == MatmulKind::kBf16) {
    bf16_->forward(out, inp, weight, bias, N, C, OC);
  } else {
    kernels::matmul_forward(out, inp.f32, weight.f32, bias, N, C, OC);
  }
}

void Matmul::backward(float* dinp, float* dweight, float* dbias, MatmulInput dout, MatmulInput inp,
                      MatmulInput weight, int N, int C, int OC) {
  if (kind_ == MatmulKind::kBf16) {
    bf16_->backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  } else {
    kernels::matmul_backward(dinp, dweight, dbias, dout.f32, inp.f32, weight.f32, N, C, OC);
  }
}

}  // namespace zinf::model
