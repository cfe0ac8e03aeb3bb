// io_uring entry points for builds without liburing: the backend is reported unavailable.
#include "aio/backend.h"

namespace zinf::aio::detail {

Result<std::unique_ptr<BackendQueue>> make_uring_queue(std::size_t) {
  return Status::unsupported("aio.backend = io_uring: this zinf was built without liburing");
}

bool probe_uring(std::string* why) {
  if (why != nullptr) *why = "this zinf was built without liburing";
  return false;
}

}  // namespace zinf::aio::detail
