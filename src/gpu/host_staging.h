// Internal: HostStaging, page-locked host memory for a GPU's copies, from aio's pinned buffers
// where CUDA registers them and from cudaHostAlloc where it refuses to.
#pragma once

#include <cstddef>
#include <string_view>

#include "zinf/aio/pinned.h"
#include "zinf/status.h"

namespace zinf::gpu {

// Move-only owner of `bytes` of page-locked host memory that CUDA copies at full speed.
// First choice: an aio::PinnedBuffer registered with cudaHostRegister (zinf's one pinned
// allocator). Some machines (sandboxes, containers with a low memlock limit) refuse
// cudaHostRegister; then the memory comes from cudaHostAlloc instead, with one notice naming
// `what`. Either way pointer_info() reports it as pinned host memory.
class HostStaging {
 public:
  enum class Source { kNone, kRegisteredPinnedBuffer, kCudaHostAlloc };

  HostStaging() = default;
  // Allocates on the current device's context. `force_host_alloc` takes the cudaHostAlloc path
  // as if the registration had been refused (tests). Fails only when both ways fail, naming both.
  static Result<HostStaging> allocate(std::size_t bytes, std::string_view what, bool force_host_alloc = false);
  ~HostStaging();
  HostStaging(HostStaging&& other) noexcept;
  HostStaging& operator=(HostStaging&& other) noexcept;
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  void* data() const { return data_; }
  std::byte* bytes() const { return static_cast<std::byte*>(data_); }
  std::size_t size() const { return size_; }
  Source source() const { return source_; }

 private:
  void reset() noexcept;
  aio::PinnedBuffer pinned_;  // kRegisteredPinnedBuffer
  void* data_ = nullptr;      // either pinned_.data() or the cudaHostAlloc pointer
  std::size_t size_ = 0;
  Source source_ = Source::kNone;
};

const char* host_staging_source_name(HostStaging::Source source);

}  // namespace zinf::gpu
