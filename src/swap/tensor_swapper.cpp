// TensorSwapper: CPU tier, staged copies and chunked streaming between host memory and the store.
#include "zinf/swap/tensor_swapper.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <utility>

#include <fmt/format.h>

#include "swap/tensor_scheduler.h"

namespace zinf::swap {

using detail::Op;
using detail::TensorEntry;

namespace {

constexpr std::size_t kMinChunk = std::size_t{64} << 10;

// Moves bytes [offset, offset + length) of a tensor between the store and a ChunkSink /
// ChunkSource through pool chunks, keeping up to two chunks in flight.
class Streamer {
 public:
  Streamer(PinnedPool& pool, SwapStore& store, std::size_t chunk_bytes)
      : pool_(pool), store_(store), chunk_(chunk_bytes) {}

  Status read(const std::string& key, std::uint64_t length, const ChunkSink& sink) {
    return run(key, 0, length, [&](Slot& s) { return sink(s.offset, {s.block.data(), s.length}); }, nullptr);
  }
  Status write(const std::string& key, std::uint64_t offset, std::uint64_t length, const ChunkSource& source) {
    return run(key, offset, length, nullptr,
               [&](Slot& s) { return source(s.offset - offset, {s.block.data(), s.length}); });
  }

 private:
  struct Slot {
    PinnedBlock block;
    std::uint64_t offset = 0;
    std::size_t length = 0;
    IoBatch io;
  };
  using SlotFn = std::function<Status(Slot&)>;

  Status run(const std::string& key, std::uint64_t offset, std::uint64_t length, const SlotFn& consume,
             const SlotFn& fill) {
    std::deque<Slot> inflight;
    Status failed;
    const std::uint64_t end = offset + length;
    std::uint64_t next = offset;
    for (;;) {
      while (failed.is_ok() && next < end && inflight.size() < 2) {
        const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(chunk_, end - next));
        const std::size_t least = std::min(want, kMinChunk);
        Result<PinnedBlock> block =
            inflight.empty() ? pool_.acquire_chunk(want, least) : pool_.try_acquire_chunk(want, least);
        if (!block.is_ok()) {
          failed = block.status();
          break;
        }
        if (!*block) break;  // no second chunk now: go on with one
        Slot s;
        s.offset = next;
        s.length = static_cast<std::size_t>(std::min<std::uint64_t>(block->size(), end - next));
        s.block = std::move(block).value();
        if (fill) failed = fill(s);
        if (!failed.is_ok()) break;
        Result<IoBatch> io = fill ? store_.write_async(key, s.offset, s.block.data(), s.length)
                                  : store_.read_async(key, s.offset, s.block.data(), s.length);
        if (!io.is_ok()) {
          failed = io.status();
          break;
        }
        s.io = std::move(io).value();
        next += s.length;
        inflight.push_back(std::move(s));
      }
      if (inflight.empty()) return failed;
      Slot& front = inflight.front();
      Status st = store_.wait(front.io);
      if (st.is_ok() && failed.is_ok() && consume) st = consume(front);
      if (!st.is_ok() && failed.is_ok()) failed = std::move(st);
      inflight.pop_front();
    }
  }

  PinnedPool& pool_;
  SwapStore& store_;
  std::size_t chunk_;
};

Status check_range(const TensorEntry& e, std::uint64_t offset, std::size_t nbytes) {
  if (offset % kSwapAlignment == 0 && offset + nbytes <= e.nbytes &&
      (nbytes % kSwapAlignment == 0 || offset + nbytes == e.nbytes)) {
    return Status::ok();
  }
  return Status::invalid_argument(fmt::format(
      "range [{}, {}) of a {}-byte tensor: offset must be a multiple of {}, and the length too unless "
      "the range ends the tensor", offset, offset + nbytes, e.nbytes, kSwapAlignment));
}

}  // namespace

struct TensorSwapper::Scheduler : detail::Scheduler {
  using detail::Scheduler::Scheduler;
};

Status SwapTicket::wait() const {
  if (!state_) return Status::ok();
  std::unique_lock lock(state_->mutex);
  state_->cv.wait(lock, [&] { return state_->done; });
  return state_->status;
}

bool SwapTicket::ready() const {
  if (!state_) return true;
  std::lock_guard lock(state_->mutex);
  return state_->done;
}

SwapCompletion::SwapCompletion() : state_(std::make_shared<detail::TicketState>()) {}

