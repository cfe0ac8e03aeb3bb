// Internal: optional CUDA host registration for pinned buffers (pinned_cuda.cpp or pinned_nocuda.cpp).
#pragma once

#include <cstddef>

namespace zinf::aio::detail {

bool cuda_host_register_supported();
// Returns true when the range was registered; false (silently) when no GPU or no CUDA build.
bool cuda_host_register(void* ptr, std::size_t bytes);
void cuda_host_unregister(void* ptr);

}  // namespace zinf::aio::detail
