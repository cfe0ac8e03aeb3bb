// Handle: validates requests, opens files, splits requests into per-worker tasks, tracks waits.
#include <fcntl.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <limits>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "aio/backend.h"
#include "aio/file.h"
#include "aio/request.h"
#include "aio/worker.h"
#include "zinf/aio/handle.h"
#include "zinf/log.h"

namespace zinf::aio {
namespace {

using detail::Request;
using detail::Task;

constexpr std::uint64_t kAlign = 4096;

// Cuts [offset, offset+nbytes) into at most `parallelism` slices whose inner boundaries are
// aligned file offsets; no divisibility rule, small requests get fewer slices.
std::vector<Task> make_tasks(Request& r, std::size_t parallelism) {
  std::vector<Task> tasks;
  if (r.nbytes == 0) return tasks;
  const std::uint64_t end = r.offset + r.nbytes;
  const std::uint64_t slices = std::min<std::uint64_t>(parallelism, (r.nbytes + kAlign - 1) / kAlign);
  const std::uint64_t step = r.nbytes / slices;
  tasks.reserve(slices);
  std::uint64_t begin = r.offset;
  for (std::uint64_t i = 1; i <= slices; ++i) {
    std::uint64_t stop = i == slices ? end : (r.offset + step * i) & ~(kAlign - 1);
    if (stop <= begin) continue;
    tasks.push_back(Task{&r, begin, stop, begin, 0});
    begin = stop;
  }
  return tasks;
}

// aio.request_timeout_s as a duration (capped at 30 years, so deadlines cannot overflow).
std::chrono::nanoseconds request_timeout(const AioConfig& config) {
  const double seconds = std::min(config.request_timeout_s, 1e9);
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(seconds));
}

class HandleImpl final : public Handle {
 public:
  HandleImpl(const AioConfig& config, Backend backend)
      : config_(config), backend_(backend), tracker_(request_timeout(config)) {}

  ~HandleImpl() override {
    // Never leave I/O in flight on caller buffers: every request completes, then workers stop.
    tracker_.drain();
    for (auto& worker : workers_) worker->request_stop();
    workers_.clear();
  }

  Status start() {
    for (std::size_t i = 0; i < config_.intra_op_parallelism; ++i) {
      auto queue = detail::make_backend_queue(backend_, config_.queue_depth, config_.faults);
      if (!queue.is_ok()) {
        return queue.status().with_context(
            fmt::format("aio.backend = {}: creating the queue of worker {}", backend_name(backend_), i));
      }
      workers_.push_back(std::make_unique<detail::Worker>(i, config_, backend_, tracker_, std::move(queue).value()));
    }
    for (auto& worker : workers_) worker->start();
    return Status::ok();
  }

  Backend backend() const override { return backend_; }
  const AioConfig& config() const override { return config_; }

  Status register_buffer(void* base, std::size_t bytes) override;
  Status unregister_buffers() override;

  Status sync_pread(void* buffer, std::size_t nbytes, const std::string& path, std::uint64_t offset) override {
    return run_sync(submit_path(false, buffer, nbytes, path, offset, {}, true));
  }
  Status sync_pwrite(const void* buffer, std::size_t nbytes, const std::string& path, std::uint64_t offset,
                     WriteOptions options) override {
    return run_sync(submit_path(true, buffer, nbytes, path, offset, options, true));
  }
  Status sync_pread(void* buffer, std::size_t nbytes, int fd, std::uint64_t offset) override {
    return run_sync(submit_fd(false, buffer, nbytes, fd, offset, true));
  }
  Status sync_pwrite(const void* buffer, std::size_t nbytes, int fd, std::uint64_t offset) override {
    return run_sync(submit_fd(true, buffer, nbytes, fd, offset, true));
  }

  Result<RequestId> async_pread(void* buffer, std::size_t nbytes, const std::string& path,
                                std::uint64_t offset) override {
    return submit_path(false, buffer, nbytes, path, offset, {}, false);
  }
  Result<RequestId> async_pwrite(const void* buffer, std::size_t nbytes, const std::string& path,
                                 std::uint64_t offset, WriteOptions options) override {
    return submit_path(true, buffer, nbytes, path, offset, options, false);
  }
  Result<RequestId> async_pread(void* buffer, std::size_t nbytes, int fd, std::uint64_t offset) override {
    return submit_fd(false, buffer, nbytes, fd, offset, false);
  }
  Result<RequestId> async_pwrite(const void* buffer, std::size_t nbytes, int fd, std::uint64_t offset) override {
    return submit_fd(true, buffer, nbytes, fd, offset, false);
  }

