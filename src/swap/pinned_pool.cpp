// PinnedPool: a budgeted arena of staging memory with resident blocks and streaming chunks.
#include "zinf/swap/pinned_pool.h"

#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "swap/free_list.h"
#include "swap/host_buffer.h"
#include "zinf/aio/handle.h"
#include "zinf/log.h"
#include "zinf/swap/types.h"

namespace zinf::swap {

namespace {
constexpr int kMainRegion = 0;     // resident blocks, and chunks when no resident request waits
constexpr int kReserveRegion = 1;  // streaming chunks only

// Memory the kernel says a new allocation can have now: MemAvailable from /proc/meminfo, else
// all physical pages (sysconf). 0 when neither is known.
std::uint64_t available_memory_bytes() {
  if (std::FILE* f = std::fopen("/proc/meminfo", "re")) {
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
        found = true;
        break;
      }
    }
    std::fclose(f);
    if (found) return static_cast<std::uint64_t>(kib) * 1024;
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
}

}  // namespace

Result<std::size_t> PoolBudget::checked_bytes() const {
  const PoolBudget& b = *this;
  std::uint64_t buffer = 0, total = 0;
  const std::string what = fmt::format("{0}.buffer_count x {0}.buffer_size = {1} x {2} elements of {3} bytes",
                                       b.config_block, b.buffer_count, b.buffer_size, b.element_bytes);
  if (__builtin_mul_overflow(static_cast<std::uint64_t>(b.buffer_size), static_cast<std::uint64_t>(b.element_bytes),
                             &buffer) ||
      buffer > std::numeric_limits<std::uint64_t>::max() - kSwapAlignment ||
      __builtin_mul_overflow(align_up(buffer, kSwapAlignment), static_cast<std::uint64_t>(b.buffer_count), &total) ||
      total > std::numeric_limits<std::size_t>::max()) {
    return Status::invalid_argument(fmt::format("{} overflows a 64-bit byte count; lower {}.buffer_size or "
                                                "{}.buffer_count", what, b.config_block, b.config_block));
  }
  const std::uint64_t available = available_memory_bytes();
  if (available != 0 && total > available) {
    return Status::resource_exhausted(fmt::format(
        "{} = {} bytes of staging memory, but only {} bytes are available (MemAvailable); lower {}.buffer_size or "
        "{}.buffer_count",
        what, total, available, b.config_block, b.config_block));
  }
  return static_cast<std::size_t>(total);
}

std::size_t PoolBudget::buffer_bytes() const {
  return static_cast<std::size_t>(align_up(static_cast<std::uint64_t>(buffer_size) * element_bytes,
                                           kSwapAlignment));
}

std::size_t PoolBudget::bytes() const { return buffer_count * buffer_bytes(); }

struct PinnedPool::State {
  detail::HostBuffer arena;
  std::vector<bool> committed;  // per kGrowthStep of a growing arena
  std::size_t allocated = 0;    // bytes of the arena that are memory
  detail::FreeList regions[2];
  std::size_t in_use = 0;
  std::size_t high_water = 0;
  // First come, first served within each kind of request.
  std::uint64_t resident_next = 0, resident_serving = 0;
  std::set<std::uint64_t> resident_cancelled;  // tickets whose waiters timed out
  std::uint64_t chunk_next = 0, chunk_serving = 0;

  void advance_resident() {
    ++resident_serving;
    while (resident_cancelled.erase(resident_serving) != 0) ++resident_serving;
  }
};

PinnedPool::PinnedPool() : state_(std::make_unique<State>()) {}

Result<std::unique_ptr<PinnedPool>> PinnedPool::create(const PinnedPoolOptions& options,
                                                       aio::Handle* handle) {
  const PoolBudget& b = options.budget;
  if (b.buffer_count == 0 || b.buffer_size == 0 || b.element_bytes == 0) {
    return Status::invalid_argument(fmt::format(
        "{0}.buffer_count ({1}) and {0}.buffer_size ({2}) must be positive", b.config_block,
        b.buffer_count, b.buffer_size));
  }
  ZINF_ASSIGN_OR_RETURN(const std::size_t capacity, b.checked_bytes());
  std::unique_ptr<PinnedPool> pool(new PinnedPool());
  pool->budget_ = b;
  pool->capacity_ = capacity;
  pool->reserve_buffers_ = std::min(options.streaming_reserve_buffers, b.buffer_count - 1);
  pool->reserve_ = pool->reserve_buffers_ * b.buffer_bytes();
  pool->grows_ = options.grow_on_demand;
  pool->pin_ = options.pin_memory;
  if (pool->grows_) {
    ZINF_ASSIGN_OR_RETURN(pool->state_->arena, detail::HostBuffer::reserve(pool->capacity_));
    pool->state_->committed.assign((pool->capacity_ + kGrowthStep - 1) / kGrowthStep, false);
  } else {
    ZINF_ASSIGN_OR_RETURN(pool->state_->arena, detail::HostBuffer::allocate(pool->capacity_, options.pin_memory));
    pool->state_->allocated = pool->capacity_;
  }
  pool->base_ = pool->state_->arena.data();
  const std::size_t main = pool->capacity_ - pool->reserve_;
  pool->state_->regions[kMainRegion].add(0, main);
  pool->state_->regions[kReserveRegion].add(main, pool->reserve_);
  if (handle != nullptr && !pool->grows_) {
    const Status st = handle->register_buffer(pool->base_, pool->capacity_);
    if (st.is_ok()) {
      pool->handle_ = handle;
      pool->registered_ = true;
    } else {
      log_once(LogLevel::kNotice, "swap.pool.register",
               fmt::format("pinned pool not registered for fixed-buffer I/O ({}); using plain I/O",
                           st.to_string()));
    }
  }
  return pool;
}

