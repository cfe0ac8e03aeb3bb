// Internal: collectives on a device::Device's memory, in order with the work of one of its
// streams: what the device gather target (device_gather_target.h) all-gathers a module's
// parameters and reduce-scatters its gradients with when W > 1 and the model computes on the
// device's compute stream.
//
// Two implementations:
//  - NCCL (comm_nccl.cpp): ncclAllGather / ncclReduceScatter enqueued on the stream, no staging
//    through the host. NCCL sums in its own order, so at W > 1 the gradients' bits may differ from
//    the host path's rank-order sums (comm.h); they do not change from run to run on one machine
//    and NCCL configuration.
//  - host (the host device, whose memory is host memory): at the stream's point. The calling
//    thread waits until the stream has run everything enqueued on it so far, then runs the
//    communicator's host collective on the block. A host communicator may be MPI, which only the
//    thread that drives the passes may call (MPI_THREAD_FUNNELED), so the collective does not run
//    on the stream's thread. The sums are the host path's rank-order sums: the same bits.
//
// Contract, for both:
//  - every rank calls the same collectives in the same order (the coordinator's order, which its
//    trace check holds the ranks to);
//  - the result is visible to work enqueued on `role` after the call (and to other streams
//    through an event recorded on `role` after it);
//  - before a host collective of the same communicator (Communicator's methods), finish() the
//    device ones: NCCL does not promise that two collectives of one communicator make progress at
//    once, so one still queued on the device could wait forever for a rank that waits in the host
//    one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "device/device.h"
#include "zinf/status.h"
#include "zinf/zero3/comm.h"

namespace zinf::zero3 {

class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  // "NCCL on GPU 0" or "host collectives (mpi) at the stream's point".
  virtual std::string describe() const = 0;
  // block (W * n floats of device memory): every rank's slice [r * n, (r + 1) * n) of its block,
  // in place, after the work enqueued on `role` so far.
  virtual Status all_gather(device::StreamRole role, float* block, std::size_t n) = 0;
  // The same for 16-bit values (a bf16 run's gathered values: moved, never summed).
  virtual Status all_gather16(device::StreamRole role, std::uint16_t* block, std::size_t n) = 0;
  // block (W * n floats): its slice [rank * n, (rank + 1) * n) becomes the sum over ranks of their
  // block's slice `rank`, in place; the other slices are undefined after.
  virtual Status reduce_scatter(device::StreamRole role, float* block, std::size_t n) = 0;
  // Returns once every collective enqueued so far has completed (bounded by the communicator's
  // timeout where it has one).
  virtual Status finish() = 0;
};

// The device collectives of `comm` on `device`: NCCL's when `comm` is an NCCL communicator and
// `device` a GPU; the host ones when `device` is host-addressable (the host device). Otherwise
// kUnsupported naming both. `device` and `comm` must outlive the result.
Result<std::unique_ptr<DeviceCollectives>> make_device_collectives(device::Device& device, Communicator& comm);

// NCCL's, or null when `comm` is not an NCCL communicator (or this build has no NCCL).
std::unique_ptr<DeviceCollectives> make_nccl_device_collectives(device::Device& device, Communicator& comm);

}  // namespace zinf::zero3
