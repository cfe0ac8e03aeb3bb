// Turns a zinf Status into the Python exception a caller of zinf.aio expects.
#pragma once

#include <cstdint>
#include <string>

#include <pybind11/pybind11.h>

#include "zinf/status.h"

namespace zinf::python {

// Raises (as a C++ exception pybind11 passes on) the Python form of a failed `status`:
//  - InvalidArgument -> ValueError;
//  - ResourceExhausted (no memory for a buffer) -> MemoryError;
//  - Internal -> RuntimeError;
//  - everything else (I/O errors, a read past the end, a missing file, a request aborted by
//    its timeout) -> zinf.aio.AioError, an OSError with .errno (None when there is none),
//    .filename = `path`, .offset = `offset` (the request's file offset), .code (the zinf
//    error name, e.g. "IoError", "OutOfRange") and the full message (which names the failing
//    chunk's offset and length) as str(). Needs the GIL.
[[noreturn]] void raise_status(const Status& status, const std::string& path, std::uint64_t offset);

// raise_status for errors that have no file (allocation, arguments).
[[noreturn]] void raise_status(const Status& status);

}  // namespace zinf::python
