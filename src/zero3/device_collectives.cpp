// Device collectives: the factory, and the host device's (device_collectives.h).
#include "zero3/device_collectives.h"

#include <cstring>
#include <span>
#include <vector>

#include <fmt/format.h>

namespace zinf::zero3 {
namespace {

// At the stream's point, on the calling thread: wait for what `role` has queued, then the host
// collective on the block (host memory on a host-addressable device).
class HostDeviceCollectives final : public DeviceCollectives {
 public:
  HostDeviceCollectives(device::Device& device, Communicator& comm) : device_(device), comm_(comm) {}

  std::string describe() const override { return fmt::format("host collectives ({}) at the stream's point", comm_.name()); }

  Status all_gather(device::StreamRole role, float* block, std::size_t n) override {
    ZINF_RETURN_IF_ERROR(reach(role));
    const float* mine = block + n * rank();
    return comm_.all_gather(std::span<const float>(mine, n), std::span<float>(block, n * world()))
        .with_context("device all-gather on the host device");
  }

  // all_gather_bytes may not send from its own output: this rank's slice goes through a copy.
  Status all_gather16(device::StreamRole role, std::uint16_t* block, std::size_t n) override {
    ZINF_RETURN_IF_ERROR(reach(role));
    mine16_.assign(block + n * rank(), block + n * (rank() + 1));
    return comm_.all_gather_bytes(std::as_bytes(std::span<const std::uint16_t>(mine16_)),
                                  std::as_writable_bytes(std::span<std::uint16_t>(block, n * world())))
        .with_context("device all-gather (16-bit) on the host device");
  }

  Status reduce_scatter(device::StreamRole role, float* block, std::size_t n) override {
    ZINF_RETURN_IF_ERROR(reach(role));
    sum_.resize(n);
    ZINF_RETURN_IF_ERROR(comm_.reduce_scatter(std::span<const float>(block, n * world()), std::span<float>(sum_))
                             .with_context("device reduce-scatter on the host device"));
    if (n > 0) std::memcpy(block + n * rank(), sum_.data(), n * sizeof(float));
    return Status::ok();
  }

  Status finish() override { return Status::ok(); }  // each one completed before its call returned

 private:
  std::size_t rank() const { return static_cast<std::size_t>(comm_.rank()); }
  std::size_t world() const { return static_cast<std::size_t>(comm_.world_size()); }

  Status reach(device::StreamRole role) {
    ZINF_ASSIGN_OR_RETURN(device::Event here, device_.record(role));
    return device_.synchronize(here);
  }

  device::Device& device_;
  Communicator& comm_;
  std::vector<float> sum_;
  std::vector<std::uint16_t> mine16_;
};

}  // namespace

Result<std::unique_ptr<DeviceCollectives>> make_device_collectives(device::Device& device, Communicator& comm) {
  if (device.host_addressable()) return std::unique_ptr<DeviceCollectives>(new HostDeviceCollectives(device, comm));
  if (auto nccl = make_nccl_device_collectives(device, comm)) return nccl;
  return Status::unsupported(fmt::format(
      "{}: collectives on its memory need an NCCL communicator on that GPU, and this one is {} (run with --comm "
      "nccl, or gather in host memory)",
      device.describe(), comm.name()));
}

}  // namespace zinf::zero3
