// cuBLASLt products: the handle and workspace, one Gemm per call with its checks and errors,
// the heuristic's algorithm kept per shape, and the row-major linear layers of the model.
#include "gpu/blas.h"

#include <cublasLt.h>
#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <map>

#include "gpu/cuda_error.h"
#include "gpu/launch_geometry.h"

namespace zinf::gpu {

const char* epilogue_name(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone: return "none";
    case GemmEpilogue::kBias: return "bias";
    case GemmEpilogue::kGeluAuxBias: return "gelu_aux_bias";
    case GemmEpilogue::kDGelu: return "dgelu";
  }
  return "?";
}

namespace {

const char* type_name(GemmOutput t) { return t == GemmOutput::kF32 ? "fp32" : "bf16"; }

// Stored (rows, cols) of A and B, column-major.
int a_rows(const Gemm& g) { return g.trans_a ? g.k : g.m; }
int a_cols(const Gemm& g) { return g.trans_a ? g.m : g.k; }
int b_rows(const Gemm& g) { return g.trans_b ? g.n : g.k; }
int b_cols(const Gemm& g) { return g.trans_b ? g.k : g.n; }

bool needs_aux(GemmEpilogue e) { return e == GemmEpilogue::kGeluAuxBias || e == GemmEpilogue::kDGelu; }
bool needs_bias(GemmEpilogue e) { return e == GemmEpilogue::kBias || e == GemmEpilogue::kGeluAuxBias; }

}  // namespace

std::string describe_gemm(const Gemm& g) {
  std::string s = fmt::format("{}: D({}x{}, ld {}, {}) = {} * A{}({}x{}, ld {}) @ B{}({}x{}, ld {})", g.what, g.m, g.n,
                              g.ldd, type_name(g.d_type), g.alpha, g.trans_a ? "^T" : "", a_rows(g), a_cols(g), g.lda,
                              g.trans_b ? "^T" : "", b_rows(g), b_cols(g), g.ldb);
  if (g.c != nullptr) s += fmt::format(" + {} * C(ld {}{})", g.beta, g.ldc, g.c == g.d ? ", in place" : "");
  if (g.epilogue != GemmEpilogue::kNone) s += fmt::format(", epilogue {}", epilogue_name(g.epilogue));
  if (needs_aux(g.epilogue)) s += fmt::format(" (aux ld {})", g.ld_aux);
  if (g.batch != 1) {
    s += fmt::format(", batch {} (strides A {}, B {}, C {}, D {})", g.batch, g.stride_a, g.stride_b, g.stride_c,
                     g.stride_d);
  }
  return s;
}

Status check_gemm(const Gemm& g) {
  auto bad = [&](std::string_view why) { return Status::invalid_argument(fmt::format("{}: {}", describe_gemm(g), why)); };
  if (g.m < 1 || g.n < 1 || g.k < 1) return bad("m, n and k must be >= 1");
  if (g.a == nullptr || g.b == nullptr || g.d == nullptr) return bad("A, B and D must not be null");
  if (g.lda < a_rows(g)) return bad("lda is less than A's stored rows");
  if (g.ldb < b_rows(g)) return bad("ldb is less than B's stored rows");
  if (g.ldd < g.m) return bad("ldd is less than m");
  if (g.c == nullptr && g.beta != 0.0f) return bad("beta is not 0 but there is no C");
  if (g.c != nullptr && g.ldc < g.m) return bad("ldc is less than m");
  if (g.c == g.d && g.ldc != g.ldd) return bad("C is D (in place) with a different leading dimension");
  if (g.batch < 1) return bad("batch must be >= 1");
  if (g.stride_a < 0 || g.stride_b < 0 || g.stride_c < 0 || g.stride_d < 0) return bad("batch strides must be >= 0");
  if (g.batch > 1 && g.epilogue != GemmEpilogue::kNone) return bad("batched products take no epilogue");
  if (g.c == g.d && g.batch > 1 && g.stride_c != g.stride_d) return bad("C is D (in place) with a different stride");
  if (g.epilogue == GemmEpilogue::kNone) return Status::ok();
  if (g.d_type != GemmOutput::kBf16) return bad("epilogues need a bf16 D");
  if (needs_bias(g.epilogue) && g.bias == nullptr) return bad("the epilogue needs a bias");
  if (needs_aux(g.epilogue)) {
    if (g.aux == nullptr) return bad("the epilogue needs an aux matrix");
    if (g.ld_aux < g.m || g.ld_aux % 8 != 0) return bad("aux ld must be >= m and a multiple of 8");
    if (g.c != nullptr) return bad("GELU epilogues take no C");
  }
  return Status::ok();
}

// ---- Blas --------------------------------------------------------------------------------------

