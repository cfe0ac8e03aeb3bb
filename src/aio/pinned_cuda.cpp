// Pinned-buffer CUDA hooks: cudaHostRegister so GPU copies from these buffers run at full speed.
#include "aio/pinned_cuda.h"

#include <cuda_runtime_api.h>

#include <fmt/format.h>

#include "zinf/log.h"

namespace zinf::aio::detail {

namespace {
bool gpu_present() {
  static const bool present = [] {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  }();
  return present;
}
}  // namespace

bool cuda_host_register_supported() { return true; }

bool cuda_host_register(void* ptr, std::size_t bytes) {
  if (!gpu_present()) return false;
  const cudaError_t err = cudaHostRegister(ptr, bytes, cudaHostRegisterDefault);
  if (err != cudaSuccess) {
    log_once(LogLevel::kNotice, "pinned.cudaHostRegister",
             fmt::format("cudaHostRegister of {} bytes failed ({}); GPU copies will be staged",
                         bytes, cudaGetErrorString(err)));
    return false;
  }
  return true;
}

void cuda_host_unregister(void* ptr) { (void)cudaHostUnregister(ptr); }

}  // namespace zinf::aio::detail
