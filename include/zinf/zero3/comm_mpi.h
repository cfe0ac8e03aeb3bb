// The MPI communicator (built when OpenMPI is found): collectives across processes started by mpirun.
#pragma once

#include <chrono>
#include <memory>

#include "zinf/status.h"
#include "zinf/zero3/comm.h"

namespace zinf::zero3 {

// Whether this build has MPI.
bool mpi_available();

// Initialises MPI (thread level FUNNELED) unless the process already did, and returns a
// communicator over MPI_COMM_WORLD; MPI is finalised when the last one it initialised goes.
// Every collective waits at most `timeout` for the other ranks and then fails with an Aborted
// error naming the collective, so a dead or diverging rank turns into an error, not a hang.
// Reductions are done locally in rank order (all-to-all / all-gather, then a fixed-order sum):
// the same inputs give the same bits on every run, whatever MPI's own reduction order.
Result<std::unique_ptr<Communicator>> make_mpi_communicator(std::chrono::seconds timeout = std::chrono::seconds(300));

}  // namespace zinf::zero3
