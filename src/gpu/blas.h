// Internal: cuBLASLt matrix products with bf16 inputs and fp32 accumulation. Blas owns the
// handle and its workspace; Gemm is one product in cuBLASLt's column-major terms; the linear_*
// functions are the model's linear layers in row-major terms, built on Gemm.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>

#include "gpu/numerics.h"
#include "zinf/status.h"

namespace zinf::gpu {

enum class GemmOutput { kBf16, kF32 };

enum class GemmEpilogue {
  kNone,
  kBias,         // D = alpha * op(A) op(B) + beta * C + bias (bias: m values, one per row of D)
  kGeluAuxBias,  // aux = op(A) op(B) + bias; D = gelu(aux)            (beta must be 0)
  kDGelu,        // D = op(A) op(B) * gelu'(aux), aux read              (beta must be 0)
};
const char* epilogue_name(GemmEpilogue e);

// D (m, n) = alpha * op(A) (m, k) @ op(B) (k, n) + beta * C, every matrix column-major with its
// leading dimension, as cuBLASLt sees it. op(A) = A^T when trans_a: A is stored (k, m) then,
// (m, k) otherwise; likewise B is stored (n, k) when trans_b, (k, n) otherwise. A and B are
// bf16; C and D have d_type; products accumulate in fp32 (CUBLAS_COMPUTE_32F).
// c == nullptr means no C (beta must be 0); c == d accumulates in place.
// Epilogues need a bf16 D; bias is bf16 (m values); aux is bf16 (m, n) with ld_aux a multiple
// of 8 (cuBLASLt's rule) and its GELU is cuBLASLt's own.
// batch > 1: `batch` products of these sizes, the i-th on A + i * stride_a, B + i * stride_b,
// C + i * stride_c, D + i * stride_d (strides in elements; cuBLASLt's strided batch); no
// epilogue then.
struct Gemm {
  bool trans_a = false;
  bool trans_b = false;
  int m = 0, n = 0, k = 0;
  const bf16* a = nullptr;
  int lda = 0;
  const bf16* b = nullptr;
  int ldb = 0;
  void* d = nullptr;
  int ldd = 0;
  GemmOutput d_type = GemmOutput::kBf16;
  const void* c = nullptr;
  int ldc = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  const bf16* bias = nullptr;
  bf16* aux = nullptr;
  int ld_aux = 0;
  int batch = 1;
  long long stride_a = 0, stride_b = 0, stride_c = 0, stride_d = 0;
  const char* what = "matmul";  // names the product in error messages
};

// "what: D(m x n, ldd, bf16) = A^T(... ) ...": the product's shape for error messages.
std::string describe_gemm(const Gemm& g);
// Checks sizes, leading dimensions, pointers and the epilogue's rules without a device;
// invalid_argument naming the product (describe_gemm) and the rule broken.
Status check_gemm(const Gemm& g);

// The cuBLASLt handle and a workspace in device memory (cudaMalloc'd once, here). Move-only.
// Not thread-safe, and calls must not overlap in time on different streams (they share the
// workspace): use one Blas per stream that runs products concurrently.
class Blas {
 public:
  // 32 MiB: what NVIDIA suggests for Hopper; smaller workspaces exclude some kernels.
  static constexpr std::size_t kDefaultWorkspaceBytes = std::size_t{32} << 20;

  // Fails with unsupported when there is no device, or the CUDA/cuBLAS error otherwise.
  static Result<Blas> create(std::size_t workspace_bytes = kDefaultWorkspaceBytes);
  Blas(Blas&&) noexcept;
  Blas& operator=(Blas&&) noexcept;
  ~Blas();

  // Enqueues the product on `stream`. check_gemm() first; unsupported when cuBLASLt has no
  // algorithm for it; every error names the product. The algorithm cuBLASLt's heuristic picks
  // for a shape (and alignments) is kept, so a shape always runs the same kernel: the same
  // inputs give the same bits.
  Status matmul(const Gemm& g, cudaStream_t stream);

 private:
  struct State;
  explicit Blas(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

// ---- the model's linear layers, row-major ----------------------------------------------------
// A linear layer with weight (OC, C) row-major (torch nn.Linear, model/kernels.h) over N rows.
// ld_out is the row stride of out / dout in elements (>= OC; 0 means OC): the tied head's
// logits rows are padded to logits_ld(V).
struct LinearShape {
  int N = 0, C = 0, OC = 0;
  int ld_out = 0;
  int out_ld() const { return ld_out == 0 ? OC : ld_out; }
};

// out (N, OC) bf16 = inp (N, C) @ weight^T + bias (OC; nullptr: none) + residual (N, OC, row
// stride out_ld(); nullptr: none). residual may equal out (added in place).
Gemm linear_forward_gemm(const LinearShape& s, bf16* out, const bf16* inp, const bf16* weight, const bf16* bias,
                         const bf16* residual);
// gelu_pre (N, OC) = inp @ weight^T + bias and out (N, OC) = gelu(gelu_pre), in one product
// (cuBLASLt's GELU_AUX_BIAS epilogue). OC must be a multiple of 8 and ld_out 0.
Gemm linear_forward_gelu_gemm(const LinearShape& s, bf16* out, bf16* gelu_pre, const bf16* inp, const bf16* weight,
                              const bf16* bias);
// dinp (N, C) bf16 = dout (N, OC; row stride out_ld()) @ weight, overwritten. With gelu_pre
// (N, C) != nullptr: times gelu'(gelu_pre) elementwise (DGELU epilogue; C a multiple of 8).
Gemm linear_backward_input_gemm(const LinearShape& s, bf16* dinp, const bf16* dout, const bf16* weight,
                                const bf16* gelu_pre);
// dweight (OC, C) fp32 += dout^T (OC, N) @ inp (N, C).
Gemm linear_backward_weight_gemm(const LinearShape& s, float* dweight, const bf16* dout, const bf16* inp);

// The same, enqueued through `blas` on `stream`.
Status linear_forward(Blas& blas, const LinearShape& s, bf16* out, const bf16* inp, const bf16* weight,
                      const bf16* bias, const bf16* residual, cudaStream_t stream);
Status linear_forward_gelu(Blas& blas, const LinearShape& s, bf16* out, bf16* gelu_pre, const bf16* inp,
                           const bf16* weight, const bf16* bias, cudaStream_t stream);
Status linear_backward_input(Blas& blas, const LinearShape& s, bf16* dinp, const bf16* dout, const bf16* weight,
                             const bf16* gelu_pre, cudaStream_t stream);
Status linear_backward_weight(Blas& blas, const LinearShape& s, float* dweight, const bf16* dout, const bf16* inp,
                              cudaStream_t stream);

}  // namespace zinf::gpu