  Status wait(RequestId id) override { return tracker_.wait(id); }
  Status wait_all(std::size_t* completed) override { return tracker_.wait_all(completed); }
  std::size_t pending() const override { return tracker_.pending(); }
  HandleStats stats() const override {
    HandleStats stats;
    stats.requests = tracker_.finished();
    for (const auto& worker : workers_) worker->add_stats(stats);
    return stats;
  }

 private:
  Status run_sync(Result<RequestId> id) {
    if (!id.is_ok()) return id.status();
    return tracker_.wait_claimed(id.value());
  }

  static Status check_extent(const void* buffer, std::size_t nbytes, std::uint64_t offset, std::string_view what) {
    if (buffer == nullptr && nbytes > 0) {
      return Status::invalid_argument(fmt::format("aio {}: null buffer for {} bytes", what, nbytes));
    }
    constexpr auto kMaxOffset = static_cast<std::uint64_t>(std::numeric_limits<off_t>::max());
    if (offset > kMaxOffset || nbytes > kMaxOffset - offset) {
      return Status::invalid_argument(
          fmt::format("aio {}: offset {} + length {} exceeds the largest file offset", what, offset, nbytes));
    }
    return Status::ok();
  }

  Result<RequestId> submit_path(bool is_write, const void* buffer, std::size_t nbytes, const std::string& path,
                                std::uint64_t offset, WriteOptions options, bool sync);
  Result<RequestId> submit_fd(bool is_write, const void* buffer, std::size_t nbytes, int fd,
                              std::uint64_t offset, bool sync);
  Result<RequestId> submit(std::unique_ptr<Request> request, bool sync);
  Status apply_fixed_locked();

  const AioConfig config_;
  const Backend backend_;
  // Declared before workers_: workers report to it until they are joined.
  detail::RequestTracker tracker_;
  std::vector<std::unique_ptr<detail::Worker>> workers_;
  std::atomic<std::size_t> next_worker_{0};
  std::mutex fixed_mutex_;
  std::vector<iovec> registered_;  // caller's ranges, as given
};

Result<RequestId> HandleImpl::submit_path(bool is_write, const void* buffer, std::size_t nbytes,
                                          const std::string& path, std::uint64_t offset, WriteOptions options,
                                          bool sync) {
  const char* op = is_write ? "pwrite" : "pread";
  ZINF_RETURN_IF_ERROR(check_extent(buffer, nbytes, offset, op));
  if (path.empty()) return Status::invalid_argument(fmt::format("aio {}: empty path", op));
  ZINF_ASSIGN_OR_RETURN(detail::OpenedFile file,
                        detail::open_for_request(path, is_write, options.truncate, config_.use_direct_io));
  auto r = std::make_unique<Request>();
  r->is_write = is_write;
  r->buffer = static_cast<std::byte*>(const_cast<void*>(buffer));
  r->nbytes = nbytes;
  r->offset = offset;
  r->path = path;
  r->fd = file.fd.get();
  r->direct = file.direct;
  r->owned_fd = std::move(file.fd);
  r->fdatasync = is_write && options.fdatasync;
  return submit(std::move(r), sync);
}

Result<RequestId> HandleImpl::submit_fd(bool is_write, const void* buffer, std::size_t nbytes, int fd,
                                        std::uint64_t offset, bool sync) {
  const char* op = is_write ? "pwrite" : "pread";
  ZINF_RETURN_IF_ERROR(check_extent(buffer, nbytes, offset, op));
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) return Status::sys_error(fmt::format("aio {}: fd {}", op, fd), errno);
  if (is_write && (flags & O_APPEND) != 0) {
    return Status::invalid_argument(
        fmt::format("aio pwrite: fd {} is open with O_APPEND, which ignores write offsets", fd));
  }
  auto r = std::make_unique<Request>();
  r->is_write = is_write;
  r->buffer = static_cast<std::byte*>(const_cast<void*>(buffer));
  r->nbytes = nbytes;
  r->offset = offset;
  r->path = fmt::format("fd:{}", fd);
  r->fd = fd;
  r->direct = (flags & O_DIRECT) != 0;
  return submit(std::move(r), sync);
}