namespace {

// Move-only owners of cuBLASLt's descriptors.
template <typename T, cublasStatus_t (*Destroy)(T)>
class LtOwner {
 public:
  LtOwner() = default;
  LtOwner(const LtOwner&) = delete;
  LtOwner& operator=(const LtOwner&) = delete;
  ~LtOwner() {
    if (h_ != nullptr) (void)Destroy(h_);
  }
  T* out() { return &h_; }
  T get() const { return h_; }

 private:
  T h_ = nullptr;
};
using OpDesc = LtOwner<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using Layout = LtOwner<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using Preference = LtOwner<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

cudaDataType_t cuda_type(GemmOutput t) { return t == GemmOutput::kF32 ? CUDA_R_32F : CUDA_R_16BF; }

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone: return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::kBias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kGeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::kDGelu: return CUBLASLT_EPILOGUE_DGELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// Everything the heuristic's choice depends on.
using GemmKey = std::array<int64_t, 25>;
GemmKey gemm_key(const Gemm& g) {
  const void* c = g.c != nullptr ? g.c : g.d;
  return {g.trans_a,
          g.trans_b,
          g.m,
          g.n,
          g.k,
          g.lda,
          g.ldb,
          g.c != nullptr ? g.ldc : g.ldd,
          g.ldd,
          static_cast<int64_t>(g.d_type),
          static_cast<int64_t>(g.epilogue),
          g.ld_aux,
          alignment_of(g.a),
          alignment_of(g.b),
          alignment_of(c),
          alignment_of(g.d),
          alignment_of(g.bias),
          alignment_of(g.aux),
          g.c != nullptr,
          g.c == g.d,
          g.batch,
          g.stride_a,
          g.stride_b,
          g.stride_c,
          g.stride_d};
}

template <typename T>
cublasStatus_t set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  return cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v));
}
template <typename T>
cublasStatus_t set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const T& v) {
  return cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v));
}

}  // namespace

struct Blas::State {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  std::map<GemmKey, cublasLtMatmulAlgo_t> algos;

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (workspace != nullptr) forget_error(cudaFree(workspace));
    if (handle != nullptr) (void)cublasLtDestroy(handle);
  }
};

Blas::Blas(std::unique_ptr<State> s) : s_(std::move(s)) {}
Blas::Blas(Blas&&) noexcept = default;
Blas& Blas::operator=(Blas&&) noexcept = default;
Blas::~Blas() = default;

Result<Blas> Blas::create(std::size_t workspace_bytes) {
  int devices = 0;
  ZINF_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&devices), "Blas::create: cudaGetDeviceCount");
  if (devices == 0) return Status::unsupported("Blas::create: no CUDA device");
  auto s = std::make_unique<State>();
  ZINF_RETURN_IF_ERROR(cublas_status(cublasLtCreate(&s->handle), "Blas::create: cublasLtCreate"));
  if (workspace_bytes > 0) {
    ZINF_CUDA_RETURN_IF_ERROR(cudaMalloc(&s->workspace, workspace_bytes),
                              fmt::format("Blas::create: cudaMalloc of the {}-byte cuBLASLt workspace", workspace_bytes));
    s->workspace_bytes = workspace_bytes;
  }
  return Blas(std::move(s));
}

