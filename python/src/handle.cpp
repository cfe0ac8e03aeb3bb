// zinf.aio.Handle: the engine's Handle with DeepNVMe's knobs and verbs, GIL released during I/O.
#include "handle.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <pybind11/stl.h>

#include "buffers.h"
#include "common/file_io.h"
#include "errors.h"
#include "zinf/aio/handle.h"

namespace zinf::python {
namespace {

// Where a request goes: a path the engine opens and closes, or a caller's open descriptor.
struct Target {
  bool is_fd = false;
  int fd = -1;
  std::string path;
  std::string name() const { return is_fd ? fmt::format("fd:{}", fd) : path; }
};

Target parse_target(py::handle file, const char* verb) {
  Target t;
  if (PyLong_Check(file.ptr()) != 0 && PyBool_Check(file.ptr()) == 0) {
    t.is_fd = true;
    t.fd = file.cast<int>();
    if (t.fd < 0) throw py::value_error(fmt::format("{}: file descriptor {} is negative", verb, t.fd));
    return t;
  }
  py::module_ os = py::module_::import("os");
  py::object path = os.attr("fsdecode")(os.attr("fspath")(file));  // str, bytes or os.PathLike
  t.path = path.cast<std::string>();
  if (t.path.empty()) throw py::value_error(fmt::format("{}: empty path", verb));
  return t;
}

std::uint64_t checked_offset(std::int64_t offset, const char* verb) {
  if (offset < 0) throw py::value_error(fmt::format("{}: file_offset must be >= 0, got {}", verb, offset));
  return static_cast<std::uint64_t>(offset);
}

std::size_t resolve_nbytes(const HeldBuffer& held, std::optional<std::int64_t> nbytes, const char* verb) {
  if (!nbytes) return held.size();
  if (*nbytes < 0) throw py::value_error(fmt::format("{}: nbytes must be >= 0, got {}", verb, *nbytes));
  if (static_cast<std::uint64_t>(*nbytes) > held.size()) {
    throw py::value_error(fmt::format("{}: buffer too small: nbytes = {} but the buffer holds {} bytes", verb,
                                      *nbytes, held.size()));
  }
  return static_cast<std::size_t>(*nbytes);
}

// validate=True: the bytes now in the file equal the buffer (read back buffered, compared).
Status validate_range(const Target& t, const std::byte* data, std::size_t nbytes, std::uint64_t offset) {
  std::vector<std::byte> back(nbytes);
  Status st = t.is_fd ? fileio::pread_exact(t.fd, t.name(), back.data(), nbytes, offset)
                      : fileio::pread_exact(t.path, back.data(), nbytes, offset);
  if (!st.is_ok()) return st;
  if (nbytes > 0 && std::memcmp(back.data(), data, nbytes) != 0) {
    return Status::corruption(fmt::format("validate {} offset {} length {}: the file's bytes differ from the buffer",
                                          t.name(), offset, nbytes));
  }
  return Status::ok();
}

}  // namespace

struct PyHandle::Pending {
  aio::RequestId id = 0;
  HeldBuffer buffer;
  Target target;
  std::uint64_t offset = 0;
  std::size_t nbytes = 0;
  bool validate = false;
};

PyHandle::PyHandle(const aio::AioConfig& config) : owner_pid_(::getpid()) {
  auto created = aio::Handle::create(config);
  if (!created.is_ok()) raise_status(created.status());
  handle_ = std::shared_ptr<aio::Handle>(std::move(created).value());
}

PyHandle::~PyHandle() { close(); }

void PyHandle::close() {
  if (!handle_) return;
  if (::getpid() != owner_pid_) {
    // A copy made by fork(): its workers do not exist in this process, so destroying the engine
    // handle would wait for them forever. It is leaked; the I/O it had queued is the parent's.
    (void)new std::shared_ptr<aio::Handle>(std::move(handle_));
    pending_.clear();
    registered_.clear();
    return;
  }
  std::shared_ptr<aio::Handle> h = std::move(handle_);
  std::vector<Pending> batch;
  batch.swap(pending_);
  std::vector<HeldBuffer> registered;
  registered.swap(registered_);
  {
    py::gil_scoped_release unlocked;
    // Every request of this handle finishes before its buffer is let go. Errors are dropped:
    // close() (and garbage collection) cannot report them; wait() first to see them.
    for (Pending& p : batch) (void)h->wait(p.id);
    if (!registered.empty()) (void)h->unregister_buffers();
    h.reset();  // the last user (usually this one) stops the workers
  }
}

std::shared_ptr<aio::Handle> PyHandle::handle(const char* verb) const {
  if (!handle_) throw py::value_error(fmt::format("{}: the handle is closed", verb));
  if (::getpid() != owner_pid_) {
    // fork() copies the handle but not its worker threads: a request would never finish.
    throw std::runtime_error(fmt::format(
        "{}: this zinf.aio.Handle was created in process {} and cannot be used after fork(); create "
        "handles in the child process",
        verb, owner_pid_));
  }
  return handle_;
}

int PyHandle::sync_io(bool is_write, py::handle buffer, py::handle file, std::int64_t file_offset,
                      std::optional<std::int64_t> nbytes, bool validate, aio::WriteOptions options) {
  const char* verb = is_write ? "sync_pwrite" : "sync_pread";
  std::shared_ptr<aio::Handle> hp = handle(verb);
  aio::Handle& h = *hp;
  HeldBuffer held = HeldBuffer::acquire(buffer, !is_write, verb);
  const std::size_t n = resolve_nbytes(held, nbytes, verb);
  const std::uint64_t offset = checked_offset(file_offset, verb);
  const Target t = parse_target(file, verb);
  Status st;
  {
    py::gil_scoped_release unlocked;
    if (t.is_fd) {
      st = is_write ? h.sync_pwrite(held.data(), n, t.fd, offset) : h.sync_pread(held.data(), n, t.fd, offset);
    } else {
      st = is_write ? h.sync_pwrite(held.data(), n, t.path, offset, options) : h.sync_pread(held.data(), n, t.path, offset);
    }
    if (st.is_ok() && validate) st = validate_range(t, held.data(), n, offset);
  }
  if (!st.is_ok()) raise_status(st, t.name(), offset);
  return 1;
}

int PyHandle::async_io(bool is_write, py::handle buffer, py::handle file, std::int64_t file_offset,
                       std::optional<std::int64_t> nbytes, bool validate, aio::WriteOptions options) {
  const char* verb = is_write ? "async_pwrite" : "async_pread";
  std::shared_ptr<aio::Handle> hp = handle(verb);
  aio::Handle& h = *hp;
  Pending p;
  p.buffer = HeldBuffer::acquire(buffer, !is_write, verb);
  p.nbytes = resolve_nbytes(p.buffer, nbytes, verb);
  p.offset = checked_offset(file_offset, verb);
  p.target = parse_target(file, verb);
  p.validate = validate;
  pending_.reserve(pending_.size() + 1);  // nothing may throw between submission and the push below
  Result<aio::RequestId> id = aio::RequestId{0};
  {
    py::gil_scoped_release unlocked;
    std::byte* data = p.buffer.data();
    const Target& t = p.target;
    if (t.is_fd) {
      id = is_write ? h.async_pwrite(data, p.nbytes, t.fd, p.offset) : h.async_pread(data, p.nbytes, t.fd, p.offset);
    } else {
      id = is_write ? h.async_pwrite(data, p.nbytes, t.path, p.offset, options)
                    : h.async_pread(data, p.nbytes, t.path, p.offset);
    }
  }
  if (!id.is_ok()) raise_status(id.status(), p.target.name(), p.offset);
  p.id = id.value();
  pending_.push_back(std::move(p));
  return 0;
}

int PyHandle::wait() {
  std::shared_ptr<aio::Handle> hp = handle("wait");
  aio::Handle& h = *hp;
  std::vector<Pending> batch;
  batch.swap(pending_);  // requests submitted from now on (other threads) belong to a later wait()
  std::vector<Status> results(batch.size());
  {
    py::gil_scoped_release unlocked;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      results[i] = h.wait(batch[i].id);
      if (results[i].is_ok() && batch[i].validate) {
        results[i] = validate_range(batch[i].target, batch[i].buffer.data(), batch[i].nbytes, batch[i].offset);
      }
    }
  }
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (!results[i].is_ok()) {
      const std::string name = batch[i].target.name();
      const std::uint64_t offset = batch[i].offset;
      batch.clear();  // every request is finished: the buffers may go
      raise_status(results[i], name, offset);
    }
  }
  return static_cast<int>(batch.size());
}

