// Internal: which CUDA devices there are, what they are, and which one the calling thread uses.
#pragma once

#include <cstddef>
#include <string>

#include "zinf/status.h"

namespace zinf::gpu {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;             // "NVIDIA H100 80GB HBM3"
  std::string pci_bus_id;       // "0000:1b:00.0"
  int sm_count = 0;             // multiprocessors
  int cc_major = 0, cc_minor = 0;  // compute capability: 9.0 on H100/H200
  std::size_t total_memory = 0;    // bytes
  int async_engine_count = 0;      // copy engines: 2 or more lets H2D and D2H overlap each other
  bool unified_addressing = false;

  // "GPU 0: NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.6 GiB, 0000:1b:00.0)"
  std::string to_string() const;
};

struct MemoryInfo {
  std::size_t free = 0;   // bytes the device can still hand out (cudaMemGetInfo)
  std::size_t total = 0;
};

// The number of usable CUDA devices (> 0), or kUnsupported "no CUDA device: ..." naming CUDA's
// reason (no driver, driver too old, none present) when there is none.
Result<int> device_count();
// The properties of device `ordinal`: kUnsupported as device_count() when there is no device,
// kInvalidArgument when ordinal is not in [0, device_count()).
Result<DeviceInfo> device_info(int ordinal);
// Makes `ordinal` the calling thread's current device (cudaSetDevice) and returns its properties.
Result<DeviceInfo> select_device(int ordinal);
Result<MemoryInfo> memory_info(int ordinal);

// Makes `device` current on this thread for the guard's lifetime, then restores the device that was
// current before. Every call into the CUDA runtime that allocates or launches on a given device goes
// through one, because other threads of the engine may use other devices.
class DeviceGuard {
 public:
  static Result<DeviceGuard> enter(int device);
  ~DeviceGuard();
  DeviceGuard(DeviceGuard&& other) noexcept;
  DeviceGuard& operator=(DeviceGuard&&) = delete;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  DeviceGuard(int previous, bool restore) : previous_(previous), restore_(restore) {}
  int previous_ = 0;
  bool restore_ = false;
};

// Where a pointer points, as CUDA sees it (cudaPointerGetAttributes).
enum class PointerKind {
  kPageableHost,  // ordinary host memory, not registered: copies from it are staged and synchronous
  kPinnedHost,    // page-locked and registered (cudaHostRegister, cudaHostAlloc): DMA at full speed
  kDevice,        // device memory (cudaMalloc)
  kManaged,       // unified memory (cudaMallocManaged)
};

struct PointerInfo {
  PointerKind kind = PointerKind::kPageableHost;
  int device = -1;  // the device that owns it (kDevice, kManaged; kPinnedHost: the registering one)
};

Result<PointerInfo> pointer_info(const void* ptr);
const char* pointer_kind_name(PointerKind kind);

}  // namespace zinf::gpu
