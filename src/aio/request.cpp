// Request completion and the tracker behind Handle::wait / wait_all / pending.
#include "aio/request.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>

#include "zinf/log.h"

namespace zinf::aio::detail {

void Request::fail(Status status) {
  std::lock_guard lock(error_mutex);
  if (error.is_ok()) error = std::move(status);
  failed.store(true, std::memory_order_release);
}

void finish_request(Request& request, RequestTracker& tracker) {
  if (request.is_write && request.fdatasync && !request.failed.load(std::memory_order_acquire)) {
    int rc = 0;
    do {
      rc = ::fdatasync(request.fd);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) request.fail(Status::io_error("fdatasync", request.path, request.offset, request.nbytes, errno));
  }
  // Close errors matter only for writes: they can carry a delayed write-back failure.
  for (UniqueFd* fd : {&request.edge_fd, &request.owned_fd}) {
    const int err = fd->close_checked();
    if (err != 0 && request.is_write) {
      request.fail(Status::io_error("close after pwrite", request.path, request.offset, request.nbytes, err));
    }
  }
  tracker.complete(request);
}

Request* RequestTracker::add(std::unique_ptr<Request> request, bool claimed) {
  std::lock_guard lock(mutex_);
  Request* raw = request.get();
  raw->id = next_id_++;
  raw->claimed = claimed;
  raw->deadline = std::chrono::steady_clock::now() + timeout_;
  requests_.emplace(raw->id, std::move(request));
  if (!claimed) ++unclaimed_;
  ++running_;
  return raw;
}

void RequestTracker::complete(Request& request) {
  {
    std::lock_guard lock(mutex_);
    request.done = true;
    --running_;
    ++finished_;
  }
  // The request may be freed by a waiter from here on; only the tracker's own members are used.
  done_cv_.notify_all();
}

Status RequestTracker::wait(RequestId id) {
  std::unique_lock lock(mutex_);
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second->claimed) {
    return Status::invalid_argument(
        fmt::format("aio wait: request {} is unknown or was already waited for", id));
  }
  it->second->claimed = true;
  --unclaimed_;
  return take(lock, id);
}

Status RequestTracker::wait_claimed(RequestId id) {
  std::unique_lock lock(mutex_);
  return take(lock, id);
}

Status RequestTracker::take(std::unique_lock<std::mutex>& lock, RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return Status::internal(fmt::format("aio: request {} vanished", id));
  Request& request = *it->second;
  wait_done(lock, request);
  Status status;
  {
    std::lock_guard error_lock(request.error_mutex);
    status = std::move(request.error);
  }
  requests_.erase(id);
  return status;
}

Status RequestTracker::wait_all(std::size_t* completed) {
  std::unique_lock lock(mutex_);
  std::vector<Request*> mine;
  mine.reserve(unclaimed_);
  for (auto& [id, request] : requests_) {
    if (request->claimed) continue;
    request->claimed = true;
    mine.push_back(request.get());
  }
  unclaimed_ -= mine.size();
  std::sort(mine.begin(), mine.end(), [](const Request* a, const Request* b) { return a->id < b->id; });
  for (Request* request : mine) wait_done(lock, *request);
  Status first;
  for (Request* request : mine) {
    {
      std::lock_guard error_lock(request->error_mutex);
      if (first.is_ok() && !request->error.is_ok()) first = request->error;
    }
    requests_.erase(request->id);
  }
  if (completed != nullptr) *completed = mine.size();
  return first;
}

void RequestTracker::wait_done(std::unique_lock<std::mutex>& lock, Request& request) {
  if (done_cv_.wait_until(lock, request.deadline, [&] { return request.done; })) return;
  expire(request);
  done_cv_.wait(lock, [&] { return request.done; });
}

void RequestTracker::expire(Request& request) {
  if (request.expired) return;
  request.expired = true;
  const double limit = std::chrono::duration<double>(timeout_).count();
  Status stuck(ErrorCode::kIoError,
               fmt::format("{} {} offset {} length {}: not finished {} s after submission (aio.request_timeout_s); "
                           "the request was failed, and the chunks it had in flight were cancelled or waited for",
                           request.op_name(), request.path, request.offset, request.nbytes, limit),
               ETIMEDOUT);
  log(LogLevel::kWarning,
      fmt::format("aio: {} {} offset {} length {} not finished {} s after submission (aio.request_timeout_s): "
                  "failing it; cancelling its chunks in flight and waiting for them before its buffer is given back",
                  request.op_name(), request.path, request.offset, request.nbytes, limit));
  // Workers stop issuing its chunks and cancel those in the kernel, which must still come back
  // (or their queue be torn down, Worker::check_in_flight) before the caller may reuse the
  // buffer, so the wait goes on for them.
  request.fail(std::move(stuck));
}

void RequestTracker::expire_late(Request& request) {
  std::lock_guard lock(mutex_);
  if (!request.done) expire(request);
}

std::size_t RequestTracker::pending() const {
  std::lock_guard lock(mutex_);
  return unclaimed_;
}

std::uint64_t RequestTracker::finished() const {
  std::lock_guard lock(mutex_);
  return finished_;
}

void RequestTracker::drain() {
  std::unique_lock lock(mutex_);
  // Requests nobody waits for get their deadlines too: the earliest unfinished one is failed
  // when it passes, and its chunks in flight drain.
  while (running_ > 0) {
    RequestId late = 0;
    auto earliest = std::chrono::steady_clock::time_point::max();
    for (const auto& [id, r] : requests_) {
      if (!r->done && !r->expired && r->deadline < earliest) {
        earliest = r->deadline;
        late = id;
      }
    }
    if (late == 0) {
      done_cv_.wait(lock, [&] { return running_ == 0; });
      break;
    }
    if (done_cv_.wait_until(lock, earliest, [&] { return running_ == 0; })) break;
    auto it = requests_.find(late);
    if (it != requests_.end() && !it->second->done) expire(*it->second);
  }
}

}  // namespace zinf::aio::detail
