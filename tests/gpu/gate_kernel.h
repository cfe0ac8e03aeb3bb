// Test-only device work whose completion the host controls: a one-thread kernel that waits until
// the host opens a gate, so that tests can check ordering (a copy or a reuse must not happen
// before the gate's work completes) without timing assumptions.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace zinf::gpu::testing {

// Host-mapped flags the gate kernel polls; the host opens the gate once. Destroying a Gate opens it
// and waits for the device.
class Gate {
 public:
  Gate();
  ~Gate();
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  // Empty when the gate's pinned flags were allocated; else CUDA's error.
  const std::string& error() const { return error_; }
  // Enqueues on `stream` a kernel that returns when the gate opens (or after a 60 s safety limit,
  // which sets timed_out(): the test is then broken, never a pass).
  cudaError_t launch(cudaStream_t stream);
  void open();
  bool timed_out() const;

 private:
  volatile int* flags_ = nullptr;  // [0]: open, [1]: the kernel timed out
  std::string error_;
};

// Enqueues a kernel on `stream` that sets bytes [0, n) of device memory `p` to `value`.
cudaError_t launch_fill(cudaStream_t stream, void* p, std::size_t n, unsigned char value);

// Enqueues a kernel on `stream` that sets p[i] = p[i] * mul + add for i < n (fp32, no FMA
// contraction: the same bits as the host's p * mul + add).
cudaError_t launch_axpb(cudaStream_t stream, float* p, std::size_t n, float mul, float add);

}  // namespace zinf::gpu::testing
