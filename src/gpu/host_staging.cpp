#include "gpu/host_staging.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <utility>

#include "gpu/cuda_error.h"
#include "zinf/log.h"

namespace zinf::gpu {

Result<HostStaging> HostStaging::allocate(std::size_t bytes, std::string_view what, bool force_host_alloc) {
  HostStaging s;
  if (bytes == 0) return s;
  std::string refused;
  if (!force_host_alloc) {
    auto pinned = aio::PinnedBuffer::allocate(bytes);
    if (!pinned.is_ok()) return pinned.status().with_context(fmt::format("{} ({} bytes)", what, bytes));
    if (pinned->cuda_registered()) {
      s.pinned_ = std::move(pinned).value();
      s.data_ = s.pinned_.data();
      s.size_ = bytes;
      s.source_ = Source::kRegisteredPinnedBuffer;
      return s;
    }
    refused = "cudaHostRegister was refused (see the notice above)";
  } else {
    refused = "cudaHostRegister not tried (forced)";
  }
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) {
    forget_error(err);
    return cuda_status(err, fmt::format("{}: {} and cudaHostAlloc of {} bytes failed too", what, refused, bytes));
  }
  if (!force_host_alloc) {
    log_once(LogLevel::kNotice, "gpu.host_staging.host_alloc",
             fmt::format("{}: {}; using cudaHostAlloc'd memory for GPU staging instead", what, refused));
  }
  s.data_ = p;
  s.size_ = bytes;
  s.source_ = Source::kCudaHostAlloc;
  return s;
}

HostStaging::~HostStaging() { reset(); }

HostStaging::HostStaging(HostStaging&& other) noexcept
    : pinned_(std::move(other.pinned_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      source_(std::exchange(other.source_, Source::kNone)) {}

HostStaging& HostStaging::operator=(HostStaging&& other) noexcept {
  if (this != &other) {
    reset();
    pinned_ = std::move(other.pinned_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    source_ = std::exchange(other.source_, Source::kNone);
  }
  return *this;
}

void HostStaging::reset() noexcept {
  // cudaFreeHost waits for copies still reading or writing the memory; PinnedBuffer's reset
  // unregisters (which does too) and frees.
  if (source_ == Source::kCudaHostAlloc && data_ != nullptr) forget_error(cudaFreeHost(data_));
  pinned_ = aio::PinnedBuffer();
  data_ = nullptr;
  size_ = 0;
  source_ = Source::kNone;
}

const char* host_staging_source_name(HostStaging::Source source) {
  switch (source) {
    case HostStaging::Source::kNone: return "none";
    case HostStaging::Source::kRegisteredPinnedBuffer: return "registered pinned buffer";
    case HostStaging::Source::kCudaHostAlloc: return "cudaHostAlloc";
  }
  return "?";
}

}  // namespace zinf::gpu
