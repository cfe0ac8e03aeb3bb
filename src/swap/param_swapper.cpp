// ParamSwapper: offload_param with device nvme, on a pinned pool, a store and a tensor swapper.
#include "zinf/swap/param_swapper.h"

#include <fmt/format.h>

namespace zinf::swap {

Result<std::unique_ptr<ParamSwapper>> ParamSwapper::create(const ParamSwapConfig& config, aio::Handle& handle,
                                                           OpenMode mode) {
  std::unique_ptr<ParamSwapper> p(new ParamSwapper());
  p->config_ = config;
  StoreConfig sc = config.store;
  sc.kind = StoreKind::kParameters;
  ZINF_ASSIGN_OR_RETURN(p->store_, SwapStore::open(sc, mode, handle));
  PinnedPoolOptions po;
  po.budget = PoolBudget{"offload_param", config.buffer_count, config.buffer_size, dtype_size(config.dtype)};
  po.pin_memory = config.pin_memory;
  po.streaming_reserve_buffers = 1;
  po.grow_on_demand = config.grow_pool;
  ZINF_ASSIGN_OR_RETURN(p->pool_, PinnedPool::create(po, &handle));
  TensorSwapperConfig tc;
  tc.max_in_cpu = config.max_in_cpu;
  tc.pin_memory = config.pin_memory;
  tc.io_threads = config.io_threads;
  ZINF_ASSIGN_OR_RETURN(p->swapper_, TensorSwapper::create(tc, *p->pool_, *p->store_));
  return p;
}

ParamSwapper::~ParamSwapper() {
  swapper_.reset();  // finishes queued operations while the pool and store still exist
  pool_.reset();
}

Status ParamSwapper::add(const std::string& key, std::uint64_t numel, const void* initial) {
  ZINF_RETURN_IF_ERROR(swapper_->declare(key, config_.dtype, numel));
  if (initial == nullptr) return Status::ok();
  return swapper_->swap_out(key, initial).wait();
}

SwapTicket ParamSwapper::fetch(const std::string& key) { return swapper_->prefetch(key); }
Result<TensorView> ParamSwapper::get(const std::string& key) { return swapper_->acquire(key); }
SwapTicket ParamSwapper::fetch_into(const std::string& key, void* dst) { return swapper_->swap_in(key, dst); }
SwapTicket ParamSwapper::fetch_into(const std::string& key, ChunkSink sink) {
  return swapper_->swap_in(key, std::move(sink));
}
SwapTicket ParamSwapper::release(const std::string& key) { return swapper_->release(key); }
SwapTicket ParamSwapper::write(const std::string& key, const void* src) { return swapper_->swap_out(key, src); }

SwapTicket ParamSwapper::write_range(const std::string& key, std::uint64_t first, std::uint64_t count,
                                     const void* src, bool src_padded) {
  const std::size_t esize = dtype_size(config_.dtype);
  return swapper_->write_range(
      key, first * esize, std::span<const std::byte>(static_cast<const std::byte*>(src), count * esize), src_padded);
}

}  // namespace zinf::swap
