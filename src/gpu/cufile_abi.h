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
