// Internal: the few declarations of NVIDIA's cuFile API (GPUDirect Storage, cufile.h) that zinf
// uses, written here because libcufile is loaded at run time (dlopen) and its header is not
// needed to build. Layouts follow cufile.h; names live in zinf::gpu::cufile so that they never
// clash with the real header.
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace zinf::gpu::cufile {

// CUfileOpError: 0 is success; failures are 5000 and above (e.g. 5001 driver not initialized).
using OpError = int;
inline constexpr OpError kSuccess = 0;

// The name and text of a CUfileOpError, as cufile.h gives them (CUFILEOP_BASE_ERR is 5000);
// "unknown cuFile error" for a code it does not list.
inline const char* op_error_name(OpError err) {
  switch (err) {
    case 0: return "CU_FILE_SUCCESS";
    case 5001: return "CU_FILE_DRIVER_NOT_INITIALIZED (nvidia-fs driver is not loaded; allow_compat_mode in cufile.json enables compatible mode)";
    case 5002: return "CU_FILE_DRIVER_INVALID_PROPS (invalid property)";
    case 5004: return "CU_FILE_DRIVER_VERSION_MISMATCH (nvidia-fs driver version mismatch)";
    case 5007: return "CU_FILE_PLATFORM_NOT_SUPPORTED (GPUDirect Storage not supported on this platform)";
    case 5008: return "CU_FILE_IO_NOT_SUPPORTED (GPUDirect Storage not supported on this file)";
    case 5009: return "CU_FILE_DEVICE_NOT_SUPPORTED (GPUDirect Storage not supported on this GPU)";
    case 5010: return "CU_FILE_NVFS_DRIVER_ERROR (nvidia-fs driver ioctl error)";
    case 5011: return "CU_FILE_CUDA_DRIVER_ERROR (CUDA driver API error)";
    case 5012: return "CU_FILE_CUDA_POINTER_INVALID (invalid device pointer)";
    case 5013: return "CU_FILE_CUDA_MEMORY_TYPE_INVALID (invalid pointer memory type)";
    case 5014: return "CU_FILE_CUDA_POINTER_RANGE_ERROR (pointer range exceeds allocated address range)";
    case 5015: return "CU_FILE_CUDA_CONTEXT_MISMATCH (cuda context mismatch)";
    case 5018: return "CU_FILE_INVALID_FILE_TYPE (unsupported file type)";
    case 5019: return "CU_FILE_INVALID_FILE_OPEN_FLAG (unsupported file open flags)";
    case 5020: return "CU_FILE_DIO_NOT_SET (fd direct IO not set)";
    case 5022: return "CU_FILE_INVALID_VALUE (invalid arguments)";
    case 5023: return "CU_FILE_MEMORY_ALREADY_REGISTERED (device pointer already registered)";
    case 5024: return "CU_FILE_MEMORY_NOT_REGISTERED (device pointer lookup failure)";
    case 5025: return "CU_FILE_PERMISSION_DENIED (driver or file access error)";
    case 5026: return "CU_FILE_DRIVER_ALREADY_OPEN (driver is already open)";
    case 5027: return "CU_FILE_HANDLE_NOT_REGISTERED (file descriptor is not registered)";
    case 5028: return "CU_FILE_HANDLE_ALREADY_REGISTERED (file descriptor is already registered)";
    case 5029: return "CU_FILE_DEVICE_NOT_FOUND (GPU device not found)";
    case 5030: return "CU_FILE_INTERNAL_ERROR (internal error)";
    case 5033: return "CU_FILE_NVFS_SETUP_ERROR (NVFS driver initialization error)";
    case 5034: return "CU_FILE_IO_DISABLED (GPUDirect Storage disabled by config on this file)";
    case 5044: return "CU_FILE_IO_ERROR (cufile io error)";
    case 5049: return "CU_FILE_BATCH_NOCOMPAT_ERROR (compat mode off)";
    default: return "unknown cuFile error";
  }
}

// CUfileError_t: cuFile's code and the CUDA driver's (a CUresult).
struct Error {
  OpError err;
  int cu_err;
};

// CUfileFileHandleType
inline constexpr int kHandleTypeOpaqueFd = 1;

// CUfileDescr_t
struct Descr {
  int type;
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;  // const CUfileFSOps_t*: null for a plain file descriptor
};

using Handle = void*;  // CUfileHandle_t

// The entry points, as resolved with dlsym. cuFileRead/cuFileWrite return the bytes moved, -1
// with errno set for a file-system error, or -(CUfileOpError) for a cuFile error.
struct Api {
  Error (*driver_open)();
  Error (*driver_close)();
  Error (*handle_register)(Handle* fh, Descr* descr);
  void (*handle_deregister)(Handle fh);
  Error (*buf_register)(const void* dev_base, std::size_t length, int flags);
  Error (*buf_deregister)(const void* dev_base);
  ssize_t (*read)(Handle fh, void* dev_base, std::size_t size, off_t file_offset, off_t dev_offset);
  ssize_t (*write)(Handle fh, const void* dev_base, std::size_t size, off_t file_offset, off_t dev_offset);
};

}  // namespace zinf::gpu::cufile
