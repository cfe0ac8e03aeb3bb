// The device interface on a CUDA GPU.
#include "gpu/cuda_device.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <mutex>
#include <utility>
#include <vector>

#include "gpu/copy_engine.h"
#include "gpu/cuda_ops.h"
#include "gpu/cuda_error.h"
#include "gpu/device.h"
#include "gpu/device_allocator.h"
#include "gpu/stream.h"

namespace zinf::gpu {
namespace {

using device::StreamRole;

class CudaEventState final : public device::EventState {
 public:
  explicit CudaEventState(Event event) : event_(std::move(event)) {}
  const Event& event() const { return event_; }

 private:
  Event event_;
};

const CudaEventState* cuda_state(const device::Event& e) { return dynamic_cast<const CudaEventState*>(e.state()); }

// Members in destruction-safe order: the allocator (which waits for its fences) before the streams
// its fences are on. The streams and the allocator are the device's own (make_cuda_device) or
// someone else's that outlive it (make_cuda_device_view): then the owners are empty.
class CudaDevice final : public device::Device {
 public:
  struct Owned {
    std::unique_ptr<Stream> compute;
    std::unique_ptr<CopyEngine> copies;
    std::unique_ptr<CachingAllocator> alloc;
  };
  CudaDevice(int ordinal, DeviceInfo info, Stream& compute, CopyEngine& copies, CachingAllocator& alloc, Owned owned)
      : owned_(std::move(owned)), ordinal_(ordinal), info_(std::move(info)), compute_(&compute), copies_(&copies),
        alloc_(&alloc), ops_(make_cuda_ops(ordinal, [this](StreamRole role) { return stream(role); })) {}
  ~CudaDevice() override { (void)synchronize_all(); }

  std::string describe() const override { return info_.to_string(); }
  bool host_addressable() const override { return false; }

  device::StreamKey stream_key(StreamRole role) const override { return gpu::stream_key(stream(role)); }