PinnedPool::~PinnedPool() {
  assert(state_->in_use == 0 && "every PinnedBlock must be returned before its pool is destroyed");
  if (registered_) {
    const Status st = handle_->unregister_buffers();
    if (!st.is_ok()) log(LogLevel::kWarning, "pinned pool: " + st.to_string());
  }
}

std::string PinnedPool::describe_budget() const {
  return fmt::format("{0}.buffer_count x {0}.buffer_size = {1} x {2} elements of {3} bytes = {4} bytes",
                     budget_.config_block, budget_.buffer_count, budget_.buffer_size,
                     budget_.element_bytes, capacity_);
}

Status PinnedPool::check_resident_fits(std::size_t bytes) const {
  if (bytes == 0) return Status::invalid_argument("pinned pool: a block of 0 bytes was requested");
  if (bytes <= resident_capacity()) return Status::ok();
  const std::size_t usable_buffers = budget_.buffer_count - reserve_buffers_;
  const std::size_t per_buffer = (bytes + usable_buffers - 1) / usable_buffers;
  const std::size_t new_size = (per_buffer + budget_.element_bytes - 1) / budget_.element_bytes;
  const std::size_t new_count = reserve_buffers_ + (bytes + budget_.buffer_bytes() - 1) / budget_.buffer_bytes();
  const std::string reserved =
      reserve_buffers_ == 0 ? std::string()
                            : fmt::format(" ({} buffer kept for streaming, {} bytes usable for whole tensors)",
                                          reserve_buffers_, resident_capacity());
  return Status::resource_exhausted(fmt::format(
      "{}{} cannot hold a {}-byte tensor whole; raise {}.buffer_size by {} elements (to {}) or "
      "{}.buffer_count to {}, or stream the tensor in chunks",
      describe_budget(), reserved, bytes, budget_.config_block, new_size - budget_.buffer_size, new_size,
      budget_.config_block, new_count));
}

Status PinnedPool::check_chunk_fits(std::size_t min_bytes) const {
  if (min_bytes == 0) return Status::invalid_argument("pinned pool: a chunk of 0 bytes was requested");
  const std::size_t region = std::max(resident_capacity(), reserve_);
  if (align_up(min_bytes, kSwapAlignment) <= region) return Status::ok();
  return Status::resource_exhausted(fmt::format(
      "{} cannot hold a {}-byte streaming chunk; raise {}.buffer_size to at least {} elements",
      describe_budget(), min_bytes, budget_.config_block,
      (min_bytes + budget_.element_bytes - 1) / budget_.element_bytes));
}

void PinnedPool::grow_to_cover(std::uint64_t offset, std::size_t bytes) {
  State& s = *state_;
  if (!grows_ || bytes == 0) return;
  for (std::size_t i = offset / kGrowthStep; i <= (offset + bytes - 1) / kGrowthStep; ++i) {
    if (s.committed[i]) continue;
    const std::size_t begin = i * kGrowthStep, length = std::min(kGrowthStep, capacity_ - begin);
    s.arena.commit(begin, length, pin_);
    s.committed[i] = true;
    s.allocated += length;
  }
}

PinnedBlock PinnedPool::make_block(std::uint64_t offset, std::size_t size, std::size_t capacity, int region) {
  State& s = *state_;
  grow_to_cover(offset, capacity);
  s.in_use += capacity;
  s.high_water = std::max(s.high_water, s.in_use);
  PinnedBlock block;
  block.pool_ = this;
  block.data_ = base_ + offset;
  block.size_ = size;
  block.capacity_ = capacity;
  block.offset_ = offset;
  block.region_ = region;
  return block;
}

Result<PinnedBlock> PinnedPool::acquire(std::size_t bytes) { return acquire_impl(bytes, true, std::nullopt); }
Result<PinnedBlock> PinnedPool::try_acquire(std::size_t bytes) { return acquire_impl(bytes, false, std::nullopt); }
Result<PinnedBlock> PinnedPool::acquire_for(std::size_t bytes, std::chrono::milliseconds timeout) {
  return acquire_impl(bytes, true, timeout);
}