Result<RequestId> HandleImpl::submit(std::unique_ptr<Request> r, bool sync) {
  const bool unaligned_ends = r->offset % kAlign != 0 || (r->offset + r->nbytes) % kAlign != 0;
  if (r->direct && r->nbytes > 0 && unaligned_ends) {
    const std::string by_path = r->owned_fd.valid() ? r->path : std::string();
    ZINF_ASSIGN_OR_RETURN(r->edge_fd, detail::open_buffered_twin(by_path, r->fd, r->is_write));
  }
  r->tasks = make_tasks(*r, workers_.size());
  r->tasks_left.store(r->tasks.size(), std::memory_order_relaxed);
  Request* raw = tracker_.add(std::move(r), sync);
  const RequestId id = raw->id;
  if (raw->tasks.empty()) {
    detail::finish_request(*raw, tracker_);
    return id;
  }
  const std::size_t first = next_worker_.fetch_add(raw->tasks.size(), std::memory_order_relaxed);
  const std::size_t count = raw->tasks.size();
  // After the last post the request may finish and be freed: read nothing from it afterwards.
  for (std::size_t i = 0; i < count; ++i) {
    workers_[(first + i) % workers_.size()]->post(&raw->tasks[i]);
  }
  return id;
}

Status HandleImpl::register_buffer(void* base, std::size_t bytes) {
  if (base == nullptr || bytes == 0) {
    return Status::invalid_argument(fmt::format("aio register_buffer: empty range ({} bytes at {})", bytes, base));
  }
  std::lock_guard lock(fixed_mutex_);
  const auto* lo = static_cast<const std::byte*>(base);
  for (const iovec& range : registered_) {
    const auto* r_lo = static_cast<const std::byte*>(range.iov_base);
    if (lo < r_lo + range.iov_len && r_lo < lo + bytes) {
      return Status::invalid_argument(fmt::format("aio register_buffer: [{}, +{}) overlaps a registered range [{}, +{})",
                                                  base, bytes, range.iov_base, range.iov_len));
    }
  }
  registered_.push_back(iovec{base, bytes});
  return apply_fixed_locked();
}

Status HandleImpl::unregister_buffers() {
  std::lock_guard lock(fixed_mutex_);
  registered_.clear();
  return apply_fixed_locked();
}

Status HandleImpl::apply_fixed_locked() {
  if (!workers_.front()->supports_fixed_buffers()) return Status::ok();  // accepted and ignored
  // io_uring takes at most 1 GiB per registered entry: cut larger ranges into entries.
  std::vector<iovec> entries;
  std::size_t total = 0;
  for (const iovec& range : registered_) {
    auto* p = static_cast<std::byte*>(range.iov_base);
    for (std::size_t done = 0; done < range.iov_len; done += detail::kMaxFixedEntryBytes) {
      entries.push_back(iovec{p + done, std::min(detail::kMaxFixedEntryBytes, range.iov_len - done)});
    }
    total += range.iov_len;
  }
  for (auto& worker : workers_) {
    std::string why;
    if (!worker->set_fixed_buffers(entries, &why) && !entries.empty()) {
      log_once(LogLevel::kNotice, "aio.fixed_buffers",
               fmt::format("io_uring refused to register {} bytes of fixed buffers ({}); reads and writes "
                           "of those buffers use unfixed operations",
                           total, why));
    }
  }
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Handle>> Handle::create(const AioConfig& config) {
  ZINF_RETURN_IF_ERROR(config.validate());
  const Backend backend = config.backend == Backend::kAuto ? resolve_auto_backend() : config.backend;
  ZINF_RETURN_IF_ERROR(detail::check_backend(backend));
  auto handle = std::make_unique<HandleImpl>(config, backend);
  ZINF_RETURN_IF_ERROR(handle->start());
  return std::unique_ptr<Handle>(std::move(handle));
}

}  // namespace zinf::aio