void PyHandle::register_buffer(py::handle buffer) {
  std::shared_ptr<aio::Handle> hp = handle("register_buffer");
  aio::Handle& h = *hp;
  HeldBuffer held = HeldBuffer::acquire(buffer, false, "register_buffer");
  if (held.size() == 0) return;
  Status st;
  {
    py::gil_scoped_release unlocked;
    st = h.register_buffer(held.data(), held.size());
  }
  if (!st.is_ok()) raise_status(st);
  registered_.push_back(std::move(held));  // kept alive while registered
}

void PyHandle::unregister_buffers() {
  std::shared_ptr<aio::Handle> hp = handle("unregister_buffers");
  aio::Handle& h = *hp;
  Status st;
  {
    py::gil_scoped_release unlocked;
    st = h.unregister_buffers();
  }
  if (!st.is_ok()) raise_status(st);
  registered_.clear();
}

std::size_t PyHandle::pending() const { return pending_.size(); }

aio::AioConfig PyHandle::config() const { return handle("config")->config(); }

std::string PyHandle::backend() const { return std::string(aio::backend_name(handle("backend")->backend())); }

py::dict PyHandle::stats() const {
  const aio::HandleStats s = handle("stats")->stats();
  py::dict d;
  d["requests"] = s.requests;
  d["ops"] = s.ops;
  d["retries"] = s.retries;
  d["fixed_ops"] = s.fixed_ops;
  d["bounced_bytes"] = s.bounced_bytes;
  d["edge_ops"] = s.edge_ops;
  d["cancels"] = s.cancels;
  d["queue_resets"] = s.queue_resets;
  return d;
}

