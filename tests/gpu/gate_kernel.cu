// Test-only kernels: a gate the host opens, and a byte fill.
#include "gate_kernel.h"

#include <atomic>
#include <cstdint>

namespace zinf::gpu::testing {

namespace {

__device__ std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void gate_kernel(volatile int* flags) {
  const std::uint64_t start = global_ns();
  const std::uint64_t limit_ns = 60ull * 1000 * 1000 * 1000;
  while (flags[0] == 0) {
    if (global_ns() - start > limit_ns) {
      flags[1] = 1;
      return;
    }
    __nanosleep(1000);
  }
}

__global__ void fill_kernel(unsigned char* p, std::size_t n, unsigned char value) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    p[i] = value;
  }
}

}  // namespace

Gate::Gate() {
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, 2 * sizeof(int), cudaHostAllocMapped);
  if (err != cudaSuccess) {
    error_ = std::string("cudaHostAlloc of the gate flags: ") + cudaGetErrorString(err);
    (void)cudaGetLastError();
    return;
  }
  flags_ = static_cast<volatile int*>(p);
  flags_[0] = 0;
  flags_[1] = 0;
}

Gate::~Gate() {
  if (flags_ == nullptr) return;
  // Open it, so that a test that failed before opening does not leave a kernel spinning, and let
  // the kernel finish before its flags are freed.
  open();
  (void)cudaDeviceSynchronize();
  (void)cudaFreeHost(const_cast<int*>(flags_));
}

cudaError_t Gate::launch(cudaStream_t stream) {
  if (flags_ == nullptr) return cudaErrorInvalidValue;
  int* dev = nullptr;
  const cudaError_t err = cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), const_cast<int*>(flags_), 0);
  if (err != cudaSuccess) return err;
  gate_kernel<<<1, 1, 0, stream>>>(dev);
  return cudaGetLastError();
}

void Gate::open() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  flags_[0] = 1;
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

bool Gate::timed_out() const { return flags_ != nullptr && flags_[1] != 0; }

namespace {
__global__ void axpb_kernel(float* p, std::size_t n, float mul, float add) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    p[i] = __fadd_rn(__fmul_rn(p[i], mul), add);
  }
}
}  // namespace

cudaError_t launch_axpb(cudaStream_t stream, float* p, std::size_t n, float mul, float add) {
  if (n == 0) return cudaSuccess;
  const unsigned threads = 256;
  std::size_t blocks = (n + threads - 1) / threads;
  if (blocks > 1024) blocks = 1024;
  axpb_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(p, n, mul, add);
  return cudaGetLastError();
}

cudaError_t launch_fill(cudaStream_t stream, void* p, std::size_t n, unsigned char value) {
  if (n == 0) return cudaSuccess;
  const unsigned threads = 256;
  std::size_t blocks = (n + threads - 1) / threads;
  if (blocks > 1024) blocks = 1024;
  fill_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(static_cast<unsigned char*>(p), n, value);
  return cudaGetLastError();
}

}  // namespace zinf::gpu::testing
