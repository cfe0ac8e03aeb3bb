// The kernels of DeviceOps on a CUDA GPU (cuda_ops.h), behind plain launchers (no fmt in nvcc code).
#include "gpu/cuda_ops_kernels.h"

#include "gpu/kernel_util.cuh"
#include "optim/kernels.h"
#include "zinf/optim/half.h"

namespace zinf::gpu {
namespace {

using optim::DType;
using optim::detail::kNormBlock;
using optim::detail::kNormLanes;


__global__ void add_kernel(float* acc, const float* in, std::size_t n) {
  for (std::size_t i = detail::grid_start(); i < n; i += detail::grid_stride()) acc[i] = add_rn(acc[i], in[i]);
}

template <DType S, DType D>
__global__ void convert_kernel(void* dst, const void* src, std::size_t n) {
  for (std::size_t i = detail::grid_start(); i < n; i += detail::grid_stride()) {
    float v;
    if constexpr (S == DType::kF32) {
      v = static_cast<const float*>(src)[i];
    } else if constexpr (S == DType::kBF16) {
      v = f32_from_bf16_bits(static_cast<const uint16_t*>(src)[i]);
    } else {
      v = optim::f16_bits_to_f32(static_cast<const uint16_t*>(src)[i]);
    }
    if constexpr (D == DType::kF32) {
      static_cast<float*>(dst)[i] = v;
    } else if constexpr (D == DType::kBF16) {
      static_cast<uint16_t*>(dst)[i] = bf16_bits_rne(v);
    } else {
      static_cast<uint16_t*>(dst)[i] = optim::f32_to_f16_bits(v);
    }
  }
}

// Block j of the norm: kNormLanes threads, lane l summing elements b + l, b + l + 16, ... in
// order (d * d, each rounded on its own: no fused multiply-add), then thread 0 adds the lanes in
// lane order: optim/kernels_scalar.cpp's sq_norm_loop.
__global__ void norm_blocks_kernel(const float* x, std::size_t n, double* block_sums) {
  const std::size_t b = static_cast<std::size_t>(blockIdx.x) * kNormBlock;
  const std::size_t stop = n - b < kNormBlock ? n : b + kNormBlock;
  __shared__ double lanes[kNormLanes];
  double lane = 0.0;
  for (std::size_t i = b + threadIdx.x; i < stop; i += kNormLanes) {
    const double d = x[i];
    lane = __dadd_rn(lane, __dmul_rn(d, d));
  }
  lanes[threadIdx.x] = lane;
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (std::size_t l = 0; l < kNormLanes; ++l) sum = __dadd_rn(sum, lanes[l]);
    block_sums[blockIdx.x] = sum;
  }
}

// The block sums folded in block order (grad_stats' loop): one thread adds them one after the
// other, as the CPU does; the block's threads stage each chunk of sums in shared memory first, so
// the chain of additions waits on shared memory, not on global loads.
constexpr int kFoldThreads = 256;
constexpr int kFoldChunk = 2048;

__global__ void fold_kernel(const double* block_sums, std::size_t blocks, double* out) {
  __shared__ double chunk[kFoldChunk];
  double s = 0.0;
  for (std::size_t base = 0; base < blocks; base += kFoldChunk) {
    const std::size_t n = blocks - base < kFoldChunk ? blocks - base : kFoldChunk;
    for (std::size_t i = threadIdx.x; i < n; i += kFoldThreads) chunk[i] = block_sums[base + i];
    __syncthreads();
    if (threadIdx.x == 0) {
      for (std::size_t i = 0; i < n; ++i) s = __dadd_rn(s, chunk[i]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = s;
}

}  // namespace

Status launch_add(float* acc, const float* in, std::size_t n, cudaStream_t stream) {
  add_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(acc, in, n);
  return launched("add", {Dim{"n", static_cast<long long>(n)}});
}

Status launch_convert(void* dst, optim::DType dst_dtype, const void* src, optim::DType src_dtype, std::size_t n,
                      cudaStream_t stream) {
  const unsigned blocks = grid_for(n, kThreads);
  if (src_dtype == DType::kF32 && dst_dtype == DType::kBF16) {
    convert_kernel<DType::kF32, DType::kBF16><<<blocks, kThreads, 0, stream>>>(dst, src, n);
  } else if (src_dtype == DType::kF32 && dst_dtype == DType::kF16) {
    convert_kernel<DType::kF32, DType::kF16><<<blocks, kThreads, 0, stream>>>(dst, src, n);
  } else if (src_dtype == DType::kBF16 && dst_dtype == DType::kF32) {
    convert_kernel<DType::kBF16, DType::kF32><<<blocks, kThreads, 0, stream>>>(dst, src, n);
  } else if (src_dtype == DType::kF16 && dst_dtype == DType::kF32) {
    convert_kernel<DType::kF16, DType::kF32><<<blocks, kThreads, 0, stream>>>(dst, src, n);
  } else {
    return Status::invalid_argument("convert: one side must be fp32 (bf16 or fp16 to or from fp32)");
  }
  return launched("convert", {Dim{"n", static_cast<long long>(n)}});
}

std::size_t norm_blocks(std::size_t n) { return (n + kNormBlock - 1) / kNormBlock; }

Status launch_sq_norm(const float* x, std::size_t n, double* scratch, cudaStream_t stream) {
  const std::size_t blocks = norm_blocks(n);
  if (blocks == 0) return Status::ok();
  norm_blocks_kernel<<<static_cast<unsigned>(blocks), static_cast<unsigned>(kNormLanes), 0, stream>>>(x, n, scratch);
  ZINF_RETURN_IF_ERROR(launched("norm_blocks", {Dim{"n", static_cast<long long>(n)}}));
  fold_kernel<<<1, kFoldThreads, 0, stream>>>(scratch, blocks, scratch + blocks);
  return launched("norm_fold", {Dim{"blocks", static_cast<long long>(blocks)}});
}

}  // namespace zinf::gpu