Status Blas::matmul(const Gemm& g, cudaStream_t stream) {
  ZINF_RETURN_IF_ERROR(check_gemm(g));
  auto lt = [&](cublasStatus_t st, std::string_view call) {
    return cublas_status(st, fmt::format("{}: {}", describe_gemm(g), call));
  };
  OpDesc op;
  ZINF_RETURN_IF_ERROR(lt(cublasLtMatmulDescCreate(op.out(), CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate"));
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  ZINF_RETURN_IF_ERROR(lt(set_attr(op.get(), CUBLASLT_MATMUL_DESC_TRANSA, ta), "set TRANSA"));
  ZINF_RETURN_IF_ERROR(lt(set_attr(op.get(), CUBLASLT_MATMUL_DESC_TRANSB, tb), "set TRANSB"));
  if (g.epilogue != GemmEpilogue::kNone) {
    ZINF_RETURN_IF_ERROR(lt(set_attr(op.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(g.epilogue)), "set EPILOGUE"));
  }
  if (needs_bias(g.epilogue)) {
    const void* bias = g.bias;
    ZINF_RETURN_IF_ERROR(lt(set_attr(op.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias), "set BIAS_POINTER"));
  }
  if (needs_aux(g.epilogue)) {
    void* aux = g.aux;
    const int64_t ld_aux = g.ld_aux;
    ZINF_RETURN_IF_ERROR(lt(set_attr(op.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux), "set AUX_POINTER"));
    ZINF_RETURN_IF_ERROR(lt(set_attr(op.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ld_aux), "set AUX_LD"));
  }

  Layout a, b, c, d;
  const cudaDataType_t dt = cuda_type(g.d_type);
  ZINF_RETURN_IF_ERROR(lt(cublasLtMatrixLayoutCreate(a.out(), CUDA_R_16BF, a_rows(g), a_cols(g), g.lda), "layout A"));
  ZINF_RETURN_IF_ERROR(lt(cublasLtMatrixLayoutCreate(b.out(), CUDA_R_16BF, b_rows(g), b_cols(g), g.ldb), "layout B"));
  ZINF_RETURN_IF_ERROR(lt(cublasLtMatrixLayoutCreate(c.out(), dt, g.m, g.n, g.c != nullptr ? g.ldc : g.ldd), "layout C"));
  ZINF_RETURN_IF_ERROR(lt(cublasLtMatrixLayoutCreate(d.out(), dt, g.m, g.n, g.ldd), "layout D"));
  const void* c_ptr = g.c != nullptr ? g.c : g.d;  // beta is 0 without C: cuBLASLt reads nothing
  if (g.batch > 1) {
    const int32_t count = g.batch;
    const int64_t strides[4] = {g.stride_a, g.stride_b, g.c != nullptr ? g.stride_c : g.stride_d, g.stride_d};
    const cublasLtMatrixLayout_t layouts[4] = {a.get(), b.get(), c.get(), d.get()};
    for (int i = 0; i < 4; i++) {
      ZINF_RETURN_IF_ERROR(lt(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                               sizeof(count)),
                              "set BATCH_COUNT"));
      ZINF_RETURN_IF_ERROR(lt(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                               &strides[i], sizeof(strides[i])),
                              "set STRIDED_BATCH_OFFSET"));
    }
  }

  const GemmKey key = gemm_key(g);
  auto found = s_->algos.find(key);
  if (found == s_->algos.end()) {
    Preference pref;
    ZINF_RETURN_IF_ERROR(lt(cublasLtMatmulPreferenceCreate(pref.out()), "cublasLtMatmulPreferenceCreate"));
    const uint64_t ws = s_->workspace_bytes;
    ZINF_RETURN_IF_ERROR(lt(set_pref(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws), "set MAX_WORKSPACE_BYTES"));
    // The heuristic assumes 256-byte aligned matrices unless told otherwise.
    const uint32_t align[4] = {alignment_of(g.a), alignment_of(g.b), alignment_of(c_ptr), alignment_of(g.d)};
    ZINF_RETURN_IF_ERROR(lt(set_pref(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[0]), "set ALIGNMENT_A"));
    ZINF_RETURN_IF_ERROR(lt(set_pref(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[1]), "set ALIGNMENT_B"));
    ZINF_RETURN_IF_ERROR(lt(set_pref(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]), "set ALIGNMENT_C"));
    ZINF_RETURN_IF_ERROR(lt(set_pref(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[3]), "set ALIGNMENT_D"));
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    ZINF_RETURN_IF_ERROR(lt(cublasLtMatmulAlgoGetHeuristic(s_->handle, op.get(), a.get(), b.get(), c.get(), d.get(),
                                                           pref.get(), 1, &result, &returned),
                            "cublasLtMatmulAlgoGetHeuristic"));
    if (returned == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
      return Status::unsupported(fmt::format("{}: cuBLASLt has no algorithm for this product", describe_gemm(g)));
    }
    found = s_->algos.emplace(key, result.algo).first;
  }
  const float alpha = g.alpha;
  const float beta = g.beta;
  return lt(cublasLtMatmul(s_->handle, op.get(), &alpha, g.a, a.get(), g.b, b.get(), &beta, c_ptr, c.get(), g.d, d.get(),
                           &found->second, s_->workspace, s_->workspace_bytes, stream),
            "cublasLtMatmul");
}

// ---- linear layers -----------------------------------------------------------------------------
// Row-major X (r, c) with row stride ld is column-major X^T (c, r) with the same ld, so each
// row-major product below is a column-major one on the transposes.

Gemm linear_forward_gemm(const LinearShape& s, bf16* out, const bf16* inp, const bf16* weight, const bf16* bias,
                         const bf16* residual) {
  // out^T (OC, N) = weight (stored (C, OC) column-major, transposed) @ inp^T (C, N)
  Gemm g;
  g.what = "linear_forward";
  g.trans_a = true;
  g.m = s.OC;
  g.n = s.N;
  g.k = s.C;
  g.a = weight;
  g.lda = s.C;
  g.b = inp;
  g.ldb = s.C;
  g.d = out;
  g.ldd = s.out_ld();
  g.d_type = GemmOutput::kBf16;
  if (residual != nullptr) {
    g.c = residual;
    g.ldc = s.out_ld();
    g.beta = 1.0f;
  }
  if (bias != nullptr) {
    g.epilogue = GemmEpilogue::kBias;
    g.bias = bias;
  }
  return g;
}

