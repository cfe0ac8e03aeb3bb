// Internal: a caching allocator for device memory (a GPU's, or the host device's), so that a
// training step does no cudaMalloc or cudaFree once the first step has warmed the cache.
//
// Policy (kept simple enough to state, and tested on the host with malloc):
//  - Size classes: a request is rounded up to a multiple of 512 bytes up to 1 MiB, and to a
//    multiple of 2 MiB above (the CUDA driver's own granularity for large allocations).
//  - Blocks are never split. A returned block goes to a free list of the stream it was allocated
//    for; a later request on that stream reuses the smallest cached block that fits, if it is at
//    most a quarter larger than the rounded request (so a step that allocates the same shapes as
//    the last one is served from the cache, and a small request does not pin a huge block).
//  - Stream order makes reuse on the same stream safe: work enqueued after the reuse runs after
//    the work that used the block before. Work on other streams is declared with
//    DeviceBlock::record_use(stream); when such a block is returned, a fence is recorded on each
//    of those streams and the block is reused only after every fence has completed.
//  - A cap in bytes bounds what the allocator holds from the device (in use + cached). A request
//    that would pass it first frees cached blocks, largest first; when that is not enough it
//    fails with kResourceExhausted naming the request and the cap. An out-of-memory answer from
//    the device likewise frees the whole cache and retries once.
//
// Threading: all members are thread-safe; blocks may be returned from any thread. The allocator
// must outlive its blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "device/stream_key.h"
#include "zinf/status.h"

namespace zinf::device {

// What the allocator is built on: the device's raw allocation and its stream fences. The CUDA
// backend (gpu/device_allocator.h) uses cudaMalloc/cudaFree and cudaEvents; tests use malloc and
// fences they complete by hand. Called with the allocator's lock held.
class AllocatorBackend {
 public:
  virtual ~AllocatorBackend() = default;
  // `bytes` of raw memory, or an error: kResourceExhausted when the device is out of memory.
  virtual Result<void*> allocate(std::size_t bytes) = 0;
  // Returns memory from allocate(). Only called once no fence of the block is pending.
  virtual void deallocate(void* ptr, std::size_t bytes) noexcept = 0;
  // A fence on `stream`: it completes when the work enqueued on the stream so far has.
  virtual Result<FenceKey> record_fence(StreamKey stream) = 0;
  virtual Result<bool> fence_done(FenceKey fence) = 0;
  virtual Status wait_fence(FenceKey fence) = 0;
  virtual void release_fence(FenceKey fence) noexcept = 0;
};

struct CachingAllocatorOptions {
  // The most bytes held from the backend at once (in use + cached); 0: no cap but the device's.
  std::size_t cap_bytes = 0;
  // Named in error messages with the cap, e.g. "GPU 0 memory (gpu.memory_cap_bytes)".
  std::string name = "device memory";
};

struct AllocatorStats {
  std::size_t in_use = 0;      // bytes of leased blocks (their size classes)
  std::size_t requested = 0;   // bytes the leased blocks were asked for
  std::size_t cached = 0;      // bytes of returned blocks held for reuse (including those behind fences)
  std::size_t reserved = 0;    // in_use + cached: what the backend has handed out to this allocator
  std::size_t peak_in_use = 0;
  std::size_t peak_reserved = 0;
  std::size_t blocks_in_use = 0;
  std::size_t blocks_cached = 0;
  std::uint64_t backend_allocations = 0;  // calls to the backend's allocate that succeeded
  std::uint64_t backend_frees = 0;
  std::uint64_t cache_hits = 0;           // requests served from the cache
  std::uint64_t cache_misses = 0;         // requests that went to the backend
};

class CachingAllocator;

// A lease on one block of device memory; returns it to its allocator on destruction (or reset()).
// Move-only. capacity() bytes (the size class) are usable; data() is aligned as the backend's
// allocations are (256 bytes for cudaMalloc).
class DeviceBlock {
 public:
  DeviceBlock() = default;
  ~DeviceBlock() { reset(); }
  DeviceBlock(DeviceBlock&& other) noexcept;
  DeviceBlock& operator=(DeviceBlock&& other) noexcept;
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  std::size_t size() const { return size_; }
  std::size_t capacity() const { return capacity_; }
  StreamKey stream() const { return stream_; }
  explicit operator bool() const { return data_ != nullptr; }

  // Declares that work enqueued on `stream` (other than the block's own) uses the block: when the
  // block is returned, it is reused only after the work enqueued on `stream` up to the return has
  // completed. Call it when enqueuing such work, before the block is returned.
  void record_use(StreamKey stream);
  // Returns the block to its allocator now.
  void reset();

 private:
  friend class CachingAllocator;
  CachingAllocator* owner_ = nullptr;
  void* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
  StreamKey stream_ = 0;
  std::vector<StreamKey> uses_;  // other streams that used the block
};

class CachingAllocator {
 public:
  static constexpr std::size_t kMinBlock = 512;
  static constexpr std::size_t kSmallLimit = std::size_t{1} << 20;  // 1 MiB
  static constexpr std::size_t kLargeGranule = std::size_t{2} << 20;  // 2 MiB

  // The size class of a request of `bytes` (> 0): see the policy above. 0 when rounding overflows.
  static std::size_t round_size(std::size_t bytes);
  // Whether a cached block of `block_bytes` may serve a request of size class `rounded`.
  static bool reusable_for(std::size_t block_bytes, std::size_t rounded);

  CachingAllocator(std::unique_ptr<AllocatorBackend> backend, CachingAllocatorOptions options);
  // Frees every cached block (waiting for its fences). Every block must have been returned.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` for work on `stream`. bytes == 0 gives an empty block. `what`
  // names the request in errors ("layer 3 qkv weight"). kResourceExhausted when the cap or the
  // device cannot serve it even with the cache freed; the message names the request, the cap and
  // what is in use and cached.
  Result<DeviceBlock> allocate(std::size_t bytes, StreamKey stream, std::string_view what);
  // Frees every cached block back to the backend, first waiting for the fences of blocks that are
  // still behind one. Returns the bytes freed. Blocks in use are untouched.
  Result<std::size_t> release_cached();

  AllocatorStats stats() const;
  std::size_t cap() const { return options_.cap_bytes; }
  const std::string& name() const { return options_.name; }

 private:
  friend class DeviceBlock;
  struct Cached {
    void* ptr;
    std::size_t bytes;
  };
  // A returned block that waits for fences on other streams before it is reusable.
  struct Pending {
    void* ptr;
    std::size_t bytes;
    StreamKey stream;
    std::vector<FenceKey> fences;
  };

  void release(DeviceBlock& block) noexcept;
  // Moves pending blocks whose fences have all completed to their streams' free lists.
  void collect_pending();
  std::optional<Cached> take_cached(StreamKey stream, std::size_t rounded);
  // Frees cached blocks, largest first, until `needed` more bytes fit under the cap (or the cache is empty).
  Status free_cached_for(std::size_t needed);
  Status free_all_cached();
  void free_block(void* ptr, std::size_t bytes) noexcept;
  Status cap_error(std::size_t bytes, std::size_t rounded, std::string_view what) const;
  void note_lease(std::size_t bytes, std::size_t rounded);

  std::unique_ptr<AllocatorBackend> backend_;
  CachingAllocatorOptions options_;
  mutable std::mutex mutex_;
  // Per stream: block size -> free blocks of that size.
  std::map<StreamKey, std::multimap<std::size_t, void*>> free_;
  std::vector<Pending> pending_;
  AllocatorStats stats_;
};

}  // namespace zinf::device
