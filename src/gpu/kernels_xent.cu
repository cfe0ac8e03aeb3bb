// The fused softmax + cross-entropy over the tied head's logits (loss and, in the same pass,
// the logits' gradient in place), and the batch's mean loss.
#include "gpu/kernel_util.cuh"
#include "gpu/kernels.h"

namespace zinf::gpu {
namespace {

using detail::to_bf16;
using detail::to_f32;
using detail::warp_max;
using detail::warp_sum;

constexpr int kXentThreads = 512;
constexpr int kMeanThreads = 256;

// Block-wide max or sum in a fixed order: butterflies within each warp, then every warp
// reduces the warps' results the same way, so all threads return the same bits. blockDim.x
// must be a multiple of 32; `shared` holds 32 floats. Contains __syncthreads: all threads call.
template <bool kMax>
__device__ float block_reduce(float v, float* shared) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int warps = static_cast<int>(blockDim.x / 32);
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();  // an earlier call's readers are done with `shared`
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float r = lane < warps ? shared[lane] : (kMax ? -INFINITY : 0.0f);
  return kMax ? warp_max(r) : warp_sum(r);
}

// One block per row.
__global__ void softmax_xent_kernel(bf16* logits, float* losses, const int32_t* targets, int V, int ld, float dloss,
                                    bool write_grad) {
  __shared__ float red[32];
  const std::size_t row = blockIdx.x;
  bf16* x = logits + row * static_cast<std::size_t>(ld);
  const int32_t target = targets[row];
  const bool target_ok = target >= 0 && target < V;
  // Read before block_reduce's barriers, so before any thread overwrites the row.
  const float target_logit = target_ok ? to_f32(x[target]) : 0.0f;
  float mx = -INFINITY;
  for (int v = static_cast<int>(threadIdx.x); v < V; v += blockDim.x) mx = fmaxf(mx, to_f32(x[v]));
  mx = block_reduce<true>(mx, red);
  float sum = 0.0f;
  for (int v = static_cast<int>(threadIdx.x); v < V; v += blockDim.x) sum += expf(to_f32(x[v]) - mx);
  sum = block_reduce<false>(sum, red);
  if (threadIdx.x == 0) losses[row] = target_ok ? mx + logf(sum) - target_logit : __int_as_float(0x7fc00000);
  if (!write_grad) return;
  const float inv = 1.0f / sum;
  for (int v = static_cast<int>(threadIdx.x); v < V; v += blockDim.x) {
    const float p = expf(to_f32(x[v]) - mx) * inv;
    x[v] = to_bf16((v == target ? p - 1.0f : p) * dloss);
  }
}

// One block: double partial sums per thread in index order, then a fixed tree.
__global__ void mean_loss_kernel(float* out, const float* losses, int N) {
  __shared__ double partial[kMeanThreads];
  double acc = 0.0;
  for (int i = static_cast<int>(threadIdx.x); i < N; i += kMeanThreads) acc += losses[i];
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kMeanThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = static_cast<float>(partial[0] / N);
}

}  // namespace

Status softmax_xent(bf16* logits, float* losses, const int32_t* targets, int N, int V, int ld, float dloss,
                    bool write_grad, cudaStream_t stream) {
  const auto dims = {Dim{"N", N}, Dim{"V", V}, Dim{"ld", ld}};
  if (N < 1 || V < 1 || ld < V) return bad_sizes("softmax_xent", dims, "N and V must be >= 1 and ld >= V");
  softmax_xent_kernel<<<static_cast<unsigned>(N), kXentThreads, 0, stream>>>(logits, losses, targets, V, ld, dloss,
                                                                            write_grad);
  return launched("softmax_xent", dims);
}

Status mean_loss(float* out, const float* losses, int N, cudaStream_t stream) {
  if (N < 1) return bad_sizes("mean_loss", {Dim{"N", N}}, "N must be >= 1");
  mean_loss_kernel<<<1, kMeanThreads, 0, stream>>>(out, losses, N);
  return launched("mean_loss", {Dim{"N", N}});
}

}  // namespace zinf::gpu
