// Internal: collectives on device memory through the NCCL communicator, enqueued on the caller's
// CUDA stream with no staging through the host. Only in builds with NCCL (comm_nccl.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "zinf/status.h"
#include "zinf/zero3/comm.h"

namespace zinf::zero3 {

// Every pointer is device memory of device() and `stream` is a stream of device(). Calls return
// once the collective is enqueued; the results are ready when the stream reaches that point
// (wait_device, or an event recorded after the call). Every rank calls the same collectives in the
// same order. Before the next host-buffer collective of the same communicator (Communicator's
// methods, which run on its own stream), wait for the device ones with wait_device.
class NcclDeviceCollectives {
 public:
  virtual ~NcclDeviceCollectives() = default;
  virtual int device() const = 0;
  // recv (W * n floats) = every rank's send (n floats), in rank order. In place when
  // send == recv + rank * n.
  virtual Status all_gather_device(const float* send, float* recv, std::size_t n, cudaStream_t stream) = 0;
  // The same for 16-bit values (bf16 or fp16 bits: gathered, never summed).
  virtual Status all_gather_device16(const std::uint16_t* send, std::uint16_t* recv, std::size_t n,
                                     cudaStream_t stream) = 0;
  // recv (n floats) = sum over ranks of send[rank * n, (rank + 1) * n) (send has W * n floats).
  // ncclReduceScatter sums in NCCL's order, so at W > 1 the bits may differ from
  // Communicator::reduce_scatter's rank-order sum; at W = 1 it is an exact copy.
  virtual Status reduce_scatter_device(const float* send, float* recv, std::size_t n, cudaStream_t stream) = 0;
  // Waits until `stream` has drained, watching NCCL's asynchronous errors, at most the
  // communicator's timeout: then it aborts the communicator and fails with kAborted naming `op`.
  virtual Status wait_device(cudaStream_t stream, std::string_view op) = 0;
};

// The device collectives of `comm`, or null when it is not an NCCL communicator.
NcclDeviceCollectives* nccl_device_collectives(Communicator& comm);

}  // namespace zinf::zero3
