// Internal: the device interface the engine moves data through: device memory, asynchronous
// host<->device copies on copy streams, work on a compute stream, and events between them.
//
// Two implementations: the CUDA one (gpu/cuda_device.h) and the host device (host_device.h),
// whose streams are threads, so the whole orchestration (who waits for what, when a block or a
// staging buffer may be reused) runs and is tested on every machine, and only kernels need a GPU.
// The contract is CUDA's stream semantics:
//  - Work enqueued on one stream runs in enqueue order; streams run concurrently with each other
//    and with the host.
//  - An event recorded on a stream completes when everything enqueued on that stream before it
//    has. wait(role, event) orders later work on `role` after the event; nothing else orders
//    work across streams.
//  - Device memory comes from the device's caching allocator (caching_allocator.h): a block is for
//    one stream; use on another stream is declared with DeviceBlock::record_use(stream_key(role))
//    before the block is returned, or it may be handed out again while that stream still uses it.
//  - Host memory given to a copy must stay valid and unchanged (H2D) or unread (D2H) until an
//    event recorded after the copy has completed.
//  - A failed item makes its stream fail: later operations on that device report the first failure,
//    naming the item, as CUDA reports a sticky error.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "device/caching_allocator.h"
#include "device/stream_key.h"
#include "zinf/status.h"

namespace zinf::device {

// The streams a device has: one for compute, one per copy direction (so that an upload of the
// next module and a download of the last module's gradients run at once).
enum class StreamRole { kCompute = 0, kH2D = 1, kD2H = 2 };
class DeviceOps;  // ops.h
inline constexpr int kStreamRoles = 3;
const char* stream_role_name(StreamRole role);

// An implementation's event; Event holds one (shared: copies of an Event are the same event).
class EventState {
 public:
  virtual ~EventState() = default;
};

// A point on one stream. Cheap to copy. A default-constructed Event is complete.
class Event {
 public:
  Event() = default;
  explicit Event(std::shared_ptr<EventState> state) : state_(std::move(state)) {}
  bool empty() const { return state_ == nullptr; }
  EventState* state() const { return state_.get(); }

 private:
  std::shared_ptr<EventState> state_;
};

// What a work item gets when it runs: the native stream its kernels go on (a cudaStream_t on a
// GPU; null on the host device, where the item itself is the work).
struct StreamContext {
  void* native_stream = nullptr;
  StreamRole role = StreamRole::kCompute;
};

// One item of work on a stream. On the host device it runs on the stream's thread, in order; on a
// GPU it runs at enqueue time on the calling thread and must only enqueue (launch kernels on
// ctx.native_stream). An error fails the stream (see above).
using Work = std::function<Status(const StreamContext& ctx)>;

class Device {
 public:
  virtual ~Device() = default;
  Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // "GPU 0: NVIDIA H100 ..." or "host device (seed 7, delays up to 200 us)".
  virtual std::string describe() const = 0;
  // Whether device memory is ordinary host memory (the host device): CPU code may then read and
  // write a block inside a work item.
  virtual bool host_addressable() const = 0;

  // The key DeviceBlock::record_use takes for work on `role`.
  virtual StreamKey stream_key(StreamRole role) const = 0;
  // A block of at least `bytes` of device memory for work on `role` (caching_allocator.h).
  // kResourceExhausted naming `what` and the cap when it cannot be had.
  virtual Result<DeviceBlock> allocate(std::size_t bytes, StreamRole role, std::string_view what) = 0;
  virtual AllocatorStats allocator_stats() const = 0;
  // Bytes that allocate() could still hand out now: under a cap, the cap less the blocks in
  // use; else what the device has free plus the allocator's cached blocks. UINT64_MAX: no limit
  // (a host device without a cap). What a caller sizes optional device memory with.
  virtual Result<std::uint64_t> memory_room() const = 0;

  // Enqueues a copy of `bytes` on the H2D (device <- host) or D2H (host <- device) stream. The host
  // side should be page-locked (pinned) memory; `what` names the copy in errors.
  virtual Status copy_h2d(void* device_dst, const void* host_src, std::size_t bytes, std::string_view what) = 0;
  virtual Status copy_d2h(void* host_dst, const void* device_src, std::size_t bytes, std::string_view what) = 0;
  // Seconds `role` (a copy stream) has spent copying so far: what its GB/s divide by. Waits, idle
  // time and injected delays are not counted. kUnsupported where the device does not measure it.
  virtual Result<double> copy_seconds(StreamRole role) const {
    return Status::unsupported(fmt::format("{}: {} copy times are not measured", describe(), stream_role_name(role)));
  }
  // Enqueues `work` on `role`.
  virtual Status enqueue(StreamRole role, Work work, std::string_view what) = 0;
  // Enqueues setting `bytes` of device memory at `device_ptr` to zero on `role` (cudaMemsetAsync
  // on a GPU): what a consumer on the compute stream zeroes its gradient buffers with.
  virtual Status fill_zero(StreamRole role, void* device_ptr, std::size_t bytes, std::string_view what) = 0;

  // An event after everything enqueued on `role` so far.
  virtual Result<Event> record(StreamRole role) = 0;
  // Work enqueued on `role` after this call runs after `event` has completed.
  virtual Status wait(StreamRole role, const Event& event) = 0;
  // Blocks the calling thread until `event` has completed.
  virtual Status synchronize(const Event& event) = 0;
  // Whether `event` has completed, without blocking.
  virtual Result<bool> query(const Event& event) = 0;
  // Blocks until every stream has finished what was enqueued on it.
  virtual Status synchronize_all() = 0;

  // The arithmetic this device runs on its memory for a device-resident training state (ops.h),
  // or nullptr when it has none. Owned by the device.
  virtual DeviceOps* ops() { return nullptr; }
};

}  // namespace zinf::device
