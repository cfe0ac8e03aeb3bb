// Internal: an aligned, pre-faulted host allocation, page-locked (PinnedBuffer) or not.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>

#include "zinf/aio/pinned.h"
#include "zinf/status.h"

namespace zinf::swap::detail {

// Move-only. data() is aligned to 4 KiB and size() is rounded up to 4 KiB, so padded O_DIRECT
// transfers fit. With pin = true the pages are mlock'ed (see aio::PinnedBuffer; a refused lock
// leaves them pageable with a notice).
class HostBuffer {
 public:
  HostBuffer() = default;
  static Result<HostBuffer> allocate(std::size_t bytes, bool pin);

  std::byte* data() const { return pinned_.data() != nullptr ? pinned_.bytes() : plain_.get(); }
  std::size_t size() const { return size_; }
  bool locked() const { return pinned_.locked(); }
  // Whether the pages are registered with CUDA (cudaHostRegister; pinned builds with a GPU present).
  bool cuda_registered() const { return pinned_.cuda_registered(); }

 private:
  struct FreeDeleter {
    void operator()(std::byte* p) const { std::free(p); }
  };
  aio::PinnedBuffer pinned_;
  std::unique_ptr<std::byte, FreeDeleter> plain_;
  std::size_t size_ = 0;
};

}  // namespace zinf::swap::detail
