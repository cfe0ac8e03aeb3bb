// Stream and Event owners.
#include "gpu/stream.h"

#include <utility>

#include <fmt/format.h>

#include "gpu/cuda_error.h"
#include "gpu/device.h"
#include "zinf/log.h"

namespace zinf::gpu {

Result<Stream> Stream::create(int device, std::string_view name, int priority) {
  ZINF_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::enter(device));
  Stream stream;
  ZINF_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&stream.stream_, cudaStreamNonBlocking, priority),
                            fmt::format("creating stream '{}' on device {} (priority {})", name, device, priority));
  stream.device_ = device;
  stream.name_ = name;
  return stream;
}

Stream::~Stream() { reset(); }

Stream::Stream(Stream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(other.device_), name_(std::move(other.name_)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    reset();
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = other.device_;
    name_ = std::move(other.name_);
  }
  return *this;
}

void Stream::reset() noexcept {
  if (stream_ == nullptr) return;
  // Wait first: blocks the stream's work uses may then be reused by a stream that gets the same handle.
  const cudaError_t sync = cudaStreamSynchronize(stream_);
  if (sync != cudaSuccess) {
    log(LogLevel::kWarning, cuda_status(sync, fmt::format("synchronizing stream '{}' before destroying it", name_))
                                .to_string());
    forget_error(sync);
  }
  forget_error(cudaStreamDestroy(stream_));
  stream_ = nullptr;
}

Status Stream::wait(const Event& event) const {
  ZINF_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, event.get(), 0),
                            fmt::format("stream '{}' waiting on event '{}'", name_, event.name()));
  return Status::ok();
}

Status Stream::synchronize() const {
  ZINF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), fmt::format("synchronizing stream '{}'", name_));
  return Status::ok();
}

Result<Event> Event::create(int device, std::string_view name, bool timing) {
  ZINF_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::enter(device));
  Event event;
  const unsigned flags = timing ? cudaEventDefault : cudaEventDisableTiming;
  ZINF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event.event_, flags),
                            fmt::format("creating event '{}' on device {}", name, device));
  event.device_ = device;
  event.name_ = name;
  return event;
}

Event::~Event() { reset(); }

Event::Event(Event&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)), device_(other.device_), name_(std::move(other.name_)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    reset();
    event_ = std::exchange(other.event_, nullptr);
    device_ = other.device_;
    name_ = std::move(other.name_);
  }
  return *this;
}

void Event::reset() noexcept {
  // Destroying an event whose work is still pending is allowed: CUDA releases it when the work completes.
  if (event_ != nullptr) forget_error(cudaEventDestroy(event_));
  event_ = nullptr;
}

Status Event::record(const Stream& stream) { return record(stream.get(), stream.name()); }

Status Event::record(cudaStream_t stream, std::string_view stream_name) {
  ZINF_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, stream),
                            fmt::format("recording event '{}' on stream '{}'", name_, stream_name));
  return Status::ok();
}

Result<bool> Event::query() const {
  const cudaError_t err = cudaEventQuery(event_);
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    forget_error(err);  // "not ready" is an answer, not a failure
    return false;
  }
  return cuda_status(err, fmt::format("querying event '{}'", name_));
}

Status Event::synchronize() const {
  ZINF_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_), fmt::format("waiting for event '{}'", name_));
  return Status::ok();
}

Result<float> Event::elapsed_ms_since(const Event& start) const {
  float ms = 0.0f;
  ZINF_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.event_, event_),
                            fmt::format("time from event '{}' to '{}'", start.name_, name_));
  return ms;
}

}  // namespace zinf::gpu
