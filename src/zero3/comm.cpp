// The collectives every communicator has, built on its primitives.
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "zinf/zero3/comm.h"

namespace zinf::zero3 {

Status Communicator::all_gather_u64(std::span<const std::uint64_t> send, std::span<std::uint64_t> recv) {
  const auto world = static_cast<std::size_t>(world_size());
  if (recv.size() != send.size() * world) {
    return Status::internal(fmt::format("all_gather_u64: {} values where {} were expected (world size {})", recv.size(),
                                        send.size() * world, world));
  }
  return all_gather_bytes(std::as_bytes(send), std::as_writable_bytes(recv));
}

Status Communicator::all_reduce_sum_u64(std::span<std::uint64_t> data) {
  const auto world = static_cast<std::size_t>(world_size());
  if (world == 1) return Status::ok();
  std::vector<std::uint64_t> all(data.size() * world);
  ZINF_RETURN_IF_ERROR(all_gather_u64(data, all));
  for (std::size_t i = 0; i < data.size(); ++i) {
    std::uint64_t sum = 0;
    for (std::size_t r = 0; r < world; ++r) sum += all[r * data.size() + i];
    data[i] = sum;
  }
  return Status::ok();
}

}  // namespace zinf::zero3
