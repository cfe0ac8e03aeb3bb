// Pinned-buffer CUDA hooks for builds without CUDA: nothing to register.
#include "aio/pinned_cuda.h"

namespace zinf::aio::detail {

bool cuda_host_register_supported() { return false; }
bool cuda_host_register(void*, std::size_t) { return false; }
void cuda_host_unregister(void*) {}

}  // namespace zinf::aio::detail
