// aio_bench sweep: timed runs of zinf's aio handle over fresh or pre-written files.
#include "sweep.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "common/file_io.h"
#include "zinf/log.h"

namespace zinf::aio_bench {

const char* op_name(Op op) { return op == Op::kRead ? "read" : "write"; }

double Samples::median() const {
  if (gbps.empty()) return 0.0;
  std::vector<double> v = gbps;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
double Samples::min() const { return gbps.empty() ? 0.0 : *std::min_element(gbps.begin(), gbps.end()); }
double Samples::max() const { return gbps.empty() ? 0.0 : *std::max_element(gbps.begin(), gbps.end()); }

std::string describe(const Point& p) {
  return fmt::format("{} bs={} qd={} par={} single_submit={} overlap_events={}",
                     aio::backend_name(p.backend), p.block_size, p.queue_depth, p.parallelism,
                     p.single_submit, p.overlap_events);
}

Status Bench::fresh_write_file() const {
  if (::unlink(write_path_.c_str()) != 0 && errno != ENOENT) {
    return Status::sys_error(fmt::format("unlink {}", write_path_), errno);
  }
  ZINF_ASSIGN_OR_RETURN(fileio::UniqueFd fd,
                        fileio::open_file(write_path_, O_WRONLY | O_CREAT | O_TRUNC, 0644, "writing"));
  const int rc = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(file_bytes_));
  // File systems without fallocate (rc == EOPNOTSUPP) still work: the writes allocate.
  if (rc != 0 && rc != EOPNOTSUPP) {
    return Status::sys_error(fmt::format("posix_fallocate {} bytes for {}", file_bytes_, write_path_), rc);
  }
  return Status::ok();
}

Result<Bench> Bench::create(const std::string& dir, std::size_t file_bytes) {
  Bench bench;
  const std::string stem = fmt::format("{}/zinf_aio_bench.{}", dir, ::getpid());
  bench.read_path_ = stem + ".read";
  bench.write_path_ = stem + ".write";
  bench.file_bytes_ = file_bytes;
  ZINF_ASSIGN_OR_RETURN(bench.buffer_, aio::PinnedBuffer::allocate(file_bytes));
  bench.owns_files_ = true;
  // Fill with a pattern, then lay out the read file once with a default handle.
  for (std::size_t i = 0; i < file_bytes; i += 4096) bench.buffer_.bytes()[i] = std::byte(i >> 12);
  aio::AioConfig config;
  config.block_size = 1 << 20;
  config.queue_depth = 16;
  ZINF_ASSIGN_OR_RETURN(auto handle, aio::Handle::create(config));
  ZINF_RETURN_IF_ERROR(handle->sync_pwrite(bench.buffer_.data(), file_bytes, bench.read_path_, 0,
                                           {.truncate = true, .fdatasync = true})
                           .with_context("laying out the read file"));
  return bench;
}

Bench::Bench(Bench&& other) noexcept
    : read_path_(std::move(other.read_path_)),
      write_path_(std::move(other.write_path_)),
      file_bytes_(other.file_bytes_),
      buffer_(std::move(other.buffer_)),
      owns_files_(std::exchange(other.owns_files_, false)) {}

Bench::~Bench() {
  if (!owns_files_) return;
  ::unlink(read_path_.c_str());
  ::unlink(write_path_.c_str());
}

Result<double> Bench::run(const Point& point, Op op, const Timing& timing) {
  aio::AioConfig config;
  config.backend = point.backend;
  config.block_size = point.block_size;
  config.queue_depth = point.queue_depth;
  config.intra_op_parallelism = point.parallelism;
  config.single_submit = point.single_submit;
  config.overlap_events = point.overlap_events;
  ZINF_ASSIGN_OR_RETURN(auto handle, aio::Handle::create(config));
  ZINF_RETURN_IF_ERROR(handle->register_buffer(buffer_.data(), buffer_.size()));
  const bool is_write = op == Op::kWrite;
  if (is_write) ZINF_RETURN_IF_ERROR(fresh_write_file());
  const std::string& path = is_write ? write_path_ : read_path_;
  // Open once, O_DIRECT, as fio does; the handle then works on the fd.
  ZINF_ASSIGN_OR_RETURN(fileio::OpenedFile file,
                        fileio::open_direct_or_buffered(path, is_write ? O_WRONLY : O_RDONLY, 0, true,
                                                        is_write ? "writing" : "reading"));
  if (!file.direct) {
    log_once(LogLevel::kNotice, "aio_bench.odirect",
             fmt::format("{} refuses O_DIRECT; measuring buffered I/O (page cache included)", path));
  }
  const int fd = file.fd.get();
  auto transfer = [&]() -> Status {
    return is_write ? handle->sync_pwrite(buffer_.data(), file_bytes_, fd, 0)
                    : handle->sync_pread(buffer_.data(), file_bytes_, fd, 0);
  };
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  Status status;
  const auto ramp_start = Clock::now();
  do {
    status = transfer();
  } while (status.is_ok() && seconds_since(ramp_start) < timing.ramp_s);
  std::size_t bytes = 0;
  const auto start = Clock::now();
  while (status.is_ok() && (bytes == 0 || seconds_since(start) < timing.runtime_s)) {
    status = transfer();
    bytes += file_bytes_;
  }
  const double elapsed = seconds_since(start);
  file.fd.reset();
  if (std::getenv("ZINF_AIO_BENCH_STATS") != nullptr) {
    const aio::HandleStats st = handle->stats();
    std::fprintf(stderr, "stats: requests %lu ops %lu fixed %lu bounced %lu edge %lu retries %lu\n",
                 (unsigned long)st.requests, (unsigned long)st.ops, (unsigned long)st.fixed_ops,
                 (unsigned long)st.bounced_bytes, (unsigned long)st.edge_ops, (unsigned long)st.retries);
  }
  ZINF_RETURN_IF_ERROR(status.with_context(describe(point)));
  return static_cast<double>(bytes) / elapsed / 1e9;
}

}  // namespace zinf::aio_bench