void SwapCompletion::complete(Status status) const { state_->complete(std::move(status)); }

TensorSwapper::TensorSwapper() = default;

TensorSwapper::~TensorSwapper() { scheduler_.reset(); }

Result<std::unique_ptr<TensorSwapper>> TensorSwapper::create(const TensorSwapperConfig& config, PinnedPool& pool,
                                                             SwapStore& store) {
  std::unique_ptr<TensorSwapper> s(new TensorSwapper());
  s->config_ = config;
  s->pool_ = &pool;
  s->store_ = &store;
  const std::size_t region = std::max(pool.resident_capacity(), pool.streaming_reserve());
  const std::size_t wanted = config.chunk_bytes != 0 ? config.chunk_bytes : pool.budget().buffer_bytes();
  s->chunk_bytes_ = static_cast<std::size_t>(
      std::max<std::uint64_t>(kSwapAlignment, align_down(std::min(wanted, region), kSwapAlignment)));
  s->scheduler_ = std::make_unique<Scheduler>(pool, config.io_threads);
  return s;
}

Status TensorSwapper::declare(const std::string& key, DType dtype, std::uint64_t numel) {
  Scheduler& sch = *scheduler_;
  std::unique_lock lock(sch.mutex);
  if (auto it = sch.entries.find(key); it != sch.entries.end()) {
    if (it->second->dtype == dtype && it->second->numel == numel) return Status::ok();
    return Status::invalid_argument(fmt::format("tensor '{}' was declared as {} x {} and now as {} x {}", key,
                                                it->second->numel, dtype_name(it->second->dtype), numel,
                                                dtype_name(dtype)));
  }
  auto e = std::make_unique<TensorEntry>();
  e->key = key;
  e->dtype = dtype;
  e->numel = numel;
  e->nbytes = numel * dtype_size(dtype);
  Result<TensorRecord> existing = store_->find(key);
  const bool adopt = existing.is_ok() && existing->dtype == dtype && existing->numel == numel;
  if (!adopt) ZINF_RETURN_IF_ERROR(store_->allocate(key, dtype, numel).status());
  if (numel > 0 && sch.cpu_elements + numel <= config_.max_in_cpu) {
    ZINF_ASSIGN_OR_RETURN(e->cpu, detail::HostBuffer::allocate(e->nbytes, config_.pin_memory));
    if (adopt) ZINF_RETURN_IF_ERROR(store_->read(key, 0, e->cpu.data(), e->nbytes));
    e->home = Tier::kCpu;
    sch.cpu_elements += numel;
  }
  sch.entries.emplace(key, std::move(e));
  return Status::ok();
}

std::uint64_t TensorSwapper::cpu_elements() const {
  std::lock_guard lock(scheduler_->mutex);
  return scheduler_->cpu_elements;
}

Result<TensorInfo> TensorSwapper::info(const std::string& key) const {
  std::lock_guard lock(scheduler_->mutex);
  auto it = scheduler_->entries.find(key);
  if (it == scheduler_->entries.end()) return Status::not_found(fmt::format("no tensor '{}' was declared", key));
  const TensorEntry& e = *it->second;
  return TensorInfo{e.key, e.dtype, e.numel, e.nbytes, e.home, e.staged_valid, e.views};
}

namespace {

// Queues an operation on `key`; the ticket is already failed when the key is unknown.
std::shared_ptr<detail::TicketState> enqueue_op(detail::Scheduler& sch, const std::string& key,
                                                std::string_view verb,
                                                std::function<Status(TensorEntry&, Op&)> run,
                                                std::function<std::size_t(TensorEntry&)> resident_bytes) {
  std::unique_lock lock(sch.mutex);
  auto it = sch.entries.find(key);
  if (it == sch.entries.end()) {
    return detail::make_ready_ticket(
        Status::not_found(fmt::format("{} '{}': no such tensor was declared", verb, key)));
  }
  auto op = std::make_unique<Op>();
  op->what = fmt::format("{} '{}'", verb, key);
  op->run = std::move(run);
  op->resident_bytes = std::move(resident_bytes);
  op->ticket = std::make_shared<detail::TicketState>();
  std::shared_ptr<detail::TicketState> ticket = op->ticket;
  sch.enqueue(lock, *it->second, std::move(op));
  return ticket;
}

// The resident copy an operation writes through or reads from (the CPU tier or the staged
// block; null if none). A staged copy is pinned while the operation uses it, so that a view
// destroyed meanwhile on another thread cannot give it back under the operation.
class ResidentCopy {
 public:
  ResidentCopy(detail::Scheduler& sch, TensorEntry& e) : sch_(sch), e_(e) {
    if (e.home == Tier::kCpu) {
      data_ = e.cpu.data();
      return;
    }
    std::lock_guard lock(sch.mutex);
    if (e.staged_valid) {
      data_ = e.staged.data();
      ++e.views;
      pinned_ = true;
    }
  }
  ~ResidentCopy() {
    if (pinned_) detail::unpin_staged(sch_, e_);
  }
  ResidentCopy(const ResidentCopy&) = delete;
  ResidentCopy& operator=(const ResidentCopy&) = delete;
  std::byte* data() const { return data_; }