bool PyHandle::closed() const { return !handle_; }

}  // namespace zinf::python

namespace zinf::python {
namespace {

std::size_t knob(std::int64_t value, const char* name) {
  if (value < 0) throw py::value_error(fmt::format("aio.{} = {}: must be >= 0", name, value));
  return static_cast<std::size_t>(value);
}

aio::AioConfig make_config(std::int64_t block_size, std::int64_t queue_depth, bool single_submit,
                           bool overlap_events, std::int64_t intra_op_parallelism, const std::string& backend,
                           bool use_direct_io, double request_timeout_s, bool pin_threads) {
  aio::AioConfig c;
  c.block_size = knob(block_size, "block_size");
  c.queue_depth = knob(queue_depth, "queue_depth");
  c.single_submit = single_submit;
  c.overlap_events = overlap_events;
  c.intra_op_parallelism = knob(intra_op_parallelism, "intra_op_parallelism");
  auto parsed = aio::parse_backend(backend);
  if (!parsed.is_ok()) raise_status(parsed.status());
  c.backend = parsed.value();
  c.use_direct_io = use_direct_io;
  c.request_timeout_s = request_timeout_s;
  c.pin_threads = pin_threads;
  return c;
}

aio::WriteOptions write_options(bool truncate, bool fdatasync) {
  aio::WriteOptions o;
  o.truncate = truncate;
  o.fdatasync = fdatasync;
  return o;
}

}  // namespace

void bind_handle(py::module_& aio) {
  using py::arg;
  py::class_<PyHandle>(aio, "Handle", R"doc(
An asynchronous file I/O handle: DeepNVMe's ``aio_handle`` knobs and verbs over zinf's engine.

Knobs (same names, meaning and order as DeepNVMe and the ``"aio"`` block of ds_config.json):
``block_size`` bytes per submitted chunk, ``queue_depth`` chunks in flight per worker,
``single_submit`` one submit call per chunk, ``overlap_events`` refill as completions arrive,
``intra_op_parallelism`` worker threads one request is split across. zinf only, keyword-only:
``backend`` ("auto", "io_uring", "libaio", "threads"), ``use_direct_io`` (O_DIRECT on files the
handle opens; buffered fallback where the file system refuses it), ``request_timeout_s``,
``pin_threads``.

Buffers: any object exposing contiguous memory (bytearray, numpy array, memoryview, a
``zinf.aio.pinned`` buffer) or a contiguous torch CPU tensor, used in place (no copy). Unaligned
buffers, offsets and lengths are correct (the engine bounces heads and tails); pinned aligned
buffers are the fast path. Files: a path (str, bytes, os.PathLike), which the handle opens and
closes per request, or an open file descriptor (int), whose O_DIRECT flag the caller chose.

The GIL is released while requests run; a buffer given to an async verb is held (and stays
alive) until ``wait()`` returns. One handle may be used from several threads.)doc")
      .def(py::init([](std::int64_t block_size, std::int64_t queue_depth, bool single_submit, bool overlap_events,
                       std::int64_t intra_op_parallelism, const std::string& backend, bool use_direct_io,
                       double request_timeout_s, bool pin_threads) {
             return std::make_unique<PyHandle>(make_config(block_size, queue_depth, single_submit, overlap_events,
                                                           intra_op_parallelism, backend, use_direct_io,
                                                           request_timeout_s, pin_threads));
           }),
           arg("block_size") = 1048576, arg("queue_depth") = 8, arg("single_submit") = false,
           arg("overlap_events") = true, arg("intra_op_parallelism") = 1, py::kw_only(), arg("backend") = "auto",
           arg("use_direct_io") = true, arg("request_timeout_s") = 120.0, arg("pin_threads") = true)
      // Blocking verbs.
      .def("sync_pread",
           [](PyHandle& h, py::handle buffer, py::handle filename, std::int64_t file_offset,
              std::optional<std::int64_t> nbytes) {
             return h.sync_io(false, buffer, filename, file_offset, nbytes, false, {});
           },
           arg("buffer"), arg("filename"), arg("file_offset") = 0, py::kw_only(), arg("nbytes") = py::none(),
           "Reads len(buffer) bytes (or nbytes) of the file at file_offset into buffer. Returns 1 (the completed "
           "request); raises AioError on failure (a read past the end: code 'OutOfRange').")
      .def("sync_pwrite",
           [](PyHandle& h, py::handle buffer, py::handle filename, std::int64_t file_offset,
              std::optional<std::int64_t> nbytes, bool truncate, bool fdatasync) {
             return h.sync_io(true, buffer, filename, file_offset, nbytes, false, write_options(truncate, fdatasync));
           },
           arg("buffer"), arg("filename"), arg("file_offset") = 0, py::kw_only(), arg("nbytes") = py::none(),
           arg("truncate") = false, arg("fdatasync") = false,
           "Writes the buffer (or its first nbytes) to the file at file_offset (created if missing, mode 0644; "
           "truncate=True empties it first; fdatasync=True syncs it after). Returns 1; raises AioError on failure.")
      .def("read",
           [](PyHandle& h, py::handle buffer, py::handle filename, bool validate, std::int64_t file_offset) {
             return h.sync_io(false, buffer, filename, file_offset, std::nullopt, validate, {});
           },
           arg("buffer"), arg("filename"), arg("validate") = false, arg("file_offset") = 0,
           "DeepNVMe's read: sync_pread; validate=True compares with a plain read afterwards.")
      .def("write",
           [](PyHandle& h, py::handle buffer, py::handle filename, bool validate, std::int64_t file_offset) {
             return h.sync_io(true, buffer, filename, file_offset, std::nullopt, validate, {});
           },
           arg("buffer"), arg("filename"), arg("validate") = false, arg("file_offset") = 0,
           "DeepNVMe's write: sync_pwrite; validate=True reads the file back and compares.")
      // Queued verbs.
      .def("async_pread",
           [](PyHandle& h, py::handle buffer, py::handle filename, std::int64_t file_offset,
              std::optional<std::int64_t> nbytes) {
             return h.async_io(false, buffer, filename, file_offset, nbytes, false, {});
           },
           arg("buffer"), arg("filename"), arg("file_offset") = 0, py::kw_only(), arg("nbytes") = py::none(),
           "Queues a read of len(buffer) bytes (or nbytes) at file_offset and returns 0 at once; wait() finishes "
           "it. Errors found at submission (bad argument, missing file) raise here.")
      .def("async_pwrite",
           [](PyHandle& h, py::handle buffer, py::handle filename, std::int64_t file_offset,
              std::optional<std::int64_t> nbytes, bool truncate, bool fdatasync) {
             return h.async_io(true, buffer, filename, file_offset, nbytes, false, write_options(truncate, fdatasync));
           },
           arg("buffer"), arg("filename"), arg("file_offset") = 0, py::kw_only(), arg("nbytes") = py::none(),
           arg("truncate") = false, arg("fdatasync") = false,
           "Queues a write of the buffer at file_offset and returns 0 at once; wait() finishes it.")
      .def("pread",
           [](PyHandle& h, py::handle buffer, py::handle filename, bool validate, bool async, std::int64_t file_offset,
              std::optional<std::int64_t> nbytes) {
             return async ? h.async_io(false, buffer, filename, file_offset, nbytes, validate, {})
                          : h.sync_io(false, buffer, filename, file_offset, nbytes, validate, {});
           },
           arg("buffer"), arg("filename"), arg("validate") = false, arg("async") = false, arg("file_offset") = 0,
           py::kw_only(), arg("nbytes") = py::none(),
           "DeepNVMe's pread: async=True queues (returns 0), else reads now (returns 1).")
      .def("pwrite",
           [](PyHandle& h, py::handle buffer, py::handle filename, bool validate, bool async, std::int64_t file_offset,
              std::optional<std::int64_t> nbytes) {
             return async ? h.async_io(true, buffer, filename, file_offset, nbytes, validate, {})
                          : h.sync_io(true, buffer, filename, file_offset, nbytes, validate, {});
           },
           arg("buffer"), arg("filename"), arg("validate") = false, arg("async") = false, arg("file_offset") = 0,
           py::kw_only(), arg("nbytes") = py::none(),
           "DeepNVMe's pwrite: async=True queues (returns 0), else writes now (returns 1).")
      .def("wait", &PyHandle::wait,
           "Waits for every queued request and returns how many completed. If any failed, all are still "
           "finished first, then AioError is raised for the first failed one (filename, offset, errno).")
      .def("register_buffer", &PyHandle::register_buffer, arg("buffer"),
           "Registers the buffer's memory for io_uring fixed-buffer I/O (other backends ignore it); the handle "
           "keeps the buffer alive until unregister_buffers() or close().")
      .def("unregister_buffers", &PyHandle::unregister_buffers)
      .def("close", &PyHandle::close,
           "Finishes what is queued (errors dropped: wait() first to see them) and stops the workers.")
      .def_property_readonly("closed", &PyHandle::closed)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyHandle& h, py::args) { h.close(); })
      .def("pending", &PyHandle::pending, "Requests queued and not yet waited for.")
      .def("stats", &PyHandle::stats, "The engine's counters (requests, ops, retries, fixed_ops, ...).")
      .def_property_readonly("backend", &PyHandle::backend, "The backend running: io_uring, libaio or threads.")
      .def("get_block_size", [](const PyHandle& h) { return h.config().block_size; })
      .def("get_queue_depth", [](const PyHandle& h) { return h.config().queue_depth; })
      .def("get_single_submit", [](const PyHandle& h) { return h.config().single_submit; })
      .def("get_overlap_events", [](const PyHandle& h) { return h.config().overlap_events; })
      .def("get_intra_op_parallelism", [](const PyHandle& h) { return h.config().intra_op_parallelism; })
      .def("get_thread_count", [](const PyHandle& h) { return h.config().intra_op_parallelism; })
      .def_static("get_alignment", &aio::Handle::alignment,
                  "Alignment (bytes) of buffers, offsets and lengths on the O_DIRECT fast path.")
      .def("__repr__", [](const PyHandle& h) {
        if (h.closed()) return std::string("zinf.aio.Handle(closed)");
        const aio::AioConfig c = h.config();
        return fmt::format(
            "zinf.aio.Handle(block_size={}, queue_depth={}, single_submit={}, overlap_events={}, "
            "intra_op_parallelism={}, backend='{}')",
            c.block_size, c.queue_depth, c.single_submit ? "True" : "False", c.overlap_events ? "True" : "False",
            c.intra_op_parallelism, h.backend());
      });

  aio.def("backends", [] {
    std::vector<std::string> out;
    for (aio::Backend b : {aio::Backend::kIoUring, aio::Backend::kLibaio, aio::Backend::kThreads}) {
      if (aio::backend_available(b)) out.emplace_back(aio::backend_name(b));
    }
    return out;
  }, "Backends this build has and the running kernel accepts, fastest first.");
  aio.def("default_backend", [] { return std::string(aio::backend_name(aio::resolve_auto_backend())); },
          "What backend='auto' resolves to on this machine.");
}

}  // namespace zinf::python
