// The token (+ position) embedding on the GPU: forward gather and a deterministic backward
// (per-token sums over host-built buckets instead of atomics).
#include "gpu/kernel_util.cuh"
#include "gpu/kernels.h"

namespace zinf::gpu {
namespace {

using detail::grid_start;
using detail::grid_stride;
using detail::to_bf16;
using detail::to_f32;

__global__ void embedding_forward_kernel(bf16* out, const int32_t* ids, const bf16* wte, const bf16* wpe, int T,
                                         int C, int V, std::size_t total) {
  const std::size_t c_size = static_cast<std::size_t>(C);
  for (std::size_t i = grid_start(); i < total; i += grid_stride()) {
    const std::size_t n = i / c_size;  // b * T + t
    const std::size_t c = i % c_size;
    const std::size_t t = n % static_cast<std::size_t>(T);
    const int32_t id = ids[n];
    float v = __int_as_float(0x7fc00000);  // NaN for an id outside the vocabulary
    if (id >= 0 && id < V) {
      v = to_f32(wte[static_cast<std::size_t>(id) * c_size + c]);
      if (wpe != nullptr) v += to_f32(wpe[t * c_size + c]);  // (Llama has no position table)
    }
    out[i] = to_bf16(v);
  }
}

// dwpe[t, c] += sum over b, b in order.
__global__ void embedding_wpe_backward_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  const std::size_t total = static_cast<std::size_t>(T) * static_cast<std::size_t>(C);
  const std::size_t row = static_cast<std::size_t>(T) * static_cast<std::size_t>(C);  // one b
  for (std::size_t i = grid_start(); i < total; i += grid_stride()) {
    float acc = 0.0f;
    for (int b = 0; b < B; b++) acc += dout[static_cast<std::size_t>(b) * row + i];
    dwpe[i] += acc;
  }
}

// Block (x = bucket i, y = channel block): dwte[tokens[i], c] += the bucket's dout rows in order.
__global__ void embedding_wte_backward_kernel(float* dwte, const float* dout, const int32_t* tokens,
                                              const int32_t* starts, const int32_t* positions, int C) {
  const int c = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x);
  if (c >= C) return;
  const int i = static_cast<int>(blockIdx.x);
  const std::size_t c_size = static_cast<std::size_t>(C);
  float acc = 0.0f;
  for (int p = starts[i]; p < starts[i + 1]; p++) {
    acc += dout[static_cast<std::size_t>(positions[p]) * c_size + static_cast<std::size_t>(c)];
  }
  dwte[static_cast<std::size_t>(tokens[i]) * c_size + static_cast<std::size_t>(c)] += acc;
}

}  // namespace

Status embedding_forward(bf16* out, const int32_t* ids, const bf16* wte, const bf16* wpe, int B, int T, int C, int V,
                         cudaStream_t stream) {
  const auto dims = {Dim{"B", B}, Dim{"T", T}, Dim{"C", C}, Dim{"V", V}};
  if (B < 1 || T < 1 || C < 1 || V < 1) return bad_sizes("embedding_forward", dims, "every size must be >= 1");
  const std::size_t total = static_cast<std::size_t>(B) * T * C;
  embedding_forward_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(out, ids, wte, wpe, T, C, V, total);
  return launched("embedding_forward", dims);
}

Status embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, const int32_t* starts,
                          const int32_t* positions, int num_tokens, int B, int T, int C, cudaStream_t stream) {
  const auto dims = {Dim{"B", B}, Dim{"T", T}, Dim{"C", C}, Dim{"tokens", num_tokens}};
  if (B < 1 || T < 1 || C < 1 || num_tokens < 0 || num_tokens > static_cast<long long>(B) * T) {
    return bad_sizes("embedding_backward", dims, "B, T, C must be >= 1 and tokens in [0, B*T]");
  }
  if (dwpe != nullptr) {
    const std::size_t total = static_cast<std::size_t>(T) * C;
    embedding_wpe_backward_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(dwpe, dout, B, T, C);
    ZINF_RETURN_IF_ERROR(launched("embedding_backward (wpe)", dims));
  }
  if (num_tokens == 0) return Status::ok();
  const unsigned channel_blocks = static_cast<unsigned>((C + kThreads - 1) / kThreads);
  if (channel_blocks > 65535) return Status::unsupported(describe("embedding_backward", dims) + ": C too large for grid.y");
  const dim3 grid(static_cast<unsigned>(num_tokens), channel_blocks);
  embedding_wte_backward_kernel<<<grid, kThreads, 0, stream>>>(dwte, dout, tokens, starts, positions, C);
  return launched("embedding_backward (wte)", dims);
}

}  // namespace zinf::gpu
