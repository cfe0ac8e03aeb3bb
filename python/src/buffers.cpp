// Borrowing memory from Python objects; pinned and aligned buffers as Python objects.
#include "buffers.h"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "errors.h"

namespace zinf::python {
namespace {

std::string type_name(py::handle obj) { return Py_TYPE(obj.ptr())->tp_name; }

bool looks_like_torch_tensor(py::handle obj) {
  return py::hasattr(obj, "data_ptr") && py::hasattr(obj, "is_contiguous") && py::hasattr(obj, "numel") &&
         py::hasattr(obj, "element_size");
}

// Raises the clearest error for a buffer-protocol object that refused a contiguous export.
[[noreturn]] void explain_refused_export(py::handle obj, bool writable, const char* verb) {
  std::string why;
  if (PyErr_Occurred() != nullptr) {
    why = py::error_already_set().what();
  }
  Py_buffer probe{};
  if (PyObject_GetBuffer(obj.ptr(), &probe, PyBUF_FULL_RO) == 0) {
    const bool contiguous = PyBuffer_IsContiguous(&probe, 'A') != 0;
    const bool readonly = probe.readonly != 0;
    PyBuffer_Release(&probe);
    if (!contiguous) {
      throw py::value_error(fmt::format(
          "{}: the {} object is not contiguous; zinf.aio moves one contiguous byte range (make a contiguous "
          "copy first, e.g. numpy.ascontiguousarray or tensor.contiguous())",
          verb, type_name(obj)));
    }
    if (writable && readonly) {
      throw py::type_error(fmt::format("{}: the {} object is read-only; a read needs writable memory", verb, type_name(obj)));
    }
  } else {
    PyErr_Clear();
  }
  throw py::type_error(fmt::format("{}: cannot borrow the memory of the {} object: {}", verb, type_name(obj), why));
}

}  // namespace

HeldBuffer HeldBuffer::acquire(py::handle obj, bool writable, const char* verb) {
  HeldBuffer held;
  if (PyObject_CheckBuffer(obj.ptr()) != 0) {
    const int flags = PyBUF_ANY_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), &held.view_, flags) != 0) explain_refused_export(obj, writable, verb);
    held.has_view_ = true;
    held.data_ = static_cast<std::byte*>(held.view_.buf);
    held.size_ = static_cast<std::size_t>(held.view_.len);
    return held;
  }
  if (looks_like_torch_tensor(obj)) {
    if (py::hasattr(obj, "device")) {
      const std::string device = py::str(obj.attr("device").attr("type"));
      if (device != "cpu") {
        throw py::value_error(fmt::format(
            "{}: the tensor is on {}; zinf.aio reads and writes host memory (copy it to a CPU or pinned "
            "tensor first)",
            verb, std::string(py::str(obj.attr("device")))));
      }
    }
    if (!obj.attr("is_contiguous")().cast<bool>()) {
      throw py::value_error(fmt::format(
          "{}: the tensor is not contiguous; zinf.aio moves one contiguous byte range (use tensor.contiguous())",
          verb));
    }
    const auto numel = obj.attr("numel")().cast<std::int64_t>();
    const auto item = obj.attr("element_size")().cast<std::int64_t>();
    held.data_ = reinterpret_cast<std::byte*>(obj.attr("data_ptr")().cast<std::uintptr_t>());
    held.size_ = static_cast<std::size_t>(numel) * static_cast<std::size_t>(item);
    held.owner_ = py::reinterpret_borrow<py::object>(obj);
    return held;
  }
  throw py::type_error(fmt::format(
      "{}: expected an object exposing memory (bytearray, numpy array, memoryview, torch CPU tensor, "
      "zinf.aio.pinned buffer), got {}",
      verb, type_name(obj)));
}

HeldBuffer::HeldBuffer(HeldBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      has_view_(std::exchange(other.has_view_, false)),
      view_(other.view_),
      owner_(std::move(other.owner_)) {
  other.view_ = Py_buffer{};
}

HeldBuffer& HeldBuffer::operator=(HeldBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    has_view_ = std::exchange(other.has_view_, false);
    view_ = other.view_;
    other.view_ = Py_buffer{};
    owner_ = std::move(other.owner_);
  }
  return *this;
}

