// Pinned-buffer CUDA hooks: cudaHostRegister so GPU copies from these buffers run at full speed.
#include "aio/pinned_cuda.h"

#include <cuda_runtime_api.h>

#include <fmt/format.h>

#include "common/cuda_last_error.h"
#include "zinf/log.h"

namespace zinf::aio::detail {

namespace {
// Every failure here is tolerated (the buffer stays usable, only unregistered), so each is cleared
// from the thread's last error (forget_cuda_error), or the next kernel launch on this thread
// would be reported as failing with it.
bool gpu_present() {
  static const bool present = [] {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    forget_cuda_error(err);
    return err == cudaSuccess && count > 0;
  }();
  return present;
}
}  // namespace

bool cuda_host_register_supported() { return true; }

bool cuda_host_register(void* ptr, std::size_t bytes) {
  if (!gpu_present()) return false;
  const cudaError_t err = cudaHostRegister(ptr, bytes, cudaHostRegisterDefault);
  if (err != cudaSuccess) {
    forget_cuda_error(err);
    log_once(LogLevel::kNotice, "pinned.cudaHostRegister",
             fmt::format("cudaHostRegister of {} bytes failed ({}); GPU copies will be staged",
                         bytes, cudaGetErrorString(err)));
    return false;
  }
  return true;
}

void cuda_host_unregister(void* ptr) { forget_cuda_error(cudaHostUnregister(ptr)); }

}  // namespace zinf::aio::detail
