// Matmul: the matrix products of the built-in models, fp32 OpenBLAS (the reference) or oneDNN with
// bf16 inputs and fp32 accumulation, chosen at run time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "zinf/status.h"

namespace zinf::model {

// The arithmetic of a run, as the engine derives it from ds_config (bf16 / fp16 / neither).
enum class ComputePrecision { kFp32, kBf16, kFp16 };

enum class MatmulKind {
  kFp32,  // OpenBLAS cblas_sgemm, fp32 in and out: the reference, and every fp32 run
  kBf16,  // oneDNN matmul: inputs rounded to bf16 (nearest even), fp32 accumulation and output
};
std::string_view matmul_kind_name(MatmulKind kind);  // "fp32", "bf16"

// The CPU as CPUID names it; empty vendor off x86.
struct CpuIdentity {
  std::string vendor;  // "AuthenticAMD", "GenuineIntel", ...
  int family = 0;      // display family: base family, plus the extended family when base is 15
  int model = 0;       // display model: the extended model bits included for families 6 and 15
};
CpuIdentity cpu_identity();

// What this build and CPU offer for bf16 products.
struct MatmulSupport {
  bool dnnl_built = false;  // zinf was built with oneDNN (meson option dnnl)
  bool bf16_units = false;  // the CPU has bf16 dot-product units: AVX512-BF16 or AMX
  bool amx = false;         // ... and AMX tiles (oneDNN's avx512_core_amx)
  std::string isa;          // oneDNN's effective ISA ("avx512_core_bf16", "avx512_core_amx", ...)
  CpuIdentity cpu;
};
MatmulSupport matmul_support();

// `auto`'s choice for a 16-bit run, from a table of CPU families (docs/model.md, "Matrix
// products", has each row's measurement). A pure function of the hardware, never of timings:
// the same machine always computes the same bits.
struct MatmulChoice {
  MatmulKind kind = MatmulKind::kFp32;
  bool known = true;  // false: the CPU has bf16 units but no row of the table; kind is fp32
  std::string row;    // the row that decided ("AMD Zen 4"), or why no row was needed
  std::string why;    // the start-up line's reason, with how to measure and pin on an unknown CPU
};
MatmulChoice auto_matmul_choice(const MatmulSupport& s);

// The kind a run computing in `precision` uses. fp32 runs always get kFp32 (bit for bit the
// results zinf gave before bf16 products existed). 16-bit runs (`auto`) get
// auto_matmul_choice(matmul_support()): kBf16 where the table says bf16 products are faster
// (AMX; AMD Zen 4), kFp32 elsewhere (no oneDNN, no bf16 units, Intel AVX512-BF16 without AMX, and
// every CPU not in the table). ZINF_MATMUL=auto|fp32|bf16 in the environment overrides that
// choice for 16-bit runs. ZINF_MATMUL=bf16 on a build without oneDNN, or an unknown value, is
// invalid_argument. Logs the choice and why at notice level once per distinct choice, e.g.
// "matmul: oneDNN bf16 inputs, fp32 accumulation (auto: AMD Zen 4, ...)".
Result<MatmulKind> resolve_matmul(ComputePrecision precision);

// An input of a product (an activation, a gradient or a weight): its fp32 values and, optionally,
// the same values already rounded to bf16 element by element (round to nearest even, as the bf16
// backend rounds), written by the kernel that produced them (or, for a weight, by the model's
// per-gather copy, bf16_weights.h). kBf16 reads the copy instead of rounding the values itself:
// the same bits, one pass over the input fewer. kFp32 reads the fp32 values only.
struct MatmulInput {
  MatmulInput(const float* values) : f32(values) {}  // an fp32 input without a copy (implicit)
  MatmulInput(const float* values, const uint16_t* rounded) : f32(values), bf16(rounded) {}
  const float* f32;
  const uint16_t* bf16 = nullptr;  // nullptr: no copy
};

class Bf16MatmulBackend;  // internal: the oneDNN primitives and bf16 scratch

// The products of a linear layer, weight (OC, C) row-major. N rows throughout.
// Numerics of kBf16: inp, weight and dout are rounded to bf16 (8-bit significand) before each
// product, which accumulates and writes fp32; bias and dbias stay fp32 end to end. Both kinds are
// deterministic: a fixed shape gives the same bits on every call with the same thread count.
// Not thread-safe: one call at a time (each call uses all cores through OpenBLAS or oneDNN).
// use() has created oneDNN's engine and a bf16 primitive; a oneDNN failure inside a later
// call (memory for a new shape's primitive) throws dnnl::error, as an allocation throws
// std::bad_alloc elsewhere in the model.
class Matmul {
 public:
  Matmul();  // kFp32
  Matmul(Matmul&&) noexcept;
  Matmul& operator=(Matmul&&) noexcept;
  ~Matmul();

  // Switches the kind. kBf16 creates the oneDNN engine and checks that it can run bf16
  // products here; unsupported (naming why) when it cannot, and then the kind stays.
  Status use(MatmulKind kind);
  MatmulKind kind() const { return kind_; }

  // out (N,OC) = inp (N,C) @ weight^T + bias (OC) when bias != nullptr
  void forward(float* out, MatmulInput inp, MatmulInput weight, const float* bias, int N, int C, int OC);
  // dinp (N,C) = dout (N,OC) @ weight (overwritten); dweight (OC,C) += dout^T @ inp;
  // dbias (OC) += column sums of dout's fp32 values (skipped when dbias == nullptr)
  void backward(float* dinp, float* dweight, float* dbias, MatmulInput dout, MatmulInput inp, MatmulInput weight,
                int N, int C, int OC);
  // Whether forward/backward read the inputs' bf16 copies (kind kBf16): the models write bf16
  // copies of the activations and gradients their products read only then.
  bool reads_bf16_inputs() const { return kind_ == MatmulKind::kBf16; }

 private:
  MatmulKind kind_ = MatmulKind::kFp32;
  std::unique_ptr<Bf16MatmulBackend> bf16_;
};

}  // namespace zinf::model
