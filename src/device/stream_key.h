// Internal: how the caching allocator and the device interface name streams and fences without
// CUDA types, so that their bookkeeping builds and is tested without a device.
#pragma once

#include <cstdint>

namespace zinf::device {

// A stream: a cudaStream_t as an integer (gpu/stream.h's stream_key(); 0 is the legacy default
// stream), or the host device's stream object.
using StreamKey = std::uintptr_t;
// A fence recorded on a stream: a backend's handle (the CUDA backend's cudaEvent_t).
using FenceKey = std::uintptr_t;

}  // namespace zinf::device
