// The communicator the ZeRO-3 engine runs on: collectives over W ranks (local, MPI, NCCL).
//
// All buffers are host memory and contiguous: fp32 tensors, doubles for all_reduce_sum, bytes
// and 64-bit integers (exact, for sizes, checksums and codes). Every rank calls the same
// collectives in the same order; a rank that fails or disagrees must turn into an error on
// every rank, not a hang (implementations bound their waits).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "zinf/status.h"

namespace zinf::zero3 {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string name() const = 0;  // "local", "mpi", "nccl"
  // This rank among the ranks on its node (0 .. local_size() - 1): node-local checkpoint
  // storage (one writer per node) and the GPU a rank uses.
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;

  // recv (W * send.size() elements) = every rank's send, in rank order. recv may be used in
  // place: send may alias recv[rank * n, (rank + 1) * n).
  virtual Status all_gather(std::span<const float> send, std::span<float> recv) = 0;
  // recv (n elements) = sum over ranks of send[rank * n, (rank + 1) * n), where send has W * n
  // elements; summed in rank order, so every run gives the same bits.
  virtual Status reduce_scatter(std::span<const float> send, std::span<float> recv) = 0;
  // data = elementwise sum over ranks (rank order).
  virtual Status all_reduce_sum(std::span<double> data) = 0;
  // recv (W * send.size() bytes) = every rank's send, in rank order. send and recv must not overlap.
  virtual Status all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv) = 0;
  // data = root's data.
  virtual Status broadcast(std::span<std::byte> data, int root) = 0;
  virtual Status barrier() = 0;

  // Ends every rank of the job now, with `exit_code`: a tool calls it after a fatal error so
  // that the other ranks stop at once instead of at their collective deadline. Library code
  // never calls it. World size 1: returns (the caller exits as it would anyway).
  virtual void abort(int exit_code) noexcept = 0;

  // Built on all_gather_bytes, so every implementation has them. Exact: no value passes
  // through a double.
  // recv (W * send.size() values) = every rank's send, in rank order.
  Status all_gather_u64(std::span<const std::uint64_t> send, std::span<std::uint64_t> recv);
  // data = elementwise sum over ranks, modulo 2^64.
  Status all_reduce_sum_u64(std::span<std::uint64_t> data);
};

// World size 1: every collective is a copy (or nothing).
std::unique_ptr<Communicator> make_local_communicator();

}  // namespace zinf::zero3
