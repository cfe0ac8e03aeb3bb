// CachingAllocator: size classes, per-stream free lists, fence-ordered reuse, a byte cap.
#include "device/caching_allocator.h"

#include <algorithm>
#include <cassert>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "zinf/log.h"

namespace zinf::device {

namespace {

std::size_t round_up(std::size_t bytes, std::size_t granule) {
  if (bytes > std::numeric_limits<std::size_t>::max() - (granule - 1)) return 0;
  return (bytes + granule - 1) / granule * granule;
}

}  // namespace

std::size_t CachingAllocator::round_size(std::size_t bytes) {
  if (bytes <= kSmallLimit) return round_up(std::max(bytes, kMinBlock), kMinBlock);
  return round_up(bytes, kLargeGranule);
}

bool CachingAllocator::reusable_for(std::size_t block_bytes, std::size_t rounded) {
  return block_bytes >= rounded && block_bytes - rounded <= rounded / 4;
}

CachingAllocator::CachingAllocator(std::unique_ptr<AllocatorBackend> backend, CachingAllocatorOptions options)
    : backend_(std::move(backend)), options_(std::move(options)) {}

CachingAllocator::~CachingAllocator() {
  assert(stats_.blocks_in_use == 0 && "every DeviceBlock must be returned before its allocator is destroyed");
  const Result<std::size_t> freed = release_cached();
  if (!freed.is_ok()) log(LogLevel::kWarning, freed.status().with_context(options_.name).to_string());
}

Result<DeviceBlock> CachingAllocator::allocate(std::size_t bytes, StreamKey stream, std::string_view what) {
  if (bytes == 0) return DeviceBlock();
  const std::size_t rounded = round_size(bytes);
  if (rounded == 0) {
    return Status::invalid_argument(fmt::format("{}: a request of {} bytes for {} is too large to round to a size class",
                                                options_.name, bytes, what));
  }
  std::lock_guard lock(mutex_);
  collect_pending();
  DeviceBlock block;
  block.owner_ = this;
  block.size_ = bytes;
  block.stream_ = stream;
  if (std::optional<Cached> hit = take_cached(stream, rounded)) {
    ++stats_.cache_hits;
    block.data_ = hit->ptr;
    block.capacity_ = hit->bytes;
    note_lease(bytes, hit->bytes);
    return block;
  }
  ++stats_.cache_misses;
  const std::size_t cap = options_.cap_bytes;
  if (cap != 0 && rounded > cap) return cap_error(bytes, rounded, what);
  if (cap != 0 && stats_.reserved + rounded > cap) {
    ZINF_RETURN_IF_ERROR(free_cached_for(rounded).with_context(options_.name));
    if (stats_.reserved + rounded > cap) return cap_error(bytes, rounded, what);
  }
  Result<void*> raw = backend_->allocate(rounded);
  if (!raw.is_ok() && raw.status().code() == ErrorCode::kResourceExhausted && stats_.cached > 0) {
    // The device is out of memory but the cache holds some: give it back and try once more.
    ZINF_RETURN_IF_ERROR(free_all_cached().with_context(options_.name));
    raw = backend_->allocate(rounded);
  }
  if (!raw.is_ok()) {
    return raw.status().with_context(fmt::format(
        "{}: allocating {} bytes for {} ({} asked; {} bytes in use, {} cached, cap {})", options_.name, rounded, what,
        bytes, stats_.in_use, stats_.cached, cap == 0 ? std::string("none") : std::to_string(cap)));
  }
  ++stats_.backend_allocations;
  stats_.reserved += rounded;
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  block.data_ = raw.value();
  block.capacity_ = rounded;
  note_lease(bytes, rounded);
  return block;
}

void CachingAllocator::note_lease(std::size_t bytes, std::size_t capacity) {
  stats_.in_use += capacity;
  stats_.requested += bytes;
  ++stats_.blocks_in_use;
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
}

std::optional<CachingAllocator::Cached> CachingAllocator::take_cached(StreamKey stream, std::size_t rounded) {
  auto list = free_.find(stream);
  if (list == free_.end()) return std::nullopt;
  auto it = list->second.lower_bound(rounded);
  if (it == list->second.end() || !reusable_for(it->first, rounded)) return std::nullopt;
  const Cached hit{it->second, it->first};
  list->second.erase(it);
  stats_.cached -= hit.bytes;
  --stats_.blocks_cached;
  return hit;
}

void CachingAllocator::collect_pending() {
  auto ready = [this](Pending& p) {
    for (const FenceKey fence : p.fences) {
      const Result<bool> done = backend_->fence_done(fence);
      if (!done.is_ok()) {
        // A failed fence means failed work on the device; the block stays out of reuse and the
        // error surfaces on the streams that ran the work.
        log_once(LogLevel::kWarning, "gpu.allocator.fence",
                 fmt::format("{}: a returned block's fence failed ({}); the block is not reused", options_.name,
                             done.status().to_string()));
        return false;
      }
      if (!done.value()) return false;
    }
    return true;
  };
  auto it = pending_.begin();
  while (it != pending_.end()) {
    if (!ready(*it)) {
      ++it;
      continue;
    }
    for (const FenceKey fence : it->fences) backend_->release_fence(fence);
    free_[it->stream].emplace(it->bytes, it->ptr);
    it = pending_.erase(it);
  }
}

Status CachingAllocator::free_cached_for(std::size_t needed) {
  auto fits = [&] { return stats_.reserved + needed <= options_.cap_bytes; };
  // Free blocks first, the largest of any stream each time.
  while (!fits()) {
    std::multimap<std::size_t, void*>* best = nullptr;
    for (auto& [stream, list] : free_) {
      if (!list.empty() && (best == nullptr || list.rbegin()->first > best->rbegin()->first)) best = &list;
    }
    if (best == nullptr) break;
    auto last = std::prev(best->end());
    const Cached victim{last->second, last->first};
    best->erase(last);
    --stats_.blocks_cached;
    stats_.cached -= victim.bytes;
    free_block(victim.ptr, victim.bytes);
  }
  // Then blocks behind fences, largest first, waiting for their fences.
  std::sort(pending_.begin(), pending_.end(), [](const Pending& a, const Pending& b) { return a.bytes > b.bytes; });
  while (!fits() && !pending_.empty()) {
    Pending& p = pending_.front();
    for (const FenceKey fence : p.fences) ZINF_RETURN_IF_ERROR(backend_->wait_fence(fence));
    for (const FenceKey fence : p.fences) backend_->release_fence(fence);
    --stats_.blocks_cached;
    stats_.cached -= p.bytes;
    free_block(p.ptr, p.bytes);
    pending_.erase(pending_.begin());
  }
  return Status::ok();
}

Status CachingAllocator::free_all_cached() {
  Status first = Status::ok();
  auto it = pending_.begin();
  while (it != pending_.end()) {
    Status waited = Status::ok();
    for (const FenceKey fence : it->fences) {
      waited = backend_->wait_fence(fence);
      if (!waited.is_ok()) break;
    }
    if (!waited.is_ok()) {
      // Its work failed or cannot be waited for: keep the block rather than free memory in use.
      if (first.is_ok()) first = waited;
      ++it;
      continue;
    }
    for (const FenceKey fence : it->fences) backend_->release_fence(fence);
    free_[it->stream].emplace(it->bytes, it->ptr);
    it = pending_.erase(it);
  }
  for (auto& [stream, list] : free_) {
    for (const auto& [bytes, ptr] : list) {
      --stats_.blocks_cached;
      stats_.cached -= bytes;
      free_block(ptr, bytes);
    }
  }
  free_.clear();
  return first;
}

void CachingAllocator::free_block(void* ptr, std::size_t bytes) noexcept {
  backend_->deallocate(ptr, bytes);
  stats_.reserved -= bytes;
  ++stats_.backend_frees;
}

Result<std::size_t> CachingAllocator::release_cached() {
  std::lock_guard lock(mutex_);
  const std::size_t before = stats_.reserved;
  const Status st = free_all_cached();
  if (!st.is_ok()) return st;
  return before - stats_.reserved;
}

Status CachingAllocator::cap_error(std::size_t bytes, std::size_t rounded, std::string_view what) const {
  if (rounded > options_.cap_bytes) {
    return Status::resource_exhausted(fmt::format(
        "{}: cannot allocate {} bytes for {} ({} asked): the request alone is larger than the cap of {} bytes",
        options_.name, rounded, what, bytes, options_.cap_bytes));
  }
  return Status::resource_exhausted(fmt::format(
      "{}: cannot allocate {} bytes for {} ({} asked): the cap is {} bytes and {} are in use in {} blocks "
      "({} more cached could not be freed)",
      options_.name, rounded, what, bytes, options_.cap_bytes, stats_.in_use, stats_.blocks_in_use, stats_.cached));
}

void CachingAllocator::release(DeviceBlock& block) noexcept {
  std::lock_guard lock(mutex_);
  stats_.in_use -= block.capacity_;
  stats_.requested -= block.size_;
  --stats_.blocks_in_use;
  stats_.cached += block.capacity_;
  ++stats_.blocks_cached;
  if (block.uses_.empty()) {
    free_[block.stream_].emplace(block.capacity_, block.data_);
    return;
  }
  Pending pending{block.data_, block.capacity_, block.stream_, {}};
  for (const StreamKey use : block.uses_) {
    Result<FenceKey> fence = backend_->record_fence(use);
    if (!fence.is_ok()) {
      // Without the fence nothing orders reuse after that stream's work. Wait for the fences that
      // were recorded and free the block (cudaFree waits for the device's work).
      log(LogLevel::kWarning, fence.status()
                                  .with_context(fmt::format("{}: recording a fence for a returned block of {} bytes; "
                                                            "the block is freed instead of cached",
                                                            options_.name, block.capacity_))
                                  .to_string());
      for (const FenceKey f : pending.fences) {
        (void)backend_->wait_fence(f);
        backend_->release_fence(f);
      }
      stats_.cached -= block.capacity_;
      --stats_.blocks_cached;
      free_block(block.data_, block.capacity_);
      return;
    }
    pending.fences.push_back(fence.value());
  }
  pending_.push_back(std::move(pending));
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

DeviceBlock::DeviceBlock(DeviceBlock&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      capacity_(std::exchange(other.capacity_, 0)),
      stream_(other.stream_),
      uses_(std::move(other.uses_)) {
  other.uses_.clear();
}

DeviceBlock& DeviceBlock::operator=(DeviceBlock&& other) noexcept {
  if (this != &other) {
    reset();
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    stream_ = other.stream_;
    uses_ = std::move(other.uses_);
    other.uses_.clear();
  }
  return *this;
}

void DeviceBlock::record_use(StreamKey stream) {
  if (data_ == nullptr || stream == stream_) return;
  if (std::find(uses_.begin(), uses_.end(), stream) == uses_.end()) uses_.push_back(stream);
}

void DeviceBlock::reset() {
  if (owner_ != nullptr && data_ != nullptr) owner_->release(*this);
  owner_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  capacity_ = 0;
  uses_.clear();
}

}  // namespace zinf::device
