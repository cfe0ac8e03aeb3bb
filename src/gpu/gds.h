// Internal: GPUDirect Storage, NVMe <-> GPU memory without a bounce through host memory, through
// NVIDIA's cuFile library loaded at run time. Builds need no cuFile header or library; a machine
// without libcufile (or without the nvidia-fs driver) gets kUnsupported naming why, and the caller
// keeps the bounce path (NVMe -> pinned host -> GPU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "gpu/cufile_abi.h"
#include "zinf/status.h"

namespace zinf::gpu {

// The loaded library with the cuFile driver open. Shared by the files and registrations that use
// it; the driver is closed and the library unloaded when the last owner goes.
class CuFileDriver {
 public:
  static constexpr std::string_view kDefaultLibrary = "libcufile.so.0";
  // dlopen's `library` (a soname searched the usual way, or a path), resolves the entry points
  // and calls cuFileDriverOpen. kUnsupported "GPUDirect Storage unavailable: ..." when the library
  // is missing, lacks an entry point, or the driver does not open.
  static Result<std::shared_ptr<CuFileDriver>> open(std::string_view library = kDefaultLibrary);
  ~CuFileDriver();
  CuFileDriver(const CuFileDriver&) = delete;
  CuFileDriver& operator=(const CuFileDriver&) = delete;

  const cufile::Api& api() const { return api_; }
  const std::string& library() const { return library_; }

 private:
  CuFileDriver() = default;
  void* dl_ = nullptr;
  cufile::Api api_{};
  std::string library_;
};

// "cuFile error 5008", with the CUDA driver's code when it has one.
std::string cufile_error_text(const cufile::Error& err);

struct GdsFileOptions {
  bool write = false;   // open for reading and writing (else read-only)
  bool create = false;  // create the file if absent (with write)
  // O_DIRECT, which cuFile's direct path needs. A file system that refuses it (tmpfs) gets a
  // buffered descriptor, which cuFile serves in its compatibility mode, with a notice.
  bool direct = true;
};

// A file registered with cuFile. Move-only; deregisters and closes on destruction. Reads and
// writes are synchronous (cuFileRead/cuFileWrite) and loop over short transfers. Not for
// concurrent use of one GdsFile from several threads.
class GdsFile {
 public:
  GdsFile() = default;
  static Result<GdsFile> open(std::shared_ptr<CuFileDriver> driver, const std::string& path,
                              GdsFileOptions options = {});
  ~GdsFile();
  GdsFile(GdsFile&& other) noexcept;
  GdsFile& operator=(GdsFile&& other) noexcept;
  GdsFile(const GdsFile&) = delete;
  GdsFile& operator=(const GdsFile&) = delete;

  // Reads `bytes` at `file_offset` into device memory at `dev` (a pointer into a device
  // allocation; it need not be registered). Reading past the end of the file is kOutOfRange;
  // other failures are kIoError naming the path, offset, length and errno or cuFile code.
  Status read(void* dev, std::size_t bytes, std::uint64_t file_offset);
  Status write(const void* dev, std::size_t bytes, std::uint64_t file_offset);

  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }

 private:
  void reset() noexcept;
  std::shared_ptr<CuFileDriver> driver_;
  cufile::Handle handle_ = nullptr;
  int fd_ = -1;
  bool direct_ = false;
  std::string path_;
};

// Registers device memory with cuFile for the registration's lifetime (cuFileBufRegister), so
// that repeated I/O to it skips per-call pinning of the GPU pages. Move-only.
class GdsBufferRegistration {
 public:
  GdsBufferRegistration() = default;
  static Result<GdsBufferRegistration> create(std::shared_ptr<CuFileDriver> driver, const void* dev,
                                              std::size_t bytes);
  ~GdsBufferRegistration();
  GdsBufferRegistration(GdsBufferRegistration&& other) noexcept;
  GdsBufferRegistration& operator=(GdsBufferRegistration&& other) noexcept;
  GdsBufferRegistration(const GdsBufferRegistration&) = delete;
  GdsBufferRegistration& operator=(const GdsBufferRegistration&) = delete;

 private:
  void reset() noexcept;
  std::shared_ptr<CuFileDriver> driver_;
  const void* dev_ = nullptr;
};

}  // namespace zinf::gpu
