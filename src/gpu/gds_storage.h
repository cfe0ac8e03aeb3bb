// Internal: GPUDirect Storage as the device layer's DirectStorage (device/direct_storage.h), on
// the cuFile classes of gds.h.
#pragma once

#include <memory>
#include <string>

#include "device/direct_storage.h"
#include "gpu/gds.h"
#include "zinf/status.h"

namespace zinf::gpu {

struct GdsStorageOptions {
  // The cuFile library to load (a soname or a path).
  std::string library = std::string(CuFileDriver::kDefaultLibrary);
  // The library takes host pointers as its "device" memory (the fake libcufile of the tests,
  // which then serves the host device); false for NVIDIA's.
  bool host_memory = false;
  // Open files with O_DIRECT, as cuFile's direct path needs (buffered, with a notice, where the
  // file system refuses it).
  bool direct = true;
};

// Loads the library and opens the cuFile driver. kUnsupported "GPUDirect Storage unavailable:
// ..." naming why when it cannot (no libcufile, no entry points, cuFileDriverOpen failing).
Result<std::shared_ptr<device::DirectStorage>> open_gds_storage(const GdsStorageOptions& options = {});

}  // namespace zinf::gpu
