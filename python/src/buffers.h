// Memory that Python objects expose to zinf.aio: the buffer protocol, torch CPU tensors, and the
// pinned buffers zinf allocates.
#pragma once

#include <cstddef>
#include <memory>

#include <pybind11/pybind11.h>

#include "zinf/aio/pinned.h"

namespace zinf::python {
namespace py = pybind11;

// A contiguous byte range borrowed from a Python object for the duration of a request. For
// buffer-protocol objects the export (Py_buffer) is held, which keeps the object alive and
// stops a bytearray from being resized; for a torch tensor (duck-typed: data_ptr, numel,
// element_size, is_contiguous, device) a reference to the tensor is held. Move-only;
// releasing needs the GIL, so a HeldBuffer must be destroyed with the GIL held.
class HeldBuffer {
 public:
  HeldBuffer() = default;
  // Raises TypeError (no memory to borrow, or read-only memory for a read) or ValueError
  // (not contiguous, or a tensor not on the CPU). `verb` names the call in the message.
  static HeldBuffer acquire(py::handle obj, bool writable, const char* verb);
  ~HeldBuffer() { release(); }
  HeldBuffer(HeldBuffer&& other) noexcept;
  HeldBuffer& operator=(HeldBuffer&& other) noexcept;
  HeldBuffer(const HeldBuffer&) = delete;
  HeldBuffer& operator=(const HeldBuffer&) = delete;

  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  void release();

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  bool has_view_ = false;
  Py_buffer view_{};
  py::object owner_;  // torch tensors: the tensor itself
};

// zinf.aio.PinnedBuffer: page-locked (where RLIMIT_MEMLOCK allows), 4096-aligned, pre-faulted
// memory from aio::PinnedBuffer, exposed as a writable 1-D byte buffer.
struct PyPinnedBuffer {
  aio::PinnedBuffer buffer;
  std::size_t alignment = 4096;
};

void bind_buffers(py::module_& aio);

}  // namespace zinf::python
