// AioConfig validation, backend names, run-time backend probing and backend queue creation.
#include <array>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "aio/backend.h"
#include "zinf/aio/handle.h"
#include "zinf/log.h"

namespace zinf::aio {

namespace {

constexpr std::size_t kAlignment = 4096;
constexpr std::size_t kMaxBlockSize = std::size_t{1} << 30;  // one io_uring/libaio op stays < 2 GiB
constexpr std::size_t kMaxQueueDepth = 1024;
constexpr std::size_t kMaxParallelism = 64;

struct Probe {
  bool ok = false;
  std::string why;
};

const Probe& probe(Backend backend) {
  static const Probe uring = [] {
    Probe p;
    p.ok = detail::probe_uring(&p.why);
    return p;
  }();
  static const Probe libaio = [] {
    Probe p;
    p.ok = detail::probe_libaio(&p.why);
    return p;
  }();
  static const Probe always{true, {}};
  switch (backend) {
    case Backend::kIoUring: return uring;
    case Backend::kLibaio: return libaio;
    case Backend::kThreads:
    case Backend::kAuto: return always;
  }
  return always;
}

}  // namespace

std::size_t Handle::alignment() { return kAlignment; }

std::string_view backend_name(Backend backend) {
  switch (backend) {
    case Backend::kAuto: return "auto";
    case Backend::kIoUring: return "io_uring";
    case Backend::kLibaio: return "libaio";
    case Backend::kThreads: return "threads";
  }
  return "unknown";
}

Result<Backend> parse_backend(std::string_view name) {
  constexpr std::array kAll{Backend::kAuto, Backend::kIoUring, Backend::kLibaio, Backend::kThreads};
  for (Backend b : kAll) {
    if (backend_name(b) == name) return b;
  }
  return Status::invalid_argument(
      fmt::format("aio.backend = '{}': must be one of auto, io_uring, libaio, threads", name));
}

bool backend_available(Backend backend) { return probe(backend).ok; }

Backend resolve_auto_backend() {
  static const Backend chosen = [] {
    Backend b = Backend::kThreads;
    if (backend_available(Backend::kIoUring)) {
      b = Backend::kIoUring;
    } else if (backend_available(Backend::kLibaio)) {
      b = Backend::kLibaio;
    }
    std::string why;
    if (b != Backend::kIoUring) why += fmt::format("; io_uring unavailable: {}", probe(Backend::kIoUring).why);
    if (b == Backend::kThreads) why += fmt::format("; libaio unavailable: {}", probe(Backend::kLibaio).why);
    log_once(LogLevel::kInfo, "aio.backend.auto",
             fmt::format("aio.backend = auto: using {}{}", backend_name(b), why));
    return b;
  }();
  return chosen;
}

Status AioConfig::validate() const {
  if (block_size < kAlignment || block_size > kMaxBlockSize || block_size % kAlignment != 0) {
    return Status::invalid_argument(fmt::format(
        "aio.block_size = {}: must be a multiple of {} between {} and {}", block_size, kAlignment,
        kAlignment, kMaxBlockSize));
  }
  if (queue_depth < 1 || queue_depth > kMaxQueueDepth) {
    return Status::invalid_argument(
        fmt::format("aio.queue_depth = {}: must be between 1 and {}", queue_depth, kMaxQueueDepth));
  }
  if (intra_op_parallelism < 1 || intra_op_parallelism > kMaxParallelism) {
    return Status::invalid_argument(fmt::format("aio.intra_op_parallelism = {}: must be between 1 and {}",
                                                intra_op_parallelism, kMaxParallelism));
  }
  if (!(request_timeout_s > 0) || !std::isfinite(request_timeout_s)) {
    return Status::invalid_argument(
        fmt::format("aio.request_timeout_s = {}: must be a positive number of seconds", request_timeout_s));
  }
  return Status::ok();
}

namespace detail {

Result<std::unique_ptr<BackendQueue>> make_backend_queue(Backend backend, std::size_t depth,
                                                         const std::shared_ptr<FaultInjector>& faults) {
  Result<std::unique_ptr<BackendQueue>> queue = Status::internal("aio: backend not resolved");
  switch (backend) {
    case Backend::kIoUring: queue = make_uring_queue(depth); break;
    case Backend::kLibaio: queue = make_libaio_queue(depth); break;
    case Backend::kThreads: queue = make_thread_queue(depth); break;
    case Backend::kAuto: break;
  }
  if (!queue.is_ok() || !faults) return queue;
  return make_fault_queue(std::move(queue).value(), faults);
}

Status check_backend(Backend backend) {
  if (backend_available(backend)) return Status::ok();
  return Status::unsupported(fmt::format("aio.backend = {}: not available on this machine: {}",
                                         backend_name(backend), probe(backend).why));
}

}  // namespace detail

}  // namespace zinf::aio
