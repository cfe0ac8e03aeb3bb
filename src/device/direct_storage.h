// Internal: direct transfers between files and device memory, without a bounce through host
// memory (GPUDirect Storage on a GPU). An optional companion of a Device (device.h).
//
// The GPU implementation is gpu/gds_storage.h (NVIDIA's cuFile, loaded at run time); a machine
// without it has none, and its callers move data through pinned host memory and the device's
// copy streams instead (zero3/param_device_reader.h chooses, and says why once).
//
// Ordering: a transfer is synchronous on the calling thread and is not ordered with any stream
// (cuFile's DMA is not). The caller makes sure no stream uses the device range while it runs
// (synchronize the events of earlier users first), and may use the range on any stream once
// read()/write() has returned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "zinf/status.h"

namespace zinf::device {

// One file opened and registered for direct transfers. Not for concurrent use from several
// threads.
class DirectFile {
 public:
  virtual ~DirectFile() = default;
  // Reads `bytes` at `file_offset` into device memory at `device_dst` (any alignment). Reading
  // past the end of the file is kOutOfRange; other failures are kIoError naming the path, offset,
  // length and cause.
  virtual Status read(void* device_dst, std::size_t bytes, std::uint64_t file_offset) = 0;
  virtual Status write(const void* device_src, std::size_t bytes, std::uint64_t file_offset) = 0;
  virtual const std::string& path() const = 0;
};

class DirectStorage {
 public:
  virtual ~DirectStorage() = default;
  // "GPUDirect Storage (libcufile.so.0)".
  virtual std::string describe() const = 0;
  // Whether the device pointers it takes are ordinary host memory (a test double of the library,
  // which then serves the host device); false for real GPU memory.
  virtual bool addresses_host_memory() const = 0;
  // Opens `path` (read-only unless `write`) and registers it. A file system or driver that
  // refuses the registration is an error naming the path and the library's code: the caller
  // then keeps its bounce path.
  virtual Result<std::unique_ptr<DirectFile>> open(const std::string& path, bool write) = 0;
};

}  // namespace zinf::device
