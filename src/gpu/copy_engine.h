// Internal: asynchronous host<->device copies on dedicated copy streams, ordered by events.
//
// Host memory comes from the existing pinned memory: swap::PinnedPool blocks (pin_memory: true)
// and aio::PinnedBuffer are page-locked and registered with CUDA (cudaHostRegister, in
// src/aio/pinned_cuda.cpp) when a GPU is present, so their copies run at DMA speed and truly
// overlap compute. Pageable memory is refused by default: CUDA would stage it through a driver
// buffer and block the calling thread, silently serializing the pipeline.
//
// H2D copies share one stream and D2H copies another, so a parameter upload and a gradient
// download run at the same time on GPUs with two copy engines (all data-centre GPUs). Copies on
// one stream run in the order they were enqueued.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "gpu/stream.h"
#include "zinf/status.h"

namespace zinf::gpu {

struct CopyEngineOptions {
  // Refuse host memory that is not page-locked and registered with CUDA (kInvalidArgument naming
  // the copy). false: accept it, at the cost described above.
  bool require_pinned_host = true;
};

struct CopyStats {
  std::uint64_t h2d_copies = 0, h2d_bytes = 0;
  std::uint64_t d2h_copies = 0, d2h_bytes = 0;
};

class CopyEngine {
 public:
  // Creates the two copy streams on GPU `device`.
  static Result<std::unique_ptr<CopyEngine>> create(int device, CopyEngineOptions options = {});
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Enqueues a copy of `bytes` from host `src` to device `dst` (memory of this engine's GPU) on the
  // H2D stream. It starts after `after` has completed (null: no wait beyond the stream's order),
  // e.g. the event of the kernel that last read dst. Returns an event recorded after the copy:
  // compute waits on it (Stream::wait) before reading dst, and `src` must stay unchanged until it
  // completes. `what` names the copy in errors ("layer 3 qkv weight"); errors also give the
  // sizes and both addresses. bytes == 0 enqueues nothing but still returns an event.
  Result<Event> copy_h2d(void* dst, const void* src, std::size_t bytes, const Event* after, std::string_view what);
  // The reverse, on the D2H stream: `src` on this engine's GPU, `dst` in host memory; `dst` may be
  // read once the returned event has completed.
  Result<Event> copy_d2h(void* dst, const void* src, std::size_t bytes, const Event* after, std::string_view what);

  const Stream& h2d_stream() const { return h2d_; }
  const Stream& d2h_stream() const { return d2h_; }
  int device() const { return device_; }
  // Waits for every copy enqueued so far.
  Status synchronize() const;
  CopyStats stats() const;

 private:
  enum class Direction { kHostToDevice, kDeviceToHost };
  CopyEngine(int device, CopyEngineOptions options, Stream h2d, Stream d2h);
  Result<Event> copy(Direction dir, void* dst, const void* src, std::size_t bytes, const Event* after,
                     std::string_view what);
  Status check_pointers(Direction dir, const void* host, const void* dev, std::size_t bytes,
                        std::string_view label) const;

  int device_;
  CopyEngineOptions options_;
  Stream h2d_;
  Stream d2h_;
  std::atomic<std::uint64_t> h2d_copies_{0}, h2d_bytes_{0}, d2h_copies_{0}, d2h_bytes_{0};
};

}  // namespace zinf::gpu
