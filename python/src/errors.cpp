// Status -> Python exception (see errors.h).
#include "errors.h"

#include <string_view>

namespace zinf::python {
namespace py = pybind11;

void raise_status(const Status& status, const std::string& path, std::uint64_t offset) {
  switch (status.code()) {
    case ErrorCode::kInvalidArgument:
      throw py::value_error(status.message());
    case ErrorCode::kResourceExhausted:
      PyErr_SetString(PyExc_MemoryError, status.message().c_str());
      throw py::error_already_set();
    case ErrorCode::kInternal:
      throw std::runtime_error(status.message());
    default:
      break;
  }
  // The class is defined in Python (zinf/_errors.py) so that it prints its message alone.
  py::object cls = py::module_::import("zinf._errors").attr("AioError");
  py::object err_no = status.sys_errno() != 0 ? py::object(py::int_(status.sys_errno())) : py::object(py::none());
  py::object file = path.empty() ? py::object(py::none()) : py::object(py::str(path));
  py::object off = path.empty() ? py::object(py::none()) : py::object(py::int_(offset));
  py::object exc = cls(err_no, status.message(), file, off, std::string(error_code_name(status.code())));
  PyErr_SetObject(cls.ptr(), exc.ptr());
  throw py::error_already_set();
}

void raise_status(const Status& status) { raise_status(status, std::string(), 0); }

}  // namespace zinf::python
