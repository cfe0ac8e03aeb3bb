// Internal: an aligned, pre-faulted host allocation, page-locked (PinnedBuffer) or not.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>

#include "zinf/aio/pinned.h"
#include "zinf/status.h"

namespace zinf::swap::detail {

// Move-only. data() is aligned to 4 KiB and size() is rounded up to 4 KiB, so padded O_DIRECT
// transfers fit; from 2 MiB up it is aligned to a huge page and asks for huge pages, pinned or
// not (aio::io_buffer_alignment). With pin = true the pages are mlock'ed (see aio::PinnedBuffer;
// a refused lock leaves them pageable with a notice).
class HostBuffer {
 public:
  HostBuffer() = default;
  static Result<HostBuffer> allocate(std::size_t bytes, bool pin);
  // Address space for `bytes` (rounded up to 4 KiB) with no memory behind it yet: commit() makes
  // ranges of it resident. For arenas that grow on demand up to their budget.
  static Result<HostBuffer> reserve(std::size_t bytes);
  // Faults in bytes [offset, offset + length) of a reserved buffer (page-aligned), page-locking
  // them when `pin` (a refused lock leaves them pageable, with one notice). No-op on memory from
  // allocate(), which is resident already.
  // The range must lie inside the buffer (asserted).
  void commit(std::size_t offset, std::size_t length, bool pin);

  std::byte* data() const {
    return pinned_.data() != nullptr ? pinned_.bytes() : plain_ != nullptr ? plain_.get() : reserved_.get();
  }
  std::size_t size() const { return size_; }
  bool locked() const { return pinned_.locked(); }
  // Whether the pages are registered with CUDA (cudaHostRegister; pinned builds with a GPU present).
  bool cuda_registered() const { return pinned_.cuda_registered(); }

 private:
  struct FreeDeleter {
    void operator()(std::byte* p) const { std::free(p); }
  };
  struct UnmapDeleter {
    std::size_t bytes;  // no initialiser: it would make HostBuffer's defaulted constructor ill-formed
    void operator()(std::byte* p) const;
  };
  aio::PinnedBuffer pinned_;
  std::unique_ptr<std::byte, FreeDeleter> plain_;
  std::unique_ptr<std::byte, UnmapDeleter> reserved_;
  std::size_t size_ = 0;
};

}  // namespace zinf::swap::detail
