// The I/O half of zinf.save_file / zinf.load_file: a byte stream written through pinned double
// buffers, and a data section read straight into aligned memory, both with O_DIRECT.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
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
#include "zinf/aio/pinned.h"

namespace zinf::python {
namespace {

constexpr std::size_t kAlign = 4096;

struct FileKnobs {
  std::size_t block_size;
  std::size_t queue_depth;
  std::size_t intra_op_parallelism;
  std::string backend;
};

Result<std::unique_ptr<aio::Handle>> make_handle(const FileKnobs& k) {
  aio::AioConfig c;
  c.block_size = k.block_size;
  c.queue_depth = k.queue_depth;
  c.intra_op_parallelism = k.intra_op_parallelism;
  ZINF_ASSIGN_OR_RETURN(c.backend, aio::parse_backend(k.backend));
  return aio::Handle::create(c);
}

struct Segment {
  const std::byte* data;
  std::size_t size;
};

// Writes the concatenation of `segments` to `path` (created or truncated) through `count`
// pinned staging buffers of `staging` bytes: while the engine writes one, the next is filled.
// Every chunk but the last is a whole number of pages at a page-aligned offset (O_DIRECT); the
// last is padded to a page and the file is then cut to its true length.
Status write_stream(const std::string& path, const std::vector<Segment>& segments, const FileKnobs& knobs,
                    std::size_t staging, std::size_t count, bool fsync) {
  std::uint64_t total = 0;
  for (const Segment& s : segments) total += s.size;
  std::vector<aio::PinnedBuffer> buffers;  // declared first: registered with the handle, so they outlive it
  ZINF_ASSIGN_OR_RETURN(auto handle, make_handle(knobs));
  ZINF_ASSIGN_OR_RETURN(fileio::OpenedFile file,
                        fileio::open_direct_or_buffered(path, O_WRONLY | O_CREAT | O_TRUNC, 0644, true, "save_file"));
  const std::size_t chunks = static_cast<std::size_t>((total + staging - 1) / staging);
  count = std::max<std::size_t>(1, std::min(count, chunks));
  for (std::size_t i = 0; i < count; ++i) {
    ZINF_ASSIGN_OR_RETURN(aio::PinnedBuffer b, aio::PinnedBuffer::allocate(staging, kAlign));
    ZINF_RETURN_IF_ERROR(handle->register_buffer(b.data(), b.size()));
    buffers.push_back(std::move(b));
  }
  std::vector<std::optional<aio::RequestId>> in_flight(count);
  Status first_error;
  auto settle = [&](std::size_t slot) {
    if (!in_flight[slot]) return;
    Status st = handle->wait(*in_flight[slot]);
    in_flight[slot].reset();
    if (first_error.is_ok() && !st.is_ok()) first_error = std::move(st);
  };
  std::size_t seg = 0;
  std::size_t seg_pos = 0;
  std::uint64_t file_offset = 0;
  for (std::size_t chunk = 0; chunk < chunks && first_error.is_ok(); ++chunk) {
    const std::size_t slot = chunk % count;
    settle(slot);
    if (!first_error.is_ok()) break;
    std::byte* out = buffers[slot].bytes();
    std::size_t filled = 0;
    while (filled < staging && seg < segments.size()) {
      const std::size_t n = std::min(staging - filled, segments[seg].size - seg_pos);
      if (n > 0) std::memcpy(out + filled, segments[seg].data + seg_pos, n);
      filled += n;
      seg_pos += n;
      if (seg_pos == segments[seg].size) {
        ++seg;
        seg_pos = 0;
      }
    }
    std::size_t length = filled;
    if (file.direct && length % kAlign != 0) {
      const std::size_t padded = (length + kAlign - 1) / kAlign * kAlign;
      std::memset(out + length, 0, padded - length);
      length = padded;
    }
    auto id = handle->async_pwrite(out, length, file.fd.get(), file_offset);
    if (!id.is_ok()) {
      first_error = id.status();
      break;
    }
    in_flight[slot] = id.value();
    file_offset += filled;
  }
  for (std::size_t slot = 0; slot < count; ++slot) settle(slot);
  ZINF_RETURN_IF_ERROR(first_error);
  if (::ftruncate(file.fd.get(), static_cast<off_t>(total)) != 0) {
    return Status::io_error("ftruncate", path, 0, total, errno);
  }
  if (fsync && ::fdatasync(file.fd.get()) != 0) return Status::io_error("fdatasync", path, 0, total, errno);
  const int err = file.fd.close_checked();
  if (err != 0) return Status::io_error("close", path, 0, total, err);
  return Status::ok();
}

}  // namespace

void bind_tensor_file(py::module_& m) {
  m.def(
      "_write_stream",
      [](const std::string& path, const py::list& parts, std::size_t block_size, std::size_t queue_depth,
         std::size_t intra_op_parallelism, const std::string& backend, std::size_t staging, std::size_t count,
         bool fsync) {
        if (staging == 0 || staging % kAlign != 0) {
          throw py::value_error(fmt::format("staging buffers must be a positive multiple of {} bytes", kAlign));
        }
        std::vector<HeldBuffer> held;
        std::vector<Segment> segments;
        held.reserve(parts.size());
        for (py::handle part : parts) {
          held.push_back(HeldBuffer::acquire(part, false, "save_file"));
          segments.push_back(Segment{held.back().data(), held.back().size()});
        }
        Status st;
        {
          py::gil_scoped_release unlocked;
          st = write_stream(path, segments, FileKnobs{block_size, queue_depth, intra_op_parallelism, backend},
                            staging, count, fsync);
        }
        if (!st.is_ok()) raise_status(st, path, 0);
      },
      py::arg("path"), py::arg("parts"), py::arg("block_size"), py::arg("queue_depth"),
      py::arg("intra_op_parallelism"), py::arg("backend"), py::arg("staging"), py::arg("count"), py::arg("fsync"));

  m.def(
      "_read_range",
      [](const std::string& path, std::uint64_t offset, std::uint64_t nbytes, std::size_t block_size,
         std::size_t queue_depth, std::size_t intra_op_parallelism, const std::string& backend) {
        // The range is read from the page that holds its first byte, so the memory (aligned) and
        // the file offset agree modulo the page size and O_DIRECT covers all but the last page.
        const std::uint64_t head = offset % kAlign;
        auto memory = std::make_unique<AlignedMemory>(static_cast<std::size_t>(head + nbytes));
        Status st;
        {
          py::gil_scoped_release unlocked;
          auto handle = make_handle(FileKnobs{block_size, queue_depth, intra_op_parallelism, backend});
          st = handle.is_ok() ? handle.value()->sync_pread(memory->data(), memory->size(), path, offset - head)
                              : handle.status();
        }
        if (!st.is_ok()) raise_status(st, path, offset);
        return py::make_tuple(py::cast(std::move(memory)), head);
      },
      py::arg("path"), py::arg("offset"), py::arg("nbytes"), py::arg("block_size"), py::arg("queue_depth"),
      py::arg("intra_op_parallelism"), py::arg("backend"),
      "Reads nbytes of path at offset into new aligned memory; returns (memory, start) where the range "
      "begins at memory[start].");
}

}  // namespace zinf::python
