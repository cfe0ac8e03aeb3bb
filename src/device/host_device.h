// Internal: the host device, a Device (device.h) whose streams are threads and whose device memory
// is host memory, with injectable delays, so that the engine's device orchestration runs and is
// tested on every machine.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "device/device.h"

namespace zinf::device {

struct HostDeviceOptions {
  // Before each item, a stream sleeps a random time up to this long (0: no delays). Each stream
  // draws from its own generator seeded from `seed`, so a delay pattern is reproducible.
  std::chrono::microseconds max_delay{0};
  std::uint64_t seed = 0;
  // Fill every block allocate() hands out with 0xFF bytes (a NaN as fp32, bf16 and fp16), so work
  // that reads a block before writing it, or a stream still using a block someone else was given,
  // produces NaNs instead of passing by luck.
  bool poison_new_blocks = false;
  // Bytes the caching allocator may hold (0: no cap).
  std::size_t memory_cap = 0;
};

// Each of the three streams is a thread with a FIFO of items (copies, work, waits). An event is
// (stream, sequence number): complete once that stream has finished that many items. wait()
// enqueues an item that blocks its stream until the event completes. Copies are memcpy on the
// copy streams' threads. A failed item fails its stream: its later items are dropped and every
// call that waits on that stream, or records on it, returns the failure naming the item.
//
// Thread-safe. The destructor waits for every stream's work.
class HostDevice final : public Device {
 public:
  static std::unique_ptr<HostDevice> create(HostDeviceOptions options = {});
  ~HostDevice() override;

  std::string describe() const override;
  bool host_addressable() const override { return true; }
  StreamKey stream_key(StreamRole role) const override;
  Result<DeviceBlock> allocate(std::size_t bytes, StreamRole role, std::string_view what) override;
  AllocatorStats allocator_stats() const override;
  Result<std::uint64_t> memory_room() const override;
  Status copy_h2d(void* device_dst, const void* host_src, std::size_t bytes, std::string_view what) override;
  Status copy_d2h(void* host_dst, const void* device_src, std::size_t bytes, std::string_view what) override;
  Status enqueue(StreamRole role, Work work, std::string_view what) override;
  Status fill_zero(StreamRole role, void* device_ptr, std::size_t bytes, std::string_view what) override;
  Result<double> copy_seconds(StreamRole role) const override;
  Result<Event> record(StreamRole role) override;
  Status wait(StreamRole role, const Event& event) override;
  Status synchronize(const Event& event) override;
  Result<bool> query(const Event& event) override;
  Status synchronize_all() override;
  DeviceOps* ops() override;

  class Impl;

 private:
  explicit HostDevice(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<DeviceOps> ops_;
};

}  // namespace zinf::device