Result<PinnedBlock> PinnedPool::acquire_impl(std::size_t bytes, bool wait,
                                             std::optional<std::chrono::milliseconds> timeout) {
  ZINF_RETURN_IF_ERROR(check_resident_fits(bytes));
  const std::size_t capacity = align_up(bytes, kSwapAlignment);
  State& s = *state_;
  std::unique_lock lock(mutex_);
  if (!wait) {
    if (s.resident_next != s.resident_serving) return PinnedBlock();
    auto offset = s.regions[kMainRegion].take(capacity);
    if (!offset) return PinnedBlock();
    return make_block(*offset, bytes, capacity, kMainRegion);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout.value_or(std::chrono::milliseconds(0));
  const std::uint64_t ticket = s.resident_next++;
  for (;;) {
    if (ticket == s.resident_serving) {
      if (auto offset = s.regions[kMainRegion].take(capacity)) {
        s.advance_resident();
        PinnedBlock block = make_block(*offset, bytes, capacity, kMainRegion);
        cv_.notify_all();  // the next resident waiter, and chunks held back for this one
        return block;
      }
    }
    if (!timeout) {
      cv_.wait(lock);
    } else if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      // Give up the place in line; tickets behind it must not wait for it.
      if (ticket == s.resident_serving) {
        s.advance_resident();
      } else {
        s.resident_cancelled.insert(ticket);
      }
      cv_.notify_all();
      return PinnedBlock();
    }
  }
}

Result<PinnedBlock> PinnedPool::acquire_chunk(std::size_t max_bytes, std::size_t min_bytes) {
  return chunk_impl(max_bytes, min_bytes, true);
}
Result<PinnedBlock> PinnedPool::try_acquire_chunk(std::size_t max_bytes, std::size_t min_bytes) {
  return chunk_impl(max_bytes, min_bytes, false);
}

Result<PinnedBlock> PinnedPool::chunk_impl(std::size_t max_bytes, std::size_t min_bytes, bool wait) {
  ZINF_RETURN_IF_ERROR(check_chunk_fits(min_bytes));
  if (max_bytes < min_bytes) {
    return Status::invalid_argument(
        fmt::format("pinned pool: chunk of at most {} bytes but at least {} bytes", max_bytes, min_bytes));
  }
  const std::size_t want = align_up(max_bytes, kSwapAlignment);
  const std::size_t need = align_up(min_bytes, kSwapAlignment);
  State& s = *state_;
  // Reserve first; the main region only while no resident request waits for it.
  auto try_take = [&]() -> PinnedBlock {
    const bool main_allowed = s.resident_next == s.resident_serving || reserve_ == 0;
    const int order[2] = {kReserveRegion, kMainRegion};
    for (int region : order) {
      if (region == kMainRegion && !main_allowed) continue;
      if (auto offset = s.regions[region].take(want)) {
        return make_block(*offset, std::min(max_bytes, want), want, region);
      }
    }
    int best = -1;
    std::uint64_t best_len = 0;
    for (int region : order) {
      if (region == kMainRegion && !main_allowed) continue;
      const std::uint64_t len = s.regions[region].largest();
      if (len >= need && len > best_len) {
        best = region;
        best_len = len;
      }
    }
    if (best < 0) return PinnedBlock();
    auto offset = s.regions[best].take(best_len);
    return make_block(*offset, best_len, best_len, best);
  };
  std::unique_lock lock(mutex_);
  if (!wait) {
    if (s.chunk_next != s.chunk_serving) return PinnedBlock();
    return try_take();
  }
  const std::uint64_t ticket = s.chunk_next++;
  for (;;) {
    if (ticket == s.chunk_serving) {
      PinnedBlock block = try_take();
      if (block) {
        ++s.chunk_serving;
        cv_.notify_all();
        return block;
      }
    }
    cv_.wait(lock);
  }
}

void PinnedPool::release(const PinnedBlock& block) {
  {
    std::lock_guard lock(mutex_);
    state_->regions[block.region_].add(block.offset_, block.capacity_);
    state_->in_use -= block.capacity_;
  }
  cv_.notify_all();
}

std::size_t PinnedPool::in_use() const {
  std::lock_guard lock(mutex_);
  return state_->in_use;
}

std::size_t PinnedPool::allocated() const {
  std::lock_guard lock(mutex_);
  return state_->allocated;
}

std::size_t PinnedPool::high_water() const {
  std::lock_guard lock(mutex_);
  return state_->high_water;
}

bool PinnedPool::locked() const { return state_->arena.locked(); }

bool PinnedPool::cuda_registered() const { return state_->arena.cuda_registered(); }

PinnedBlock::PinnedBlock(PinnedBlock&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      capacity_(std::exchange(other.capacity_, 0)),
      offset_(std::exchange(other.offset_, 0)),
      region_(std::exchange(other.region_, 0)) {}

PinnedBlock& PinnedBlock::operator=(PinnedBlock&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    offset_ = std::exchange(other.offset_, 0);
    region_ = std::exchange(other.region_, 0);
  }
  return *this;
}

void PinnedBlock::reset() {
  if (pool_ == nullptr) return;
  pool_->release(*this);
  pool_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  capacity_ = 0;
}

}  // namespace zinf::swap