 private:
  detail::Scheduler& sch_;
  TensorEntry& e_;
  std::byte* data_ = nullptr;
  bool pinned_ = false;
};

}  // namespace

SwapTicket TensorSwapper::swap_out(const std::string& key, const void* src) {
  return swap_out(key, [src](std::uint64_t offset, std::span<std::byte> out) {
    std::memcpy(out.data(), static_cast<const std::byte*>(src) + offset, out.size());
    return Status::ok();
  });
}

SwapTicket TensorSwapper::swap_out(const std::string& key, ChunkSource source) {
  auto run = [this, source = std::move(source)](TensorEntry& e, Op&) -> Status {
    const ResidentCopy resident(*scheduler_, e);
    if (std::byte* copy = resident.data()) {
      ZINF_RETURN_IF_ERROR(source(0, {copy, e.nbytes}));
      return store_->write(e.key, 0, copy, e.nbytes);
    }
    return Streamer(*pool_, *store_, chunk_bytes_).write(e.key, 0, e.nbytes, source);
  };
  return SwapTicket(enqueue_op(*scheduler_, key, "swap_out", std::move(run), nullptr));
}

SwapTicket TensorSwapper::write_range(const std::string& key, std::uint64_t offset, std::span<const std::byte> src,
                                      bool src_padded) {
  auto run = [this, offset, src, src_padded](TensorEntry& e, Op&) -> Status {
    ZINF_RETURN_IF_ERROR(check_range(e, offset, src.size()));
    const ResidentCopy resident(*scheduler_, e);
    if (std::byte* copy = resident.data()) {
      std::memcpy(copy + offset, src.data(), src.size());
      return store_->write(e.key, offset, copy + offset, src.size());
    }
    const bool aligned = reinterpret_cast<std::uintptr_t>(src.data()) % kSwapAlignment == 0;
    if (aligned && (src_padded || src.size() % kSwapAlignment == 0)) {
      return store_->write(e.key, offset, src.data(), src.size());
    }
    return Streamer(*pool_, *store_, chunk_bytes_)
        .write(e.key, offset, src.size(), [src](std::uint64_t at, std::span<std::byte> out) {
          std::memcpy(out.data(), src.data() + at, out.size());
          return Status::ok();
        });
  };
  return SwapTicket(enqueue_op(*scheduler_, key, "write_range", std::move(run), nullptr));
}

SwapTicket TensorSwapper::swap_in(const std::string& key, void* dst) {
  return swap_in(key, [dst](std::uint64_t offset, std::span<const std::byte> bytes) {
    std::memcpy(static_cast<std::byte*>(dst) + offset, bytes.data(), bytes.size());
    return Status::ok();
  });
}

SwapTicket TensorSwapper::swap_in(const std::string& key, ChunkSink sink) {
  auto run = [this, sink = std::move(sink)](TensorEntry& e, Op&) -> Status {
    const ResidentCopy resident(*scheduler_, e);
    if (const std::byte* copy = resident.data()) return sink(0, {copy, e.nbytes});
    return Streamer(*pool_, *store_, chunk_bytes_).read(e.key, e.nbytes, sink);
  };
  return SwapTicket(enqueue_op(*scheduler_, key, "swap_in", std::move(run), nullptr));
}

namespace {

// Whether the tensor still needs a staged copy, and so pool memory.
std::size_t staging_bytes(detail::Scheduler& sch, TensorEntry& e) {
  if (e.home == Tier::kCpu || e.nbytes == 0) return 0;
  std::lock_guard lock(sch.mutex);
  return e.staged_valid ? 0 : static_cast<std::size_t>(e.nbytes);
}

}  // namespace

