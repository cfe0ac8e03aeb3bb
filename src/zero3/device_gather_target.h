// Internal: the gather target of a device-resident engine: the coordinator's per-module memory
// (gathered parameters and their gradients) is device memory of a device::Device, filled and
// drained through its copy streams.
//
// A gather reads this rank's slice from the parameter tier into a pinned staging buffer (the
// host thread: a memory tier's copy, or an NVMe tier's staged read), enqueues its upload on the
// H2D stream and returns; ready() makes the values usable by the model. With W > 1 the slice
// is all-gathered in place once it has landed (on the host device through the communicator's
// host collective, which runs on the thread that drives the passes, so every rank issues its
// collectives in one order). Because gather() returns before the copy lands, the coordinator
// starts the next module's gathers while this one computes.
//
// A completed gradient is downloaded on the D2H stream into pinned memory (start_download); the
// coordinator adds it into the rank's gradient partition once the download has landed
// (finish_download), while backward goes on.
//
// Who computes (DeviceGatherOptions::consumer):
//  - kHostThread: the model runs on the thread that drives the passes (a CPU model on the host
//    device, whose device memory is host memory). ready() blocks that thread until the upload
//    has landed, zero() writes on the host, and a block the model has released needs no fence.
//  - kComputeStream: the model's kernels run on the device's compute stream (a GPU model,
//    model::Model::compute_device()). ready() makes the compute stream wait for the upload (the
//    host goes on), zero() is enqueued there, and every copy into or out of a block first waits
//    for the compute work enqueued so far: a reused block may still be read, and a gradient still
//    written, by kernels the model enqueued before release() or grads_ready(). With W > 1 the
//    host collectives cannot read device memory: the collectives are DeviceGatherOptions::
//    collectives (device_collectives.h), all on the D2H stream. A gather's all-gather waits there
//    for its upload; a gradient is reduce-scattered there after the compute work enqueued so far,
//    and its rank's slice downloaded after that, in the stream's order. One stream for every
//    collective gives each rank the same order of NCCL operations on the GPU, which NCCL needs
//    (two collectives of one communicator on two streams may wait for each other).
// Invariants (each one has a test that breaks when it is removed, under random delays):
//  - a staging buffer is reused only after the upload that reads it has completed;
//  - a block's values are handed to the model only after its upload (and all-gather) completed;
//  - a device all-gather starts after this rank's slice has landed, and a device reduce-scatter
//    after the kernels that wrote the gradient;
//  - a gradient is read on the host only after its download has completed, and its block goes
//    back to the allocator fenced by the D2H stream;
//  - device bytes never exceed the device's cap (the allocator refuses), and the coordinator
//    keeps gathered elements within stage3_max_live_parameters.
#pragma once

#include <cstdint>
#include <memory>

#include "device/device.h"
#include "zero3/device_collectives.h"
#include "zero3/gather_target.h"

namespace zinf::zero3 {

struct DeviceGatherOptions {
  enum class Consumer { kHostThread, kComputeStream };
  Consumer consumer = Consumer::kHostThread;
  // Staging buffers for uploads and downloads in flight at once (each the size of the largest
  // slice it carried so far). More in flight waits for the oldest; the coordinator keeps at most
  // one fewer gradient downloads in flight (max_downloads_in_flight), so uploads find one free.
  std::size_t staging_buffers = 4;
  // The gathered values' element type. kBF16 (kComputeStream): a bf16 run's values in
  // the GPU model's compute dtype, handed out by the coordinator's acquire_bf16 (acquire refuses):
  // half the device memory and upload bytes of fp32, and neither a widening on the device nor the
  // model's cast back. A memory tier's pinned bf16 partition goes up as it is; other values are
  // rounded to bf16 on the host (optim::f32_to_bf16_bits, what the model's cast would give).
  swap::DType values = swap::DType::kF32;
  // W > 1 with kComputeStream: the collectives on the device's memory (must outlive the target).
  // Unused with kHostThread, whose all-gathers and reduce-scatters are the communicator's own, on
  // the driving thread.
  std::shared_ptr<DeviceCollectives> collectives = nullptr;
  // Test hook: leave out one wait so that the tests can show they catch it. Never set elsewhere.
  enum class SkipWait {
    kNone,
    kUploadBeforeUse,
    kStagingReuse,
    kDownloadBeforeRead,
    kComputeBeforeCopy,
    kUploadBeforeCollective
  };
  SkipWait skip_wait = SkipWait::kNone;
};

// What moved through the device, for the step breakdown (cumulative).
struct DeviceGatherStats {
  std::uint64_t h2d_bytes = 0;
  std::uint64_t d2h_bytes = 0;
  std::uint64_t uploads = 0;
  std::uint64_t downloads = 0;
  double ready_wait_s = 0;     // the driving thread blocked in ready(): compute waiting for uploads
  double download_wait_s = 0;  // ... blocked in finish_download(wait = true)
  double staging_wait_s = 0;   // ... blocked for a staging buffer still in flight
  std::uint64_t staging_bytes = 0;  // pinned staging held
  std::uint64_t all_gathers = 0;     // device collectives enqueued (W > 1, compute-stream consumer)
  std::uint64_t reduce_scatters = 0;
};

class DeviceGatherTarget : public GatherTarget {
 public:
  virtual const DeviceGatherStats& device_stats() const = 0;
  virtual device::Device& device() const = 0;
};

// `device` must outlive the target. kHostThread needs a host-addressable device (the host device);
// values other than fp32 need kComputeStream.
Result<std::unique_ptr<DeviceGatherTarget>> make_device_gather_target(device::Device& device,
                                                                      DeviceGatherOptions options = {});

}  // namespace zinf::zero3
