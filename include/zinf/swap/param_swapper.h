// Parameter swapper (offload_param with device nvme): fetch and release of parameter partitions.
//
// Owns a pinned pool of buffer_count x buffer_size elements of the parameter dtype (one buffer
// kept for streaming when buffer_count > 1), the parameters' swap store, and a TensorSwapper
// with max_in_cpu elements of CPU tier. Unlike the reference, a partition larger than a buffer
// is not an error: fetch_into() streams it in chunks; only fetch()/get(), which hold a whole
// partition in pinned memory, need it to fit (and fail at once, naming the budget, if it never
// can). The NVMe copy is authoritative: release() writes nothing back; the optimizer's updated
// 16-bit partitions are written with write() / write_range().
//
// Threading: as TensorSwapper. The aio handle must outlive the swapper.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zinf/aio/handle.h"
#include "zinf/status.h"
#include "zinf/swap/pinned_pool.h"
#include "zinf/swap/swap_store.h"
#include "zinf/swap/tensor_swapper.h"
#include "zinf/swap/types.h"

namespace zinf::swap {

// The offload_param block, resolved (the engine fills it from ds_config).
struct ParamSwapConfig {
  // Where the partitions live (nvme_paths: several stripe extents across them; rank, stripe
  // unit, durability, checksums). The swapper sets store.kind itself.
  StoreConfig store;
  std::size_t buffer_count = 5;
  std::size_t buffer_size = 100000000;   // elements per pinned buffer
  std::uint64_t max_in_cpu = 1000000000; // elements kept in CPU memory
  bool pin_memory = false;
  DType dtype = DType::kBF16;            // the partitions' dtype
  std::size_t io_threads = 2;
  // The pool grows on demand (PinnedPoolOptions::grow_on_demand): for a budget larger than the
  // partitions can use, whose unused part then never becomes memory.
  bool grow_pool = false;
};

class ParamSwapper {
 public:
  // mode kOpen / kOpenOrCreate reopen the partitions of an earlier run (resume).
  static Result<std::unique_ptr<ParamSwapper>> create(const ParamSwapConfig& config, aio::Handle& handle,
                                                      OpenMode mode = OpenMode::kCreate);
  ~ParamSwapper();

  const ParamSwapConfig& config() const { return config_; }

  // Registers a partition of numel elements (config dtype); with `initial` (numel elements),
  // writes it and waits. A partition of a reopened store keeps its contents when initial is null.
  Status add(const std::string& key, std::uint64_t numel, const void* initial = nullptr);

  // Stages the whole partition in pinned memory (no-op for the CPU tier).
  SwapTicket fetch(const std::string& key);
  // Waits for the staged copy and returns a view of it (fetching if needed).
  Result<TensorView> get(const std::string& key);
  // Streams the partition into dst (numel elements), whatever its size.
  SwapTicket fetch_into(const std::string& key, void* dst);
  SwapTicket fetch_into(const std::string& key, ChunkSink sink);
  // Drops the staged copy once no view uses it.
  SwapTicket release(const std::string& key);

  // Writes the whole partition (numel elements from src).
  SwapTicket write(const std::string& key, const void* src);
  // Writes elements [first, first + count) from src; see TensorSwapper::write_range for the
  // alignment rules (first * element size a multiple of 4 KiB; count too unless it ends the
  // partition).
  SwapTicket write_range(const std::string& key, std::uint64_t first, std::uint64_t count, const void* src,
                         bool src_padded = false);

  Result<TensorInfo> info(const std::string& key) const { return swapper_->info(key); }
  // Waits for every operation, then commits the store's manifest.
  Status flush() { return swapper_->flush(); }

  PinnedPool& pool() const { return *pool_; }
  SwapStore& store() const { return *store_; }
  TensorSwapper& swapper() const { return *swapper_; }

 private:
  ParamSwapper() = default;
  ParamSwapConfig config_;
  std::unique_ptr<SwapStore> store_;
  std::unique_ptr<PinnedPool> pool_;
  std::unique_ptr<TensorSwapper> swapper_;
};

}  // namespace zinf::swap