void HeldBuffer::release() {
  if (has_view_) {
    PyBuffer_Release(&view_);
    has_view_ = false;
  }
  owner_ = py::object();
  data_ = nullptr;
  size_ = 0;
}

namespace {

std::size_t checked_size(std::int64_t n, const char* what) {
  if (n < 0) throw py::value_error(fmt::format("{}: nbytes must be >= 0, got {}", what, n));
  return static_cast<std::size_t>(n);
}

}  // namespace

void bind_buffers(py::module_& aio) {
  py::class_<PyPinnedBuffer>(aio, "PinnedBuffer", py::buffer_protocol(), R"doc(
Page-locked, aligned host memory from zinf's allocator (``zinf.aio.pinned``).

Exposes a writable 1-D byte buffer: wrap it with ``numpy.frombuffer(buf, dtype)`` or
``torch.frombuffer(buf, dtype=...)`` (both keep the buffer alive), or pass it to any
``Handle`` verb. The memory is aligned to ``alignment`` bytes (4096 by default), pre-faulted,
and mlock'ed where RLIMIT_MEMLOCK allows (``locked`` says which). Freed when the last
reference (including numpy/torch views) goes away.)doc")
      .def_buffer([](PyPinnedBuffer& b) {
        return py::buffer_info(b.buffer.data(), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.buffer.size())}, {1}, false);
      })
      .def_property_readonly("nbytes", [](const PyPinnedBuffer& b) { return b.buffer.size(); })
      .def_property_readonly("locked", [](const PyPinnedBuffer& b) { return b.buffer.locked(); },
                             "Whether mlock succeeded (RLIMIT_MEMLOCK permitting).")
      .def_property_readonly("cuda_registered", [](const PyPinnedBuffer& b) { return b.buffer.cuda_registered(); },
                             "Whether the memory is registered with CUDA (cudaHostRegister: fast GPU copies); "
                             "only in a build with CUDA on a machine with a GPU.")
      .def_property_readonly("address", [](const PyPinnedBuffer& b) {
        return reinterpret_cast<std::uintptr_t>(b.buffer.data());
      })
      .def_property_readonly("alignment", [](const PyPinnedBuffer& b) { return b.alignment; })
      .def("__len__", [](const PyPinnedBuffer& b) { return b.buffer.size(); })
      .def("__repr__", [](const PyPinnedBuffer& b) {
        return fmt::format("zinf.aio.PinnedBuffer(nbytes={}, locked={})", b.buffer.size(),
                           b.buffer.locked() ? "True" : "False");
      });

  aio.def(
      "pinned",
      [](std::int64_t nbytes, std::int64_t alignment) {
        const std::size_t size = checked_size(nbytes, "zinf.aio.pinned");
        if (alignment < 8 || (alignment & (alignment - 1)) != 0) {
          throw py::value_error(fmt::format("zinf.aio.pinned: alignment must be a power of two >= 8, got {}", alignment));
        }
        auto buffer = aio::PinnedBuffer::allocate(size, static_cast<std::size_t>(alignment));
        if (!buffer.is_ok()) raise_status(buffer.status());
        auto out = std::make_unique<PyPinnedBuffer>();
        out->buffer = std::move(buffer).value();
        out->alignment = static_cast<std::size_t>(alignment);
        return out;
      },
      py::arg("nbytes"), py::arg("alignment") = 4096, R"doc(
Allocates ``nbytes`` of pinned host memory (a ``PinnedBuffer``), zero-filled.

Reads and writes of pinned, aligned memory take the engine's fast path: O_DIRECT straight
from/to the buffer, and io_uring fixed buffers when the buffer is registered with a handle
(``Handle.register_buffer``). See ``pinned_array`` / ``pinned_tensor`` for shaped views.)doc");

}

}  // namespace zinf::python
