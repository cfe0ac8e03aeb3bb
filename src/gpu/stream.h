// Internal: move-only owners of CUDA streams and events; their errors name the stream or event.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

#include "device/stream_key.h"
#include "zinf/status.h"

namespace zinf::gpu {

// The device layer's names for streams and fences (src/device: the layer below this one).
using device::FenceKey;
using device::StreamKey;

inline StreamKey stream_key(cudaStream_t stream) { return reinterpret_cast<StreamKey>(stream); }

class Event;

// A non-blocking stream (it does not synchronize with the legacy default stream) on one device.
// Destroying a Stream first waits for the work enqueued on it, so that memory its work uses may be
// freed or reused, by any later stream, once the owner is gone.
class Stream {
 public:
  Stream() = default;
  // `name` is used in error messages ("h2d copies"). priority: as cudaStreamCreateWithPriority
  // (lower is more urgent; 0 is the default).
  static Result<Stream> create(int device, std::string_view name, int priority = 0);
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return stream_; }
  StreamKey key() const { return stream_key(stream_); }
  int device() const { return device_; }
  const std::string& name() const { return name_; }
  explicit operator bool() const { return stream_ != nullptr; }

  // Work enqueued on this stream after the call waits until `event` has completed. An event that was
  // never recorded is complete (CUDA's rule), so waiting on it orders nothing.
  Status wait(const Event& event) const;
  // Blocks the calling thread until all work enqueued so far has finished.
  Status synchronize() const;

 private:
  void reset() noexcept;
  cudaStream_t stream_ = nullptr;
  int device_ = -1;
  std::string name_;
};

// An event without timing (cheapest to record and wait on), or with timing for measurements.
class Event {
 public:
  Event() = default;
  static Result<Event> create(int device, std::string_view name, bool timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const { return event_; }
  int device() const { return device_; }
  const std::string& name() const { return name_; }
  explicit operator bool() const { return event_ != nullptr; }

  // Captures the work enqueued on `stream` so far; the event completes when that work has.
  Status record(const Stream& stream);
  Status record(cudaStream_t stream, std::string_view stream_name);
  // true once the captured work has completed (or when never recorded); an error if it failed.
  Result<bool> query() const;
  Status synchronize() const;
  // Milliseconds from `start` to this event; both must be timing events, recorded and complete.
  Result<float> elapsed_ms_since(const Event& start) const;

 private:
  void reset() noexcept;
  cudaEvent_t event_ = nullptr;
  int device_ = -1;
  std::string name_;
};

}  // namespace zinf::gpu
