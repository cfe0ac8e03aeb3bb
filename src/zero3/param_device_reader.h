// Internal: reads partitions of the NVMe parameter tier into device memory, for a gather target
// that gathers on a device. With aio.use_gds and GPUDirect Storage working, the bytes go straight
// from the swap files into device memory; otherwise through pinned host memory and the device's
// H2D stream (the bounce path), and, when use_gds asked for the direct path, one notice says why
// not: a build without the GPU layer, no GPU, no libcufile (or its driver not opening), or the
// driver refusing to register a swap file, with its error.
//
// Both paths give the same bytes: the partition as stored, in the tier's dtype, unconverted.
// The direct path does not check the swap store's page checksums (the bytes never pass through
// host memory); the bounce path does, as every store read. Partitions resident in the CPU tier
// (offload_param.max_in_cpu) are copied from host memory on either path.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device/device.h"
#include "device/direct_storage.h"
#include "zero3/tiers.h"
#include "zinf/config/ds_config.h"
#include "zinf/aio/pinned.h"
#include "zinf/status.h"
#include "zinf/swap/partition_layout.h"

namespace zinf::zero3 {

// What decides the path: ds_config's aio.use_gds, and how this build opens GPUDirect Storage
// (gpu::open_gds_storage where the build has the GPU layer; empty where it has none).
struct DirectPathRequest {
  bool use_gds = false;
  std::function<Result<std::shared_ptr<device::DirectStorage>>()> open_storage;
};

class ParamDeviceReader {
 public:
  // `tier` must be an nvme tier (ParamTier::nvme_swapper()); layout, tier and device must
  // outlive the reader. Fails only for a tier that is not on NVMe or for a bounce path that
  // cannot be set up: every reason the direct path is not taken is a notice, not an error.
  static Result<std::unique_ptr<ParamDeviceReader>> create(const swap::PartitionLayout& layout, ParamTier& tier,
                                                           device::Device& device, const DirectPathRequest& request);

  // Whether partitions in the store come straight from the files (GPUDirect Storage).
  bool direct() const { return !files_.empty(); }
  // "GPUDirect Storage (libcufile.so.0)" or "pinned host memory and H2D copies".
  std::string describe() const;
  // Why use_gds did not give the direct path ("" when it did, or was not asked for).
  const std::string& why_bounce() const { return why_bounce_; }

  // Bytes of partition p: layout.params[p].numel elements of the tier's dtype.
  std::uint64_t partition_bytes(std::size_t p) const;
  // Reads partition p into device memory at `device_dst` (room for partition_bytes(p), any
  // alignment) and returns once the bytes are there. No stream may use that range meanwhile;
  // after the return it may be used on any stream (the bounce path's copies are synchronized).
  // Reads see the partition's last completed write: the optimizer step's writes of it must be
  // finished (the step waits for them before it returns). Errors name the partition and, on the
  // direct path, the file and offset. Thread-safe; reads run one at a time (a registered file is
  // not for concurrent use, and the bounce path has one pair of staging buffers).
  Status read(std::size_t p, void* device_dst);

  // Bytes moved by each path so far (partitions served from the CPU tier count as bounced).
  std::uint64_t bytes_direct() const { return bytes_direct_.load(std::memory_order_relaxed); }
  std::uint64_t bytes_bounced() const { return bytes_bounced_.load(std::memory_order_relaxed); }

 private:
  ParamDeviceReader(const swap::PartitionLayout& layout, swap::ParamSwapper& swapper, device::Device& device)
      : layout_(layout), swapper_(swapper), device_(device) {}
  // The bounce path's staging: large enough that an H2D copy runs at the link's rate, small
  // enough that the pair costs little pinned memory.
  static constexpr std::size_t kStagingBytes = std::size_t{8} << 20;
  struct Staging {
    aio::PinnedBuffer buffer;
    device::Event uploaded;  // after the last copy from buffer
  };
  Status allocate_staging();
  // Opens every data file of the store for direct reads; on failure the reason, files_ empty.
  std::string open_direct(const DirectPathRequest& request);
  Status read_direct(const std::string& key, std::uint64_t nbytes, std::byte* dst);
  Status read_bounced(const std::string& key, std::byte* dst);

  const swap::PartitionLayout& layout_;
  swap::ParamSwapper& swapper_;
  device::Device& device_;
  std::shared_ptr<device::DirectStorage> storage_;
  std::vector<std::unique_ptr<device::DirectFile>> files_;  // per store data file; empty: bounce
  std::mutex mutex_;  // one read at a time
  Staging staging_[2];
  int next_staging_ = 0;
  std::string why_bounce_;
  std::atomic<std::uint64_t> bytes_direct_{0};
  std::atomic<std::uint64_t> bytes_bounced_{0};
};

// The gather targets make_tiers builds do not read through a ParamDeviceReader yet (the host
// target has no device memory to fill; the device target stages NVMe reads in host memory): with
// aio.use_gds and offload_param.device nvme, one notice per reason and process says why the
// partitions move through pinned host memory. `device`: the gather target's device, or null for
// host memory. make_tiers calls it.
void note_use_gds_not_served(const config::DsConfig& ds, const device::Device* device);

}  // namespace zinf::zero3
