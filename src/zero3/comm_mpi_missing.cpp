// Builds without MPI: the MPI communicator is not available, and says so.
#include "zinf/zero3/comm_mpi.h"

namespace zinf::zero3 {

bool mpi_available() { return false; }

Result<std::unique_ptr<Communicator>> make_mpi_communicator(std::chrono::seconds) {
  return Status::unsupported("this zinf was built without MPI (install libopenmpi-dev and reconfigure)");
}

}  // namespace zinf::zero3