  Result<DeviceBlock> allocate(std::size_t bytes, StreamRole role, std::string_view what) override {
    return alloc_->allocate(bytes, stream_key(role), what);
  }
  AllocatorStats allocator_stats() const override { return alloc_->stats(); }
  Result<std::uint64_t> memory_room() const override {
    const AllocatorStats s = alloc_->stats();
    if (alloc_->cap() != 0) return static_cast<std::uint64_t>(alloc_->cap() > s.in_use ? alloc_->cap() - s.in_use : 0);
    ZINF_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::enter(ordinal_));
    std::size_t free_bytes = 0, total = 0;
    ZINF_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total), fmt::format("the free memory of GPU {}", ordinal_));
    return static_cast<std::uint64_t>(free_bytes + s.cached);
  }

  Status copy_h2d(void* device_dst, const void* host_src, std::size_t bytes, std::string_view what) override {
    return timed(StreamRole::kH2D, what, [&] { return copies_->copy_h2d(device_dst, host_src, bytes, nullptr, what).status(); });
  }
  Status copy_d2h(void* host_dst, const void* device_src, std::size_t bytes, std::string_view what) override {
    return timed(StreamRole::kD2H, what, [&] { return copies_->copy_d2h(host_dst, device_src, bytes, nullptr, what).status(); });
  }

  // The copy streams' busy time: each copy between two timing events recorded on its stream after
  // the waits enqueued before it, so waits and idle time are not counted. Copies still in flight
  // are counted once they have completed.
  Result<double> copy_seconds(StreamRole role) const override {
    if (role == StreamRole::kCompute) return Device::copy_seconds(role);
    std::lock_guard lock(timing_mutex_);
    ZINF_RETURN_IF_ERROR(fold_completed(role));
    return copy_s_[static_cast<std::size_t>(role)];
  }

  Status enqueue(StreamRole role, device::Work work, std::string_view what) override {
    if (!work) return Status::invalid_argument(fmt::format("GPU {}: enqueue '{}' without work", ordinal_, what));
    ZINF_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::enter(ordinal_));
    ZINF_RETURN_IF_ERROR(work(device::StreamContext{stream(role), role}).with_context(
        fmt::format("GPU {}, {} stream, '{}'", ordinal_, device::stream_role_name(role), what)));
    return last_launch_status(fmt::format("'{}' on the {} stream of GPU {}", what, device::stream_role_name(role), ordinal_));
  }

  Status fill_zero(StreamRole role, void* device_ptr, std::size_t bytes, std::string_view what) override {
    if (bytes == 0) return Status::ok();
    ZINF_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::enter(ordinal_));
    ZINF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(device_ptr, 0, bytes, stream(role)),
                              fmt::format("zero '{}' ({} bytes) on the {} stream of GPU {}", what, bytes,
                                          device::stream_role_name(role), ordinal_));
    return Status::ok();
  }

  Result<device::Event> record(StreamRole role) override {
    ZINF_ASSIGN_OR_RETURN(Event e, Event::create(ordinal_, fmt::format("{} stream event", device::stream_role_name(role))));
    ZINF_RETURN_IF_ERROR(e.record(stream(role), device::stream_role_name(role)));
    return device::Event(std::make_shared<CudaEventState>(std::move(e)));
  }

  Status wait(StreamRole role, const device::Event& event) override {
    if (event.empty()) return Status::ok();
    const CudaEventState* s = cuda_state(event);
    if (s == nullptr) return Status::invalid_argument(fmt::format("GPU {}: wait on an event of another device", ordinal_));
    ZINF_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream(role), s->event().get(), 0),
                              fmt::format("the {} stream of GPU {} waiting on '{}'", device::stream_role_name(role),
                                          ordinal_, s->event().name()));
    return Status::ok();
  }

  Status synchronize(const device::Event& event) override {
    if (event.empty()) return Status::ok();
    const CudaEventState* s = cuda_state(event);
    if (s == nullptr) return Status::invalid_argument(fmt::format("GPU {}: synchronize on an event of another device", ordinal_));
    return s->event().synchronize();
  }

  Result<bool> query(const device::Event& event) override {
    if (event.empty()) return true;
    const CudaEventState* s = cuda_state(event);
    if (s == nullptr) return Status::invalid_argument(fmt::format("GPU {}: query of an event of another device", ordinal_));
    return s->event().query();
  }

  device::DeviceOps* ops() override { return ops_.get(); }

  Status synchronize_all() override {
    ZINF_RETURN_IF_ERROR(compute_->synchronize());
    return copies_->synchronize();
  }

 private:
  cudaStream_t stream(StreamRole role) const {
    switch (role) {
      case StreamRole::kH2D: return copies_->h2d_stream().get();
      case StreamRole::kD2H: return copies_->d2h_stream().get();
      case StreamRole::kCompute: break;
    }
    return compute_->get();
  }

  struct TimedCopy {
    Event start, end;
  };
  // Runs `copy` between two timing events on `role`'s stream.
  template <typename Copy>
  Status timed(StreamRole role, std::string_view what, Copy&& copy) {
    ZINF_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::enter(ordinal_));
    ZINF_ASSIGN_OR_RETURN(Event start, Event::create(ordinal_, fmt::format("timing of '{}'", what), /*timing=*/true));
    ZINF_RETURN_IF_ERROR(start.record(stream(role), device::stream_role_name(role)));
    ZINF_RETURN_IF_ERROR(copy());
    ZINF_ASSIGN_OR_RETURN(Event end, Event::create(ordinal_, "copy timing", /*timing=*/true));
    ZINF_RETURN_IF_ERROR(end.record(stream(role), device::stream_role_name(role)));
    std::lock_guard lock(timing_mutex_);
    auto& pending = pending_[static_cast<std::size_t>(role)];
    pending.push_back(TimedCopy{std::move(start), std::move(end)});
    // Without a reader the list would grow with every copy: fold what has completed now and then.
    if (pending.size() >= 256) ZINF_RETURN_IF_ERROR(fold_completed(role));
    return Status::ok();
  }
  // Adds the completed copies' times (in order: a copy stream completes its copies in order).
  Status fold_completed(StreamRole role) const {
    auto& pending = pending_[static_cast<std::size_t>(role)];
    std::size_t done = 0;
    for (; done < pending.size(); ++done) {
      ZINF_ASSIGN_OR_RETURN(const bool complete, pending[done].end.query());
      if (!complete) break;
      ZINF_ASSIGN_OR_RETURN(const float ms, pending[done].end.elapsed_ms_since(pending[done].start));
      copy_s_[static_cast<std::size_t>(role)] += ms / 1e3;
    }
    pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(done));
    return Status::ok();
  }

  Owned owned_;  // destroyed last: after the destructor has drained the streams
  int ordinal_;
  DeviceInfo info_;
  Stream* compute_;
  CopyEngine* copies_;
  CachingAllocator* alloc_;
  std::unique_ptr<device::DeviceOps> ops_;  // freed after the destructor has drained the streams
  mutable std::mutex timing_mutex_;
  mutable std::vector<TimedCopy> pending_[device::kStreamRoles];
  mutable double copy_s_[device::kStreamRoles] = {};
};

}  // namespace

Result<std::unique_ptr<device::Device>> make_cuda_device(CudaDeviceOptions options) {
  const int d = options.device;
  ZINF_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::enter(d));
  ZINF_ASSIGN_OR_RETURN(DeviceInfo info, device_info(d));
  CudaDevice::Owned owned;
  ZINF_ASSIGN_OR_RETURN(Stream compute, Stream::create(d, "device compute"));
  owned.compute = std::make_unique<Stream>(std::move(compute));
  CopyEngineOptions copy_options;
  copy_options.require_pinned_host = options.require_pinned_host;
  ZINF_ASSIGN_OR_RETURN(owned.copies, CopyEngine::create(d, copy_options));
  ZINF_ASSIGN_OR_RETURN(owned.alloc, make_device_allocator(d, options.memory_cap));
  Stream& c = *owned.compute;
  CopyEngine& e = *owned.copies;
  CachingAllocator& a = *owned.alloc;
  return std::unique_ptr<device::Device>(std::make_unique<CudaDevice>(d, std::move(info), c, e, a, std::move(owned)));
}

Result<std::unique_ptr<device::Device>> make_cuda_device_view(int ordinal, Stream& compute, CopyEngine& copies,
                                                              CachingAllocator& alloc) {
  ZINF_ASSIGN_OR_RETURN(DeviceInfo info, device_info(ordinal));
  return std::unique_ptr<device::Device>(
      std::make_unique<CudaDevice>(ordinal, std::move(info), compute, copies, alloc, CudaDevice::Owned{}));
}

}  // namespace zinf::gpu