Gemm linear_forward_gelu_gemm(const LinearShape& s, bf16* out, bf16* gelu_pre, const bf16* inp, const bf16* weight,
                              const bf16* bias) {
  Gemm g = linear_forward_gemm(s, out, inp, weight, bias, nullptr);
  g.what = "linear_forward_gelu";
  g.epilogue = GemmEpilogue::kGeluAuxBias;
  g.aux = gelu_pre;
  g.ld_aux = s.OC;  // gelu_pre is (N, OC) packed
  return g;
}

Gemm linear_backward_input_gemm(const LinearShape& s, bf16* dinp, const bf16* dout, const bf16* weight,
                                const bf16* gelu_pre) {
  // dinp^T (C, N) = weight (stored (C, OC) column-major) @ dout^T (OC, N)
  Gemm g;
  g.what = gelu_pre != nullptr ? "linear_backward_input_dgelu" : "linear_backward_input";
  g.m = s.C;
  g.n = s.N;
  g.k = s.OC;
  g.a = weight;
  g.lda = s.C;
  g.b = dout;
  g.ldb = s.out_ld();
  g.d = dinp;
  g.ldd = s.C;
  g.d_type = GemmOutput::kBf16;
  if (gelu_pre != nullptr) {
    g.epilogue = GemmEpilogue::kDGelu;
    g.aux = const_cast<bf16*>(gelu_pre);  // read only: cuBLASLt takes one pointer for both directions
    g.ld_aux = s.C;
  }
  return g;
}

Gemm linear_backward_weight_gemm(const LinearShape& s, float* dweight, const bf16* dout, const bf16* inp) {
  // dweight^T (C, OC) += inp^T (C, N) @ dout (stored (OC, N) column-major, transposed)
  Gemm g;
  g.what = "linear_backward_weight";
  g.trans_b = true;
  g.m = s.C;
  g.n = s.OC;
  g.k = s.N;
  g.a = inp;
  g.lda = s.C;
  g.b = dout;
  g.ldb = s.out_ld();
  g.d = dweight;
  g.ldd = s.C;
  g.d_type = GemmOutput::kF32;
  g.c = dweight;
  g.ldc = s.C;
  g.beta = 1.0f;
  return g;
}

namespace {
Status check_linear(const LinearShape& s, const char* what) {
  if (s.N < 1 || s.C < 1 || s.OC < 1 || s.out_ld() < s.OC) {
    return Status::invalid_argument(
        fmt::format("{}: N ({}), C ({}), OC ({}) must be >= 1 and ld_out ({}) >= OC", what, s.N, s.C, s.OC, s.ld_out));
  }
  return Status::ok();
}
}  // namespace

Status linear_forward(Blas& blas, const LinearShape& s, bf16* out, const bf16* inp, const bf16* weight,
                      const bf16* bias, const bf16* residual, cudaStream_t stream) {
  ZINF_RETURN_IF_ERROR(check_linear(s, "linear_forward"));
  return blas.matmul(linear_forward_gemm(s, out, inp, weight, bias, residual), stream);
}

Status linear_forward_gelu(Blas& blas, const LinearShape& s, bf16* out, bf16* gelu_pre, const bf16* inp,
                           const bf16* weight, const bf16* bias, cudaStream_t stream) {
  ZINF_RETURN_IF_ERROR(check_linear(s, "linear_forward_gelu"));
  if (s.ld_out != 0 && s.ld_out != s.OC) {
    return Status::invalid_argument(fmt::format("linear_forward_gelu: ld_out ({}) must be OC ({})", s.ld_out, s.OC));
  }
  return blas.matmul(linear_forward_gelu_gemm(s, out, gelu_pre, inp, weight, bias), stream);
}

Status linear_backward_input(Blas& blas, const LinearShape& s, bf16* dinp, const bf16* dout, const bf16* weight,
                             const bf16* gelu_pre, cudaStream_t stream) {
  ZINF_RETURN_IF_ERROR(check_linear(s, "linear_backward_input"));
  return blas.matmul(linear_backward_input_gemm(s, dinp, dout, weight, gelu_pre), stream);
}

Status linear_backward_weight(Blas& blas, const LinearShape& s, float* dweight, const bf16* dout, const bf16* inp,
                              cudaStream_t stream) {
  ZINF_RETURN_IF_ERROR(check_linear(s, "linear_backward_weight"));
  return blas.matmul(linear_backward_weight_gemm(s, dweight, dout, inp), stream);
}

}  // namespace zinf::gpu
