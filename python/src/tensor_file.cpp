// The I/O half of zinf.save_file / zinf.load_file: byte streams between tensors and a file through
// pinned staging buffers and the aio engine, with O_DIRECT.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
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
  std::byte* data;  // read from by save_file, written to by load_file
  std::size_t size;
};

// A handle with its registered pinned staging buffers, kept between save_file calls: the
// buffers are pre-faulted and mlock'ed once, not per file.
struct Stager {
  FileKnobs knobs;
  std::size_t staging = 0;
  pid_t pid = 0;
  std::vector<aio::PinnedBuffer> buffers;  // before handle: registered with it, so they outlive it
  std::unique_ptr<aio::Handle> handle;
};

std::mutex g_stager_mutex;
std::unique_ptr<Stager> g_stager;  // the idle one; a concurrent save_file makes its own

bool same_knobs(const FileKnobs& a, const FileKnobs& b) {
  return a.block_size == b.block_size && a.queue_depth == b.queue_depth &&
         a.intra_op_parallelism == b.intra_op_parallelism && a.backend == b.backend;
}

Result<std::unique_ptr<Stager>> take_stager(const FileKnobs& knobs, std::size_t staging, std::size_t count) {
  {
    std::lock_guard lock(g_stager_mutex);
    if (g_stager && g_stager->pid != ::getpid()) {
      // Inherited through fork(): its handle's workers are not in this process; never touch it.
      (void)g_stager.release();
    }
    if (g_stager && same_knobs(g_stager->knobs, knobs) && g_stager->staging == staging &&
        g_stager->buffers.size() >= count) {
      return std::move(g_stager);
    }
  }
  auto stager = std::make_unique<Stager>();
  stager->knobs = knobs;
  stager->staging = staging;
  stager->pid = ::getpid();
  ZINF_ASSIGN_OR_RETURN(stager->handle, make_handle(knobs));
  for (std::size_t i = 0; i < count; ++i) {
    ZINF_ASSIGN_OR_RETURN(aio::PinnedBuffer b, aio::PinnedBuffer::allocate(staging, kAlign));
    ZINF_RETURN_IF_ERROR(stager->handle->register_buffer(b.data(), b.size()));
    stager->buffers.push_back(std::move(b));
  }
  return stager;
}

void return_stager(std::unique_ptr<Stager> stager) {
  std::unique_ptr<Stager> old;
  std::lock_guard lock(g_stager_mutex);
  old = std::exchange(g_stager, std::move(stager));  // the latest knobs win
}

// write_stream's body: the concatenation of `segments` into the empty file `path` through
// `count` pinned staging buffers of `staging` bytes: while the engine writes one, the next is
// filled. Every chunk but the last is a whole number of pages at a page-aligned offset
// (O_DIRECT); the last is padded to a page and the file is then cut to its true length.
Status write_file(const std::string& path, const std::vector<Segment>& segments, const FileKnobs& knobs,
                  std::size_t staging, std::size_t count, bool fsync) {
  std::uint64_t total = 0;
  for (const Segment& s : segments) total += s.size;
  ZINF_ASSIGN_OR_RETURN(fileio::OpenedFile file,
                        fileio::open_direct_or_buffered(path, O_WRONLY | O_NOFOLLOW, 0, true, "save_file"));
  // Allocate the whole file first: O_DIRECT writes past the end of a file are serialised by
  // file systems such as ext4 (each extends it), writes inside it can run side by side. Where
  // fallocate is not supported the writes still work, only slower.
  const std::uint64_t padded = (total + kAlign - 1) / kAlign * kAlign;
  (void)::fallocate(file.fd.get(), 0, 0, static_cast<off_t>(padded));
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Stager> stager, take_stager(knobs, staging, count));
  aio::Handle* handle = stager->handle.get();
  std::vector<aio::PinnedBuffer>& buffers = stager->buffers;
  const std::size_t chunks = static_cast<std::size_t>((total + staging - 1) / staging);
  count = std::max<std::size_t>(1, std::min(count, chunks));
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
  if (first_error.is_ok()) return_stager(std::move(stager));  // after a failure: a fresh one next time
  ZINF_RETURN_IF_ERROR(first_error);
  if (::ftruncate(file.fd.get(), static_cast<off_t>(total)) != 0) {
    return Status::io_error("ftruncate", path, 0, total, errno);
  }
  if (fsync && ::fdatasync(file.fd.get()) != 0) return Status::io_error("fdatasync", path, 0, total, errno);
  const int err = file.fd.close_checked();
  if (err != 0) return Status::io_error("close", path, 0, total, err);
  return Status::ok();
}

