// Pinned staging memory under a hard byte budget: one arena, carved into page-aligned blocks.
//
// The budget comes from the config as buffer_count x buffer_size elements of the tensor's
// dtype (each buffer rounded up to 4 KiB). The arena is allocated once, pre-faulted, page-locked
// when asked (pin_memory), and registered with the aio handle for fixed-buffer I/O; or, with
// grow_on_demand, reserved and made memory as leases first reach it. The pool never hands out
// more than its capacity and records its high-water mark.
//
// Two kinds of requests:
//  - acquire(bytes): a resident block holding a whole tensor (prefetched parameters, optimizer
//    tiles). It waits until space is free. A request larger than resident_capacity() can never
//    be served: it fails at once with ResourceExhausted naming the config keys to raise.
//  - acquire_chunk(max, min): a streaming chunk of at most `max` bytes (at least `min`), as large
//    as the free space allows. Tensors larger than a buffer are moved through such chunks.
// The last `streaming_reserve_buffers` buffers of the arena serve only chunks, so streaming
// always makes progress even when resident blocks fill the rest; while a resident request
// waits, chunks stay in the reserve so that the resident request is not starved. Waiters of
// each kind are served first come, first served.
//
// Threading: all members are thread-safe. Blocks may be returned from any thread. The pool must
// outlive its blocks, and the aio handle it registered with must outlive the pool.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "zinf/status.h"

namespace zinf::aio {
class Handle;
}

namespace zinf::swap {

class PinnedPool;

// The config that sizes a pool; named in error messages.
struct PoolBudget {
  std::string config_block = "offload_param";  // e.g. "offload_param" or "offload_optimizer"
  std::size_t buffer_count = 5;
  std::size_t buffer_size = 100000000;  // elements per buffer
  std::size_t element_bytes = 2;        // bytes per element of the dtype the buffers hold

  // One buffer, rounded up to the swap alignment (4 KiB).
  std::size_t buffer_bytes() const;
  // buffer_count x buffer_bytes(): the pool's capacity (call checked_bytes() first on values from
  // a config: this one does not check for overflow).
  std::size_t bytes() const;
  // bytes(), or InvalidArgument when the product overflows and ResourceExhausted when it is more
  // than the memory available now (/proc/meminfo MemAvailable, else the physical pages), naming
  // the config keys. PinnedPool::create checks it before allocating.
  Result<std::size_t> checked_bytes() const;
};

struct PinnedPoolOptions {
  PoolBudget budget;
  bool pin_memory = true;  // page-lock the arena (mlock); false: ordinary pre-faulted pages
  // Buffers at the end of the arena that only streaming chunks may use (at most
  // buffer_count - 1). 0: resident blocks and chunks share everything.
  std::size_t streaming_reserve_buffers = 0;
  // Memory follows use: the arena's address space is reserved at create and its pages are
  // faulted in (and page-locked with pin_memory) as blocks first reach them, in steps of
  // kGrowthStep, so a pool never holds more than its leases have touched (allocated() <=
  // capacity()). Such an arena is not registered for fixed-buffer I/O (registering faults every
  // page in); false: the whole arena is allocated, pre-faulted and registered at create.
  bool grow_on_demand = false;
};

// A lease on part of a pool's arena; returns it on destruction. Move-only.
// data() is aligned to 4 KiB and capacity() (size() rounded up to 4 KiB) bytes are usable,
// so padded O_DIRECT transfers fit.
class PinnedBlock {
 public:
  PinnedBlock() = default;
  ~PinnedBlock() { reset(); }
  PinnedBlock(PinnedBlock&& other) noexcept;
  PinnedBlock& operator=(PinnedBlock&& other) noexcept;
  PinnedBlock(const PinnedBlock&) = delete;
  PinnedBlock& operator=(const PinnedBlock&) = delete;

  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  // Pages of a growing arena are committed in steps of this many bytes (one step is the least).
  static constexpr std::size_t kGrowthStep = std::size_t{2} << 20;

