// CopyEngine: checked cudaMemcpyAsync on the H2D and D2H streams, each copy ordered after an event
// and followed by one.
#include "gpu/copy_engine.h"

#include <cuda_runtime_api.h>

#include <utility>

#include <fmt/format.h>

#include "gpu/cuda_error.h"
#include "gpu/device.h"

namespace zinf::gpu {

Result<std::unique_ptr<CopyEngine>> CopyEngine::create(int device, CopyEngineOptions options) {
  // "no CUDA device: ..." or "device 3 does not exist" before anything is created.
  ZINF_RETURN_IF_ERROR(device_info(device).status());
  ZINF_ASSIGN_OR_RETURN(Stream h2d, Stream::create(device, fmt::format("GPU {} H2D copies", device)));
  ZINF_ASSIGN_OR_RETURN(Stream d2h, Stream::create(device, fmt::format("GPU {} D2H copies", device)));
  return std::unique_ptr<CopyEngine>(new CopyEngine(device, options, std::move(h2d), std::move(d2h)));
}

CopyEngine::CopyEngine(int device, CopyEngineOptions options, Stream h2d, Stream d2h)
    : device_(device), options_(options), h2d_(std::move(h2d)), d2h_(std::move(d2h)) {}

Result<Event> CopyEngine::copy_h2d(void* dst, const void* src, std::size_t bytes, const Event* after,
                                   std::string_view what) {
  return copy(Direction::kHostToDevice, dst, src, bytes, after, what);
}

Result<Event> CopyEngine::copy_d2h(void* dst, const void* src, std::size_t bytes, const Event* after,
                                   std::string_view what) {
  return copy(Direction::kDeviceToHost, dst, src, bytes, after, what);
}

Status CopyEngine::check_pointers(Direction dir, const void* host, const void* dev, std::size_t bytes,
                                  std::string_view label) const {
  if (host == nullptr || dev == nullptr) return Status::invalid_argument(fmt::format("{}: a null pointer", label));
  // Both ends of each range: a range that starts in registered memory may run past it.
  const auto* host_last = static_cast<const std::byte*>(host) + (bytes - 1);
  const auto* dev_last = static_cast<const std::byte*>(dev) + (bytes - 1);
  for (const void* p : {static_cast<const void*>(host), static_cast<const void*>(host_last)}) {
    ZINF_ASSIGN_OR_RETURN(const PointerInfo info, pointer_info(p));
    const bool host_kind = info.kind == PointerKind::kPinnedHost || info.kind == PointerKind::kPageableHost;
    if (!host_kind) {
      return Status::invalid_argument(fmt::format("{}: the host {} {} is {}", label,
                                                  dir == Direction::kHostToDevice ? "source" : "destination", p,
                                                  pointer_kind_name(info.kind)));
    }
    if (info.kind == PointerKind::kPageableHost && options_.require_pinned_host) {
      return Status::invalid_argument(fmt::format(
          "{}: the host memory at {} is pageable, not page-locked and registered with CUDA; use the pinned pool "
          "(pin_memory: true) or a PinnedBuffer, whose memory is registered (cudaHostRegister) when a GPU is present",
          label, p));
    }
  }
  for (const void* p : {dev, static_cast<const void*>(dev_last)}) {
    ZINF_ASSIGN_OR_RETURN(const PointerInfo info, pointer_info(p));
    const bool on_device = info.kind == PointerKind::kDevice || info.kind == PointerKind::kManaged;
    if (!on_device || info.device != device_) {
      return Status::invalid_argument(fmt::format("{}: {} is {} of device {}, not memory of GPU {}", label, p,
                                                  pointer_kind_name(info.kind), info.device, device_));
    }
  }
  return Status::ok();
}

Result<Event> CopyEngine::copy(Direction dir, void* dst, const void* src, std::size_t bytes, const Event* after,
                               std::string_view what) {
  const bool h2d = dir == Direction::kHostToDevice;
  const Stream& stream = h2d ? h2d_ : d2h_;
  const std::string label =
      h2d ? fmt::format("H2D copy '{}' of {} bytes (host {} -> GPU {} {})", what, bytes, src, device_, static_cast<void*>(dst))
          : fmt::format("D2H copy '{}' of {} bytes (GPU {} {} -> host {})", what, bytes, device_, src, static_cast<void*>(dst));
  if (bytes != 0) {
    ZINF_RETURN_IF_ERROR(check_pointers(dir, h2d ? src : dst, h2d ? dst : src, bytes, label));
  }
  ZINF_ASSIGN_OR_RETURN(Event done, Event::create(device_, label));
  if (after != nullptr) ZINF_RETURN_IF_ERROR(stream.wait(*after).with_context(label));
  if (bytes != 0) {
    ZINF_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, bytes, h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream.get()),
        fmt::format("{}: cudaMemcpyAsync on stream '{}'", label, stream.name()));
  }
  ZINF_RETURN_IF_ERROR(done.record(stream));
  (h2d ? h2d_copies_ : d2h_copies_).fetch_add(1, std::memory_order_relaxed);
  (h2d ? h2d_bytes_ : d2h_bytes_).fetch_add(bytes, std::memory_order_relaxed);
  return done;
}

Status CopyEngine::synchronize() const {
  ZINF_RETURN_IF_ERROR(h2d_.synchronize());
  return d2h_.synchronize();
}

CopyStats CopyEngine::stats() const {
  CopyStats s;
  s.h2d_copies = h2d_copies_.load(std::memory_order_relaxed);
  s.h2d_bytes = h2d_bytes_.load(std::memory_order_relaxed);
  s.d2h_copies = d2h_copies_.load(std::memory_order_relaxed);
  s.d2h_bytes = d2h_bytes_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace zinf::gpu
