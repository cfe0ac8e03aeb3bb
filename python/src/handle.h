// zinf.aio.Handle: a Python owner of one aio::Handle and of the buffers its requests borrow.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "buffers.h"
#include "zinf/aio/handle.h"

namespace zinf::python {
namespace py = pybind11;

// Every member function is called with the GIL held and releases it around I/O. The request
// list and the registered buffers are guarded by the GIL; the engine handle is shared by
// pointer so that close() from one thread cannot free it under another thread's wait().
class PyHandle {
 public:
  explicit PyHandle(const aio::AioConfig& config);  // raises ValueError for a bad knob
  ~PyHandle();
  PyHandle(const PyHandle&) = delete;
  PyHandle& operator=(const PyHandle&) = delete;

  // Blocking request: returns 1 (the completed request), raises on failure.
  int sync_io(bool is_write, py::handle buffer, py::handle file, std::int64_t file_offset,
              std::optional<std::int64_t> nbytes, bool validate, aio::WriteOptions options);
  // Queued request: returns 0; the buffer is borrowed until wait() returns.
  int async_io(bool is_write, py::handle buffer, py::handle file, std::int64_t file_offset,
               std::optional<std::int64_t> nbytes, bool validate, aio::WriteOptions options);
  // Waits for every queued request; returns how many; raises the first failure (in order of
  // submission) after all have finished.
  int wait();
  void register_buffer(py::handle buffer);
  void unregister_buffers();
  // Waits for what is queued (errors dropped), stops the workers. Later calls raise ValueError.
  void close();
  bool closed() const;

  std::size_t pending() const;
  aio::AioConfig config() const;
  std::string backend() const;
  py::dict stats() const;

 private:
  struct Pending;
  std::shared_ptr<aio::Handle> handle(const char* verb) const;

  std::shared_ptr<aio::Handle> handle_;
  pid_t owner_pid_;  // fork() leaves the workers behind: other processes may not use the handle
  std::vector<Pending> pending_;
  std::vector<HeldBuffer> registered_;
};

void bind_handle(py::module_& aio);

}  // namespace zinf::python
