// Tensor swapper: asynchronous moves of named tensors between host memory and a swap store.
//
// Every tensor has a copy in the SwapStore (NVMe), which is authoritative. On top of it:
//  - the CPU tier: up to `max_in_cpu` elements (counted over all tensors, first declared first
//    served) stay resident in host memory for the swapper's lifetime. Writes to them go to
//    memory and through to the store (so a reopened store is complete); reads never touch NVMe.
//  - staged copies: prefetch() reads a whole tensor into a resident block of the PinnedPool,
//    where acquire() views it, until release() gives the block back. A tensor larger than the
//    pool's resident capacity cannot be staged (prefetch fails at once, naming the budget);
//    swap_in() and swap_out() stream any size through pool chunks instead.
// Tier::kGpu is not implemented; a GPU tier plugs in through ChunkSink / ChunkSource, which
// receive each pinned chunk (an H2D or D2H copy there instead of memcpy).
//
// Ordering: operations on one key run in the order they were issued; operations on different
// keys run concurrently on `io_threads` threads. A prefetch waiting for pool memory parks
// without holding a thread, so streaming operations keep going.
//
// Ownership and threading: all members are thread-safe. Source and destination buffers must
// stay valid until the operation's ticket is ready. The pool and the store must outlive the
// swapper; the destructor waits for every queued operation. Views must be destroyed before
// the swapper.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "zinf/status.h"
#include "zinf/swap/pinned_pool.h"
#include "zinf/swap/swap_store.h"
#include "zinf/swap/types.h"

namespace zinf::swap {

namespace detail {
struct TicketState;
struct TensorEntry;
}  // namespace detail

// The completion of one asynchronous operation. Copyable; every copy sees the same result.
class SwapTicket {
 public:
  // A ticket for nothing: ready, with an ok status.
  SwapTicket() = default;
  // Blocks until the operation has finished and returns its status (the same on every call).
  Status wait() const;
  bool ready() const;

 private:
  friend class TensorSwapper;
  friend class SwapCompletion;
  explicit SwapTicket(std::shared_ptr<detail::TicketState> state) : state_(std::move(state)) {}
  std::shared_ptr<detail::TicketState> state_;
};

// The completing side of a SwapTicket, for asynchronous work done outside the tensor swapper (a
// parameter sink's upload, say). Copyable; complete() once, from any thread; every ticket()
// then returns that status.
class SwapCompletion {
 public:
  SwapCompletion();
  SwapTicket ticket() const { return SwapTicket(state_); }
  void complete(Status status) const;

 private:
  std::shared_ptr<detail::TicketState> state_;
};

// Receives a tensor's bytes chunk by chunk, in order: `bytes` starts at byte `offset` of the
// tensor and is only valid during the call. Called on a swapper thread.
using ChunkSink = std::function<Status(std::uint64_t offset, std::span<const std::byte> bytes)>;
// Fills `bytes` with the tensor's bytes starting at byte `offset`. Called on a swapper thread.
using ChunkSource = std::function<Status(std::uint64_t offset, std::span<std::byte> bytes)>;

struct TensorSwapperConfig {
  std::uint64_t max_in_cpu = 0;  // elements kept resident in host memory (the CPU tier)
  bool pin_memory = false;       // page-lock the CPU tier's memory
  std::size_t chunk_bytes = 0;   // streaming chunk (rounded to 4 KiB); 0: one pool buffer
  std::size_t io_threads = 2;    // operations on different tensors in flight at once
};

struct TensorInfo {
  std::string key;
  DType dtype = DType::kF32;
  std::uint64_t numel = 0;
  std::uint64_t nbytes = 0;
  Tier home = Tier::kNvme;  // kCpu: resident in the CPU tier (and written through to NVMe)
  bool staged = false;      // a prefetched copy is in the pinned pool
  int views = 0;            // TensorViews alive
};

class TensorSwapper;

// A read-only view of a resident copy (CPU tier or staged); keeps it resident while alive.
// Move-only. Writing to a tensor while views of it are alive changes what they see.
class TensorView {
 public:
  TensorView() = default;
  ~TensorView() { reset(); }
  TensorView(TensorView&& other) noexcept;
  TensorView& operator=(TensorView&& other) noexcept;
  TensorView(const TensorView&) = delete;
  TensorView& operator=(const TensorView&) = delete;

  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }  // bytes
  std::span<const std::byte> bytes() const { return {data_, size_}; }
  explicit operator bool() const { return owner_ != nullptr; }
  void reset();

 private:
  friend class TensorSwapper;
  TensorSwapper* owner_ = nullptr;
  detail::TensorEntry* entry_ = nullptr;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

class TensorSwapper {
 public:
  static Result<std::unique_ptr<TensorSwapper>> create(const TensorSwapperConfig& config, PinnedPool& pool,
                                                       SwapStore& store);
  ~TensorSwapper();
  TensorSwapper(const TensorSwapper&) = delete;
  TensorSwapper& operator=(const TensorSwapper&) = delete;

  // Makes `key` known with numel elements of dtype and gives it store space. A key already in
  // the store (a reopened one) with the same dtype and size keeps its contents; a CPU-tier
  // tensor is then loaded into memory. Otherwise contents are unspecified until written.
  // Declaring a key twice with the same shape is a no-op; another shape is InvalidArgument.
  Status declare(const std::string& key, DType dtype, std::uint64_t numel);

  // Writes the whole tensor from src (nbytes bytes).
  SwapTicket swap_out(const std::string& key, const void* src);
  SwapTicket swap_out(const std::string& key, ChunkSource source);
  // Writes bytes [offset, offset + src.size()) of the tensor. offset must be a multiple of
  // 4 KiB, and so must src.size() unless the range ends the tensor. With src_padded, src is
  // 4 KiB aligned and readable for align_up(src.size(), 4096) bytes, and is written without
  // staging.
  SwapTicket write_range(const std::string& key, std::uint64_t offset, std::span<const std::byte> src,
                         bool src_padded = false);
  // Reads the whole tensor into dst (nbytes bytes), from memory when it is resident.
  SwapTicket swap_in(const std::string& key, void* dst);
  SwapTicket swap_in(const std::string& key, ChunkSink sink);
  // Stages the tensor in the pinned pool (no-op when resident).
  SwapTicket prefetch(const std::string& key);
  // Gives the staged copy back to the pool once no view uses it (no-op for the CPU tier).
  // Nothing is written back: the store's copy is authoritative.
  SwapTicket release(const std::string& key);
  // Prefetches, waits, and returns a view that keeps the copy resident. Fails when an earlier
  // prefetch of the tensor failed (once: the error is then reported), even if this read succeeds.
  Result<TensorView> acquire(const std::string& key);

  Result<TensorInfo> info(const std::string& key) const;
  // Elements resident in the CPU tier.
  std::uint64_t cpu_elements() const;
  // Waits for every operation issued so far, then commits the store's manifest.
  Status flush();

  PinnedPool& pool() const { return *pool_; }
  SwapStore& store() const { return *store_; }
  std::size_t chunk_bytes() const { return chunk_bytes_; }

 private:
  struct Scheduler;
  TensorSwapper();
  void unpin(detail::TensorEntry* entry);
  friend class TensorView;

  TensorSwapperConfig config_;
  PinnedPool* pool_ = nullptr;
  SwapStore* store_ = nullptr;
  std::size_t chunk_bytes_ = 0;
  std::unique_ptr<Scheduler> scheduler_;
};

}  // namespace zinf::swap
