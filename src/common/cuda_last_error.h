// Internal, CUDA builds only: clearing a tolerated CUDA failure from the thread's last error. Header
// only, so that every CUDA-built file (aio's pinned buffers, the NCCL communicator, the GPU layer)
// uses the same rule without linking a layer it must not depend on.
#pragma once

#include <cuda_runtime_api.h>

namespace zinf {

// Call after a CUDA failure the caller tolerates (a refused registration, a probe, a query that
// says "not ready", a failed free in a destructor). CUDA keeps the last error per thread and
// cudaGetLastError(), which launch checks read, would otherwise report it as the next launch's
// failure. Clears it only while it is still `err`, so an unread earlier error is not lost; sticky
// errors (a broken context, no driver) stay, as CUDA keeps them anyway.
inline void forget_cuda_error(cudaError_t err) {
  if (err != cudaSuccess && cudaPeekAtLastError() == err) (void)cudaGetLastError();
}

}  // namespace zinf
