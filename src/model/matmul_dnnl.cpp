// The bf16 matrix-product backend on oneDNN: bf16 inputs, fp32 accumulation and output.
#include <dnnl.hpp>
#include <fmt/format.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/bf16.h"
#include "model/bf16_matmul.h"
#include "model/fused_kernels.h"

namespace zinf::model {
namespace {

using dnnl::memory;
using dt = dnnl::memory::data_type;

std::string isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return fmt::format("isa {}", static_cast<int>(isa));
  }
}

bool has_bf16_units(dnnl::cpu_isa isa) {
  return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
}

// dst grows to the largest rows x cols seen and is then reused. Returns dst's data. The rounding
// is fused_kernels.h's round_to_bf16 (detail::to_bf16 in the vector clone the CPU takes), so a
// copy a producer wrote and one made here have the same bits.
const uint16_t* convert(std::vector<uint16_t>& dst, const float* src, int rows, int cols) {
  const size_t n = static_cast<size_t>(rows) * cols;
  if (dst.size() < n) dst.resize(n);
  kernels::round_to_bf16(dst.data(), src, rows, cols);
  return dst.data();
}

std::atomic<bool> check_copies{false};
std::atomic<uint64_t> copy_mismatches{0};

// The input's bf16 copy where its producer wrote one, else dst filled by convert().
const uint16_t* rounded(std::vector<uint16_t>& dst, MatmulInput in, int rows, int cols) {
  if (in.bf16 == nullptr) return convert(dst, in.f32, rows, cols);
  if (check_copies.load(std::memory_order_relaxed)) {
    const size_t n = static_cast<size_t>(rows) * cols;
    uint64_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += in.bf16[i] != detail::to_bf16(in.f32[i]);
    copy_mismatches.fetch_add(bad, std::memory_order_relaxed);
  }
  return in.bf16;
}

enum class Product { kForward, kForwardBias, kDinp, kDweight };

// A matrix (rows, cols) with element strides; transposed views come from strides.
memory::desc matrix(int64_t rows, int64_t cols, dt type, int64_t row_stride, int64_t col_stride) {
  return memory::desc({rows, cols}, type, memory::dims{row_stride, col_stride});
}

class DnnlBf16Matmul final : public Bf16MatmulBackend {
 public:
  DnnlBf16Matmul() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

  // The implementation oneDNN picks for a forward product; "ref" means no fast bf16 kernel.
  std::string probe_impl() { return prepared(Product::kForward, 64, 64, 64).impl; }

  void forward(float* out, MatmulInput inp, MatmulInput weight, const float* bias, int N, int C,
               int OC) override {
    const uint16_t* a = rounded(a_, inp, N, C);
    const uint16_t* w = rounded(w_, weight, OC, C);
    const Product p = bias != nullptr ? Product::kForwardBias : Product::kForward;
    run(p, N, OC, C, a, w, out, bias);
  }

  void backward(float* dinp, float* dweight, float* dbias, MatmulInput dout, MatmulInput inp,
                MatmulInput weight, int N, int C, int OC) override {
    const uint16_t* d = rounded(d_, dout, N, OC);
    const uint16_t* w = rounded(w_, weight, OC, C);
    const uint16_t* a = rounded(a_, inp, N, C);
    // dinp (N,C) = dout (N,OC) @ weight (OC,C)
    run(Product::kDinp, N, C, OC, d, w, dinp, nullptr);
    // dweight (OC,C) += dout^T (OC,N) @ inp (N,C): a sum post-op adds the fp32 product to dweight.
    run(Product::kDweight, OC, C, N, d, a, dweight, nullptr);
    if (dbias != nullptr) kernels::bias_grad(dbias, dout.f32, N, OC);  // fp32 row-order column sums
  }

  std::string describe() const override {
    const dnnl_version_t* v = dnnl_version();
    return fmt::format("oneDNN {}.{}.{} bf16 ({})", v->major, v->minor, v->patch,
                       isa_name(dnnl::get_effective_cpu_isa()));
  }

 private:
  using Key = std::array<int64_t, 4>;  // product, M, N, K

  // A product's primitive and its memory objects, made once per shape; a call only points the
  // memory objects at this call's buffers and runs the primitive through the C API with a
  // prepared argument array (the C++ execute() builds a vector per call). Once every shape has
  // run, a call allocates nothing here; oneDNN itself still makes a few small allocations per
  // execution (its execution context; counts in docs/model.md). Its scratchpad stays in library
  // mode: a user scratchpad did not reduce them (docs/benchmarks.md, "Figures behind choices").
  struct Prepared {
    dnnl::matmul matmul;
    std::string impl;
    memory src, weights, dst, bias;  // bias: kForwardBias only
    std::vector<dnnl_exec_arg_t> args;
  };

