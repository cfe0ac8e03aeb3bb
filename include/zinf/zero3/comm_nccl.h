// The NCCL communicator (built when CUDA and NCCL are found): collectives on GPUs, bootstrapped
// over another communicator (MPI under mpirun, local for one rank).
#pragma once

#include <chrono>
#include <memory>

#include "zinf/status.h"
#include "zinf/zero3/comm.h"

namespace zinf::zero3 {

// Whether this build has NCCL.
bool nccl_available();

// Creates an NCCL communicator over the same ranks as `bootstrap`, which it keeps: rank 0's
// ncclUniqueId is broadcast over it, and it serves barrier() and the node-local rank. Each rank
// uses GPU local_rank() % device count. The engine's buffers are host memory: they are staged
// through device buffers on one stream. Collectives on device buffers, without staging, are in
// the internal header zero3/comm_nccl_device.h (nccl_device_collectives()). Every collective waits at most `timeout` and then aborts
// the NCCL communicator and fails with an Aborted error naming the collective.
Result<std::unique_ptr<Communicator>> make_nccl_communicator(std::unique_ptr<Communicator> bootstrap,
                                                             std::chrono::seconds timeout = std::chrono::seconds(300));

}  // namespace zinf::zero3
