// Test double of libcufile (the entry points zinf's GDS layer resolves): "device" pointers are host
// memory and I/O is pread/pwrite, so the GDS layer's loading, registration, short-transfer and
// error handling are tested without a GPU or nvidia-fs. Like cuFile, it takes transfers of any
// alignment on an O_DIRECT descriptor (cuFile bounces those through its own buffers; the fake
// goes through a buffered descriptor of the same file). Steered by environment variables:
//   FAKE_CUFILE_MAX_TRANSFER  at most this many bytes per cuFileRead/cuFileWrite (short transfers)
//   FAKE_CUFILE_FAIL          "eio": the next transfers return -1 with errno EIO;
//                             a number N: they return -N (a cuFile error code)
//   FAKE_CUFILE_OPEN_FAIL     a number: cuFileDriverOpen fails with that cuFile code
//   FAKE_CUFILE_REGISTER_FAIL a number: cuFileHandleRegister fails with that cuFile code (the
//                             H100 VM refused its files with 5027)
//   FAKE_CUFILE_LOG           a file that gets one line per call that changes state
#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <string>

#include "gpu/cufile_abi.h"

namespace {

using zinf::gpu::cufile::Descr;
using zinf::gpu::cufile::Error;
using zinf::gpu::cufile::Handle;

struct FakeHandle {
  int fd;
  int buffered_fd;  // the same file without O_DIRECT, for unaligned transfers; -1 when fd is buffered
};

constexpr std::uintptr_t kDirectAlign = 4096;

// The descriptor a transfer goes through: the registered one when it is buffered or the transfer
// is aligned as O_DIRECT requires, else the buffered one.
int transfer_fd(const FakeHandle* h, const void* mem, std::size_t size, off_t file_offset) {
  const bool aligned = reinterpret_cast<std::uintptr_t>(mem) % kDirectAlign == 0 && size % kDirectAlign == 0 &&
                       static_cast<std::uintptr_t>(file_offset) % kDirectAlign == 0;
  return h->buffered_fd < 0 || aligned ? h->fd : h->buffered_fd;
}

void note(const char* what) {
  const char* path = std::getenv("FAKE_CUFILE_LOG");
  if (path == nullptr) return;
  if (std::FILE* f = std::fopen(path, "a")) {
    std::fprintf(f, "%s\n", what);
    std::fclose(f);
  }
}

std::size_t max_transfer(std::size_t want) {
  const char* cap = std::getenv("FAKE_CUFILE_MAX_TRANSFER");
  if (cap == nullptr) return want;
  const std::size_t n = std::strtoull(cap, nullptr, 10);
  return n != 0 && n < want ? n : want;
}

// 0: no failure; otherwise the transfer's return value (errno set for -1).
ssize_t injected_failure() {
  const char* fail = std::getenv("FAKE_CUFILE_FAIL");
  if (fail == nullptr || *fail == '\0') return 0;
  if (std::strcmp(fail, "eio") == 0) {
    errno = EIO;
    return -1;
  }
  return -static_cast<ssize_t>(std::strtol(fail, nullptr, 10));
}

}  // namespace

extern "C" {

Error cuFileDriverOpen() {
  const char* fail = std::getenv("FAKE_CUFILE_OPEN_FAIL");
  if (fail != nullptr) return Error{static_cast<int>(std::strtol(fail, nullptr, 10)), 0};
  note("driver_open");
  return Error{0, 0};
}

Error cuFileDriverClose_v2() {
  note("driver_close");
  return Error{0, 0};
}

Error cuFileHandleRegister(Handle* fh, Descr* descr) {
  if (fh == nullptr || descr == nullptr || descr->type != zinf::gpu::cufile::kHandleTypeOpaqueFd) {
    return Error{5022, 0};
  }
  if (const char* fail = std::getenv("FAKE_CUFILE_REGISTER_FAIL")) {
    return Error{static_cast<int>(std::strtol(fail, nullptr, 10)), 0};
  }
  const int fd = descr->handle.fd;
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0) return Error{5022, 0};
  int buffered = -1;
  if ((flags & O_DIRECT) != 0) {
    const std::string self = "/proc/self/fd/" + std::to_string(fd);
    buffered = open(self.c_str(), (flags & O_ACCMODE) | O_CLOEXEC);
    if (buffered < 0) return Error{5025, 0};
  }
  *fh = new FakeHandle{fd, buffered};
  note("handle_register");
  return Error{0, 0};
}

void cuFileHandleDeregister(Handle fh) {
  auto* h = static_cast<FakeHandle*>(fh);
  if (h->buffered_fd >= 0) close(h->buffered_fd);
  delete h;
  note("handle_deregister");
}

Error cuFileBufRegister(const void*, std::size_t, int) {
  note("buf_register");
  return Error{0, 0};
}

Error cuFileBufDeregister(const void*) {
  note("buf_deregister");
  return Error{0, 0};
}

ssize_t cuFileRead(Handle fh, void* dev_base, std::size_t size, off_t file_offset, off_t dev_offset) {
  if (const ssize_t f = injected_failure(); f != 0) return f;
  char* mem = static_cast<char*>(dev_base) + dev_offset;
  const std::size_t n = max_transfer(size);
  return pread(transfer_fd(static_cast<FakeHandle*>(fh), mem, n, file_offset), mem, n, file_offset);
}

ssize_t cuFileWrite(Handle fh, const void* dev_base, std::size_t size, off_t file_offset, off_t dev_offset) {
  if (const ssize_t f = injected_failure(); f != 0) return f;
  const char* mem = static_cast<const char*>(dev_base) + dev_offset;
  const std::size_t n = max_transfer(size);
  return pwrite(transfer_fd(static_cast<FakeHandle*>(fh), mem, n, file_offset), mem, n, file_offset);
}

}  // extern "C"
