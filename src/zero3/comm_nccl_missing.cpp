// Builds without NCCL: the NCCL communicator is not available, and says so.
#include "zero3/device_collectives.h"
#include "zinf/zero3/comm_nccl.h"

namespace zinf::zero3 {

bool nccl_available() { return false; }

Result<std::unique_ptr<Communicator>> make_nccl_communicator(std::unique_ptr<Communicator>, std::chrono::seconds) {
  return Status::unsupported(
      "this zinf was built without NCCL (needs the CUDA toolkit with NCCL in /usr/local/cuda; reconfigure with -Dcuda=enabled)");
}

std::unique_ptr<DeviceCollectives> make_nccl_device_collectives(device::Device&, Communicator&) { return nullptr; }

}  // namespace zinf::zero3