  // The product dst (M,N) = src (M,K) @ weights (K,N) of kind p, created on first use.
  Prepared& prepared(Product p, int64_t M, int64_t N, int64_t K) {
    const Key key{static_cast<int64_t>(p), M, N, K};
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    memory::desc src, weights, dst = matrix(M, N, dt::f32, N, 1);
    dnnl::primitive_attr attr;
    switch (p) {
      case Product::kForward:
      case Product::kForwardBias:
        src = matrix(M, K, dt::bf16, K, 1);
        weights = matrix(K, N, dt::bf16, 1, K);
        break;
      case Product::kDinp:
        src = matrix(M, K, dt::bf16, K, 1);
        weights = matrix(K, N, dt::bf16, N, 1);
        break;
      case Product::kDweight: {
        src = matrix(M, K, dt::bf16, 1, M);
        weights = matrix(K, N, dt::bf16, N, 1);
        dnnl::post_ops ops;
        ops.append_sum(1.0f);
        attr.set_post_ops(ops);
        break;
      }
    }
    const memory::desc bias = matrix(1, N, dt::f32, N, 1);
    const dnnl::matmul::desc desc = p == Product::kForwardBias ? dnnl::matmul::desc(src, weights, bias, dst)
                                                               : dnnl::matmul::desc(src, weights, dst);
    const dnnl::matmul::primitive_desc pd(desc, attr, engine_);
    // Memory objects with no buffer yet (DNNL_MEMORY_NONE); run() sets the handles.
    Prepared prep{dnnl::matmul(pd), std::string(pd.impl_info_str()), memory(src, engine_, DNNL_MEMORY_NONE),
                  memory(weights, engine_, DNNL_MEMORY_NONE), memory(dst, engine_, DNNL_MEMORY_NONE), memory(), {}};
    prep.args = {{DNNL_ARG_SRC, prep.src.get()}, {DNNL_ARG_WEIGHTS, prep.weights.get()}, {DNNL_ARG_DST, prep.dst.get()}};
    if (p == Product::kForwardBias) {
      prep.bias = memory(bias, engine_, DNNL_MEMORY_NONE);
      prep.args.push_back({DNNL_ARG_BIAS, prep.bias.get()});
    }
    return cache_.emplace(key, std::move(prep)).first->second;
  }

  void run(Product p, int64_t M, int64_t N, int64_t K, const uint16_t* src, const uint16_t* weights, float* dst,
           const float* bias) {
    Prepared& prep = prepared(p, M, N, K);
    // oneDNN takes void*; it only reads the inputs.
    prep.src.set_data_handle(const_cast<uint16_t*>(src));
    prep.weights.set_data_handle(const_cast<uint16_t*>(weights));
    prep.dst.set_data_handle(dst);
    if (bias != nullptr) prep.bias.set_data_handle(const_cast<float*>(bias));
    dnnl::error::wrap_c_api(dnnl_primitive_execute(prep.matmul.get(), stream_.get(), static_cast<int>(prep.args.size()),
                                                   prep.args.data()),
                            "could not execute a bf16 matmul");
    stream_.wait();
  }

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::map<Key, Prepared> cache_;
  std::vector<uint16_t> a_, w_, d_;  // bf16 copies of inp, weight, dout
};

}  // namespace

namespace detail {

void set_check_bf16_copies(bool on) { check_copies.store(on); }
uint64_t bf16_copy_mismatches() { return copy_mismatches.load(); }

MatmulSupport probe_matmul_support() {
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  return MatmulSupport{true, has_bf16_units(isa), isa == dnnl::cpu_isa::avx512_core_amx, isa_name(isa), {}};
}

Result<std::unique_ptr<Bf16MatmulBackend>> make_bf16_matmul_backend() {
  try {
    auto backend = std::make_unique<DnnlBf16Matmul>();
    const std::string impl = backend->probe_impl();
    if (impl.rfind("ref", 0) == 0) {
      return Status::unsupported(fmt::format(
          "bf16 matmul: oneDNN has only its reference bf16 matmul ({}) on this CPU ({})", impl,
          isa_name(dnnl::get_effective_cpu_isa())));
    }
    return std::unique_ptr<Bf16MatmulBackend>(std::move(backend));
  } catch (const dnnl::error& e) {
    return Status::unsupported(fmt::format("bf16 matmul: oneDNN: {}", e.what()));
  }
}

}  // namespace detail
}  // namespace zinf::model