// Writes the concatenation of `segments` to `path` (write_file). The bytes go to a temporary
// file beside `path` (fileio::create_temp_beside), renamed over it once all are written (and
// synced, with `fsync`): a failure or a crash part-way leaves `path` as it was, never a file of
// full length whose unwritten tail reads as zeros. An existing file's permission bits carry
// over; a symbolic link at `path` is followed, its target replaced.
Status write_stream(const std::string& path, const std::vector<Segment>& segments, const FileKnobs& knobs,
                    std::size_t staging, std::size_t count, bool fsync) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path target = path;
  struct stat link {};
  if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    target = fs::weakly_canonical(target, ec);
    if (ec) return Status::sys_error(fmt::format("save_file {}: resolving the link", path), ec.value());
  }
  const std::string final_path = target.string();
  ZINF_ASSIGN_OR_RETURN(fileio::TempFile temp, fileio::create_temp_beside(final_path, 0644));
  struct stat old {};
  Status st;
  if (::stat(final_path.c_str(), &old) == 0 && S_ISREG(old.st_mode) && ::fchmod(temp.fd.get(), old.st_mode & 07777) != 0) {
    st = Status::sys_error(fmt::format("fchmod {}", temp.path), errno);
  }
  temp.fd.reset();  // write_file reopens it with O_DIRECT
  if (st.is_ok()) st = write_file(temp.path, segments, knobs, staging, count, fsync);
  if (st.is_ok()) st = fileio::rename_path(temp.path, final_path);
  if (!st.is_ok()) {
    ::unlink(temp.path.c_str());  // best effort: the error being returned is the one that matters
    return st;
  }
  if (fsync) {
    const std::string dir = target.parent_path().empty() ? std::string(".") : target.parent_path().string();
    ZINF_RETURN_IF_ERROR(fileio::sync_dir(dir));
  }
  return Status::ok();
}

// Reads the bytes of `path` from `offset` on into `segments`, back to back: O_DIRECT reads into
// `count` pinned staging buffers (up to `count` in flight), each copied out to the segments as it
// arrives. Reading into the destinations directly was several times slower on fresh memory
// (every request faults its pages inside the kernel) and would tie all tensors of a file to one
// allocation (docs/python.md).
Status read_stream(const std::string& path, std::uint64_t offset, const std::vector<Segment>& segments,
                   const FileKnobs& knobs, std::size_t staging, std::size_t count) {
  std::uint64_t total = 0;
  for (const Segment& s : segments) total += s.size;
  if (total == 0) return Status::ok();
  const std::uint64_t head = offset % kAlign;  // reads start on a page, as O_DIRECT wants
  const std::uint64_t begin = offset - head;
  const std::uint64_t span = head + total;
  const std::size_t chunks = static_cast<std::size_t>((span + staging - 1) / staging);
  ZINF_ASSIGN_OR_RETURN(fileio::OpenedFile file,
                        fileio::open_direct_or_buffered(path, O_RDONLY, 0, true, "load_file"));
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Stager> stager, take_stager(knobs, staging, count));
  aio::Handle* handle = stager->handle.get();
  count = std::max<std::size_t>(1, std::min(count, chunks));
  std::vector<std::optional<aio::RequestId>> in_flight(count);
  Status first_error;
  auto submit = [&](std::size_t chunk) {
    const std::uint64_t at = static_cast<std::uint64_t>(chunk) * staging;
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(staging, span - at));
    auto id = handle->async_pread(stager->buffers[chunk % count].data(), n, file.fd.get(), begin + at);
    if (id.is_ok()) {
      in_flight[chunk % count] = id.value();
    } else if (first_error.is_ok()) {
      first_error = id.status();
    }
  };
  for (std::size_t c = 0; c < count; ++c) submit(c);
  std::size_t seg = 0;
  std::size_t seg_pos = 0;
  for (std::size_t chunk = 0; chunk < chunks && first_error.is_ok(); ++chunk) {
    const std::size_t slot = chunk % count;
    if (!in_flight[slot]) break;
    Status st = handle->wait(*in_flight[slot]);
    in_flight[slot].reset();
    if (!st.is_ok()) {
      first_error = std::move(st);
      break;
    }
    const std::uint64_t at = static_cast<std::uint64_t>(chunk) * staging;
    std::size_t pos = chunk == 0 ? static_cast<std::size_t>(head) : 0;
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(staging, span - at));
    const std::byte* in = stager->buffers[slot].bytes();
    while (pos < n && seg < segments.size()) {
      const std::size_t m = std::min(n - pos, segments[seg].size - seg_pos);
      if (m > 0) std::memcpy(segments[seg].data + seg_pos, in + pos, m);
      pos += m;
      seg_pos += m;
      if (seg_pos == segments[seg].size) {
        ++seg;
        seg_pos = 0;
      }
    }
    if (chunk + count < chunks) submit(chunk + count);
  }
  for (auto& id : in_flight) {
    if (id) (void)handle->wait(*id);  // only after a failure: finish before the buffers go back
  }
  if (first_error.is_ok()) return_stager(std::move(stager));
  return first_error;
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
      "_read_stream",
      [](const std::string& path, std::uint64_t offset, const py::list& parts, std::size_t block_size,
         std::size_t queue_depth, std::size_t intra_op_parallelism, const std::string& backend, std::size_t staging,
         std::size_t count) {
        if (staging == 0 || staging % kAlign != 0) {
          throw py::value_error(fmt::format("staging buffers must be a positive multiple of {} bytes", kAlign));
        }
        std::vector<HeldBuffer> held;
        std::vector<Segment> segments;
        held.reserve(parts.size());
        for (py::handle part : parts) {
          held.push_back(HeldBuffer::acquire(part, true, "load_file"));
          segments.push_back(Segment{held.back().data(), held.back().size()});
        }
        Status st;
        {
          py::gil_scoped_release unlocked;
          st = read_stream(path, offset, segments, FileKnobs{block_size, queue_depth, intra_op_parallelism, backend},
                           staging, count);
        }
        if (!st.is_ok()) raise_status(st, path, offset);
      },
      py::arg("path"), py::arg("offset"), py::arg("parts"), py::arg("block_size"), py::arg("queue_depth"),
      py::arg("intra_op_parallelism"), py::arg("backend"), py::arg("staging"), py::arg("count"),
      "Reads the file from offset on into the writable buffers `parts`, back to back.");
}

}  // namespace zinf::python