  std::size_t capacity() const { return capacity_; }
  // Bytes of the arena that are memory now: capacity() unless the pool grows on demand.
  std::size_t allocated() const;
  explicit operator bool() const { return data_ != nullptr; }
  // Returns the block to its pool now.
  void reset();

 private:
  friend class PinnedPool;
  PinnedPool* pool_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
  std::uint64_t offset_ = 0;
  int region_ = 0;
};

class PinnedPool {
 public:
  // Allocates the arena. `handle` (may be null) gets the arena registered for fixed-buffer I/O;
  // a refused registration only costs speed and is logged once.
  static Result<std::unique_ptr<PinnedPool>> create(const PinnedPoolOptions& options,
                                                    aio::Handle* handle = nullptr);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // A block of `bytes` (> 0) for a whole tensor. Blocks until served; ResourceExhausted at once
  // when bytes > resident_capacity().
  Result<PinnedBlock> acquire(std::size_t bytes);
  // As acquire, but returns an empty block instead of waiting.
  Result<PinnedBlock> try_acquire(std::size_t bytes);
  // As acquire, but returns an empty block when `timeout` passes first (it then gives up its
  // place in line).
  Result<PinnedBlock> acquire_for(std::size_t bytes, std::chrono::milliseconds timeout);
  // A streaming chunk of min(max_bytes, what is free) bytes, at least min_bytes (both > 0,
  // min <= max). Blocks until min_bytes can be served; ResourceExhausted at once when
  // min_bytes > capacity().
  Result<PinnedBlock> acquire_chunk(std::size_t max_bytes, std::size_t min_bytes);
  // As acquire_chunk, but returns an empty block instead of waiting (also when other chunk
  // requests are waiting).
  Result<PinnedBlock> try_acquire_chunk(std::size_t max_bytes, std::size_t min_bytes);

  // Pages of a growing arena are committed in steps of this many bytes (one step is the least).
  static constexpr std::size_t kGrowthStep = std::size_t{2} << 20;

  std::size_t capacity() const { return capacity_; }
  // Bytes of the arena that are memory now: capacity() unless the pool grows on demand.
  std::size_t allocated() const;
  std::size_t resident_capacity() const { return capacity_ - reserve_; }
  std::size_t streaming_reserve() const { return reserve_; }
  std::size_t in_use() const;
  // The most bytes ever leased at once (page-rounded, as they occupy the arena).
  std::size_t high_water() const;
  // Whether the arena is page-locked.
  bool locked() const;
  // Whether the arena is registered with CUDA (pin_memory, a CUDA build and a GPU present): GPU
  // copies from and to its blocks then run at DMA speed without staging.
  bool cuda_registered() const;
  const PoolBudget& budget() const { return budget_; }
  // "offload_param.buffer_count x buffer_size = 5 x 100000000 elements of 2 bytes = 1000000000 bytes".
  std::string describe_budget() const;

 private:
  friend class PinnedBlock;
  struct State;
  PinnedPool();
  void release(const PinnedBlock& block);
  Status check_resident_fits(std::size_t bytes) const;
  Status check_chunk_fits(std::size_t min_bytes) const;
  Result<PinnedBlock> acquire_impl(std::size_t bytes, bool wait,
                                   std::optional<std::chrono::milliseconds> timeout);
  Result<PinnedBlock> chunk_impl(std::size_t max_bytes, std::size_t min_bytes, bool wait);
  PinnedBlock make_block(std::uint64_t offset, std::size_t size, std::size_t capacity, int region);
  // A growing arena: commits the steps of [offset, offset + bytes) not yet committed. Called
  // under mutex_.
  void grow_to_cover(std::uint64_t offset, std::size_t bytes);

  PoolBudget budget_;
  std::size_t capacity_ = 0;
  std::size_t reserve_ = 0;  // bytes
  std::size_t reserve_buffers_ = 0;
  std::byte* base_ = nullptr;
  aio::Handle* handle_ = nullptr;
  bool registered_ = false;
  bool grows_ = false;
  bool pin_ = false;
  std::unique_ptr<State> state_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
};

}  // namespace zinf::swap