SwapTicket TensorSwapper::prefetch(const std::string& key) {
  {
    // A tensor that can never be staged fails now, not when its turn comes.
    std::lock_guard lock(scheduler_->mutex);
    auto it = scheduler_->entries.find(key);
    if (it != scheduler_->entries.end() && it->second->home != Tier::kCpu &&
        it->second->nbytes > pool_->resident_capacity()) {
      Result<PinnedBlock> probe = pool_->try_acquire(static_cast<std::size_t>(it->second->nbytes));
      return SwapTicket(detail::make_ready_ticket(probe.status().with_context(fmt::format("prefetch '{}'", key))));
    }
  }
  auto run = [this](TensorEntry& e, Op& op) -> Status {
    if (!op.block) return Status::ok();  // resident already
    Status read = store_->read(e.key, 0, op.block.data(), e.nbytes);
    std::lock_guard lock(scheduler_->mutex);
    if (!read.is_ok()) {
      e.prefetch_failed = read;
      return read;
    }
    e.staged = std::move(op.block);
    e.staged_valid = true;
    return Status::ok();
  };
  auto bytes = [this](TensorEntry& e) { return staging_bytes(*scheduler_, e); };
  return SwapTicket(enqueue_op(*scheduler_, key, "prefetch", std::move(run), std::move(bytes)));
}

SwapTicket TensorSwapper::release(const std::string& key) {
  auto run = [this](TensorEntry& e, Op&) -> Status {
    PinnedBlock freed;
    std::lock_guard lock(scheduler_->mutex);
    if (e.views > 0) {
      e.release_pending = e.staged_valid;
    } else {
      freed = std::move(e.staged);
      e.staged_valid = false;
    }
    return Status::ok();
  };
  return SwapTicket(enqueue_op(*scheduler_, key, "release", std::move(run), nullptr));
}

Result<TensorView> TensorSwapper::acquire(const std::string& key) {
  // Stages the tensor; fails with this read's error, or with an earlier prefetch's (one whose
  // ticket nobody waited for): a read that failed is an I/O error to report, even when the
  // read after it succeeded.
  auto stage = [&]() -> Status {
    Status st = prefetch(key).wait();
    Status earlier;
    {
      std::lock_guard lock(scheduler_->mutex);
      auto it = scheduler_->entries.find(key);
      if (it != scheduler_->entries.end()) earlier = std::exchange(it->second->prefetch_failed, Status::ok());
    }
    if (!st.is_ok()) return st;
    return earlier.is_ok() ? earlier : earlier.with_context(fmt::format("acquire '{}': an earlier read ahead of it failed", key));
  };
  ZINF_RETURN_IF_ERROR(stage());
  // Pin under the lock; a release queued after our prefetch may have run, so stage again if so.
  for (int attempt = 0; attempt < 3; ++attempt) {
    {
      std::lock_guard lock(scheduler_->mutex);
      TensorEntry& e = *scheduler_->entries.at(key);
      const std::byte* data = e.home == Tier::kCpu ? e.cpu.data() : (e.staged_valid ? e.staged.data() : nullptr);
      if (data != nullptr || e.nbytes == 0) {
        ++e.views;
        e.release_pending = false;
        TensorView view;
        view.owner_ = this;
        view.entry_ = &e;
        view.data_ = data;
        view.size_ = static_cast<std::size_t>(e.nbytes);
        return view;
      }
    }
    ZINF_RETURN_IF_ERROR(stage());
  }
  return Status::aborted(fmt::format("acquire '{}': released by another thread each time it was staged", key));
}

void TensorSwapper::unpin(TensorEntry* entry) { detail::unpin_staged(*scheduler_, *entry); }

Status TensorSwapper::flush() {
  scheduler_->wait_idle();
  return store_->commit();
}

TensorView::TensorView(TensorView&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      entry_(std::exchange(other.entry_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

TensorView& TensorView::operator=(TensorView&& other) noexcept {
  if (this != &other) {
    reset();
    owner_ = std::exchange(other.owner_, nullptr);
    entry_ = std::exchange(other.entry_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void TensorView::reset() {
  if (owner_ == nullptr) return;
  owner_->unpin(entry_);
  owner_ = nullptr;
  entry_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

}  // namespace zinf::swap
