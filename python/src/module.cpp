// The extension module zinf._zinf: zinf.aio (Handle, pinned buffers) and the tensor-file I/O.
#include <pybind11/pybind11.h>

#include "buffers.h"
#include "handle.h"

namespace zinf::python {
void bind_tensor_file(py::module_& m);
}  // namespace zinf::python

PYBIND11_MODULE(_zinf, m) {
  namespace zp = zinf::python;
  m.doc() = "zinf's native core; import zinf or zinf.aio instead.";
  pybind11::module_ aio = m.def_submodule("aio", "zinf's asynchronous file I/O engine.");
  zp::bind_buffers(aio);
  zp::bind_handle(aio);
  zp::bind_tensor_file(m);
}
