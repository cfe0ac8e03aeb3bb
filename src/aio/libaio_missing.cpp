// libaio entry points for builds without libaio: the backend is reported unavailable.
#include "aio/backend.h"

namespace zinf::aio::detail {

Result<std::unique_ptr<BackendQueue>> make_libaio_queue(std::size_t) {
  return Status::unsupported("aio.backend = libaio: this zinf was built without libaio");
}

bool probe_libaio(std::string* why) {
  if (why != nullptr) *why = "this zinf was built without libaio";
  return false;
}

}  // namespace zinf::aio::detail
