// Device discovery and selection, the current-device guard, pointer queries.
#include "gpu/device.h"

#include <cuda_runtime_api.h>

#include <utility>

#include <fmt/format.h>

#include "gpu/cuda_error.h"

namespace zinf::gpu {

std::string DeviceInfo::to_string() const {
  return fmt::format("GPU {}: {} (sm_{}{}, {} SMs, {:.1f} GiB, {})", ordinal, name, cc_major, cc_minor, sm_count,
                     static_cast<double>(total_memory) / static_cast<double>(std::size_t{1} << 30), pci_bus_id);
}

Result<int> device_count() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    forget_error(err);  // else a later launch check would report it
    return Status::unsupported(
        fmt::format("no CUDA device: cudaGetDeviceCount: {}: {}", cudaGetErrorName(err), cudaGetErrorString(err)));
  }
  if (count <= 0) return Status::unsupported("no CUDA device: cudaGetDeviceCount found 0 devices");
  return count;
}

namespace {

Status check_ordinal(int ordinal) {
  ZINF_ASSIGN_OR_RETURN(const int count, device_count());
  if (ordinal < 0 || ordinal >= count) {
    return Status::invalid_argument(
        fmt::format("CUDA device {} does not exist: this machine has {} (ordinals 0 to {})", ordinal, count, count - 1));
  }
  return Status::ok();
}

}  // namespace

Result<DeviceInfo> device_info(int ordinal) {
  if (ordinal < 0) return Status::invalid_argument(fmt::format("CUDA device ordinal {} is negative", ordinal));
  ZINF_RETURN_IF_ERROR(check_ordinal(ordinal));
  cudaDeviceProp prop{};
  ZINF_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal),
                            fmt::format("cudaGetDeviceProperties of device {}", ordinal));
  DeviceInfo info;
  info.ordinal = ordinal;
  // prop.name is NUL-terminated within its 256 bytes; bound the read anyway.
  std::size_t len = 0;
  while (len < sizeof(prop.name) && prop.name[len] != '\0') ++len;
  info.name.assign(prop.name, len);
  info.sm_count = prop.multiProcessorCount;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.total_memory = prop.totalGlobalMem;
  info.async_engine_count = prop.asyncEngineCount;
  info.unified_addressing = prop.unifiedAddressing != 0;
  char bus[32] = {};
  ZINF_CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(bus, static_cast<int>(sizeof(bus)), ordinal),
                            fmt::format("cudaDeviceGetPCIBusId of device {}", ordinal));
  bus[sizeof(bus) - 1] = '\0';
  info.pci_bus_id = bus;
  return info;
}

Result<DeviceInfo> select_device(int ordinal) {
  ZINF_ASSIGN_OR_RETURN(DeviceInfo info, device_info(ordinal));
  ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal), fmt::format("cudaSetDevice({})", ordinal));
  return info;
}

Result<MemoryInfo> memory_info(int ordinal) {
  ZINF_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::enter(ordinal));
  MemoryInfo mem;
  ZINF_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&mem.free, &mem.total), fmt::format("cudaMemGetInfo on device {}", ordinal));
  return mem;
}

Result<DeviceGuard> DeviceGuard::enter(int device) {
  int previous = 0;
  ZINF_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous), "cudaGetDevice");
  if (previous == device) return DeviceGuard(previous, false);
  ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), fmt::format("cudaSetDevice({}) (was {})", device, previous));
  return DeviceGuard(previous, true);
}

DeviceGuard::DeviceGuard(DeviceGuard&& other) noexcept
    : previous_(other.previous_), restore_(std::exchange(other.restore_, false)) {}

DeviceGuard::~DeviceGuard() {
  // Restoring a device that was valid a moment ago cannot fail short of a lost context; there is
  // nobody to report to in a destructor.
  if (restore_) forget_error(cudaSetDevice(previous_));
}

Result<PointerInfo> pointer_info(const void* ptr) {
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    forget_error(err);
    return cuda_status(err, fmt::format("cudaPointerGetAttributes({})", ptr));
  }
  PointerInfo info;
  info.device = attr.device;
  switch (attr.type) {
    case cudaMemoryTypeUnregistered:
      info.kind = PointerKind::kPageableHost;
      info.device = -1;
      break;
    case cudaMemoryTypeHost:
      info.kind = PointerKind::kPinnedHost;
      break;
    case cudaMemoryTypeDevice:
      info.kind = PointerKind::kDevice;
      break;
    case cudaMemoryTypeManaged:
      info.kind = PointerKind::kManaged;
      break;
    default:
      return Status::internal(fmt::format("cudaPointerGetAttributes({}): unknown memory type {}", ptr,
                                          static_cast<int>(attr.type)));
  }
  return info;
}

const char* pointer_kind_name(PointerKind kind) {
  switch (kind) {
    case PointerKind::kPageableHost: return "pageable host memory";
    case PointerKind::kPinnedHost: return "pinned host memory";
    case PointerKind::kDevice: return "device memory";
    case PointerKind::kManaged: return "managed memory";
  }
  return "unknown memory";
}

}  // namespace zinf::gpu
