// The host device: streams as threads with FIFOs, events as (stream, sequence number).
#include "device/host_device.h"

#include "device/host_ops.h"

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

namespace zinf::device {

const char* stream_role_name(StreamRole role) {
  switch (role) {
    case StreamRole::kCompute: return "compute";
    case StreamRole::kH2D: return "H2D";
    case StreamRole::kD2H: return "D2H";
  }
  return "?";
}

namespace {

// One stream: a thread that runs its items in order. Items are numbered from 1; completed_ is how
// many have finished (run, or dropped after a failure).
class HostStream {
 public:
  HostStream(StreamRole role, std::chrono::microseconds max_delay, std::uint64_t seed)
      : role_(role), max_delay_(max_delay), rng_(seed * 3 + static_cast<std::uint64_t>(role) + 1) {
    thread_ = std::thread([this] { run(); });
  }
  ~HostStream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  HostStream(const HostStream&) = delete;
  HostStream& operator=(const HostStream&) = delete;

  StreamRole role() const { return role_; }

  // Appends an item; the stream's failure if it has failed already.
  Status push(std::function<Status()> fn, std::string_view what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.is_ok()) return failure_;
    items_.push_back(Item{std::move(fn), std::string(what)});
    ++enqueued_;
    cv_.notify_all();
    return Status::ok();
  }

  // The number of the last item enqueued: an event there completes when everything so far has.
  Result<std::uint64_t> mark() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.is_ok()) return failure_;
    return enqueued_;
  }

  // Blocks until item `seq` has finished; its failure, or an earlier item's, if any.
  Status wait_for(std::uint64_t seq) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return completed_ >= seq; });
    return failed_at_ != 0 && failed_at_ <= seq ? failure_ : Status::ok();
  }

  Result<bool> done(std::uint64_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_at_ != 0 && failed_at_ <= seq) return failure_;
    return completed_ >= seq;
  }

 private:
  struct Item {
    std::function<Status()> fn;
    std::string what;
  };

  void run() {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !items_.empty(); });
        if (items_.empty()) return;  // stopping, and everything has run
        item = std::move(items_.front());
        items_.pop_front();
      }
      if (max_delay_.count() > 0) {
        std::uniform_int_distribution<long long> d(0, max_delay_.count());
        std::this_thread::sleep_for(std::chrono::microseconds(d(rng_)));
      }
      Status st = item.fn();
      std::lock_guard<std::mutex> lock(mu_);
      ++completed_;
      if (!st.is_ok() && failure_.is_ok()) {
        failure_ = st.with_context(fmt::format("host device, {} stream, '{}'", stream_role_name(role_), item.what));
        failed_at_ = completed_;
        // Later items are dropped, as a GPU context with a sticky error runs nothing more.
        completed_ += items_.size();
        items_.clear();
      }
      done_cv_.notify_all();
    }
  }

  const StreamRole role_;
  const std::chrono::microseconds max_delay_;
  std::mt19937_64 rng_;  // only the stream's thread draws
  std::mutex mu_;
  std::condition_variable cv_;       // items or stopping
  std::condition_variable done_cv_;  // completed_ moved
  std::deque<Item> items_;
  std::uint64_t enqueued_ = 0;
  std::uint64_t completed_ = 0;
  std::uint64_t failed_at_ = 0;  // the failed item's number; 0: none
  Status failure_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after every other member is built
};

class HostEventState final : public EventState {
 public:
  HostEventState(std::shared_ptr<HostStream> stream, std::uint64_t seq) : stream_(std::move(stream)), seq_(seq) {}
  HostStream& stream() const { return *stream_; }
  std::uint64_t seq() const { return seq_; }

 private:
  std::shared_ptr<HostStream> stream_;
  std::uint64_t seq_;
};

// A fence is an event's state, owned through the FenceKey until release_fence.
struct HostFence {
  std::shared_ptr<HostStream> stream;
  std::uint64_t seq;
};

constexpr std::size_t kAlignment = 256;  // as cudaMalloc's

class HostBackend final : public AllocatorBackend {
 public:
  explicit HostBackend(std::array<std::shared_ptr<HostStream>, kStreamRoles> streams) : streams_(std::move(streams)) {}

  Result<void*> allocate(std::size_t bytes) override {
    const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (p == nullptr) return Status::resource_exhausted(fmt::format("host device: cannot allocate {} bytes", bytes));
    return p;
  }
  void deallocate(void* ptr, std::size_t) noexcept override { std::free(ptr); }

  Result<FenceKey> record_fence(StreamKey key) override {
    for (const auto& s : streams_) {
      if (reinterpret_cast<StreamKey>(s.get()) != key) continue;
      ZINF_ASSIGN_OR_RETURN(std::uint64_t seq, s->mark());
      return reinterpret_cast<FenceKey>(new HostFence{s, seq});
    }
    return Status::invalid_argument(fmt::format("host device: a fence on stream {:#x}, which is none of its streams", key));
  }
  Result<bool> fence_done(FenceKey fence) override {
    const auto* f = reinterpret_cast<const HostFence*>(fence);
    return f->stream->done(f->seq);
  }
  Status wait_fence(FenceKey fence) override {
    const auto* f = reinterpret_cast<const HostFence*>(fence);
    return f->stream->wait_for(f->seq);
  }
  void release_fence(FenceKey fence) noexcept override { delete reinterpret_cast<HostFence*>(fence); }

 private:
  std::array<std::shared_ptr<HostStream>, kStreamRoles> streams_;
};

const HostEventState* host_state(const Event& event) { return dynamic_cast<const HostEventState*>(event.state()); }

}  // namespace

class HostDevice::Impl {
 public:
  explicit Impl(HostDeviceOptions o) : options(o) {
    for (int r = 0; r < kStreamRoles; ++r) {
      streams[static_cast<std::size_t>(r)] =
          std::make_shared<HostStream>(static_cast<StreamRole>(r), options.max_delay, options.seed);
    }
    CachingAllocatorOptions ao;
    ao.cap_bytes = options.memory_cap;
    ao.name = "host device memory";
    alloc = std::make_unique<CachingAllocator>(std::make_unique<HostBackend>(streams), ao);
  }
  HostStream& stream(StreamRole role) { return *streams[static_cast<std::size_t>(role)]; }

  // Copies a copy stream has run: memcpy time (delays and waits excluded), for copy_seconds().
  Status copy(StreamRole role, void* dst, const void* src, std::size_t bytes) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst, src, bytes);
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0);
    copy_ns[static_cast<std::size_t>(role)].fetch_add(static_cast<std::uint64_t>(ns.count()));
    return Status::ok();
  }

  HostDeviceOptions options;
  std::array<std::atomic<std::uint64_t>, kStreamRoles> copy_ns{};
  std::array<std::shared_ptr<HostStream>, kStreamRoles> streams;
  std::unique_ptr<CachingAllocator> alloc;  // after the streams: destroyed first, while they run
};

std::unique_ptr<HostDevice> HostDevice::create(HostDeviceOptions options) {
  return std::unique_ptr<HostDevice>(new HostDevice(std::make_unique<Impl>(options)));
}

HostDevice::HostDevice(std::unique_ptr<Impl> impl) : impl_(std::move(impl)), ops_(make_host_ops(*this)) {}

DeviceOps* HostDevice::ops() { return ops_.get(); }

HostDevice::~HostDevice() {
  // Every stream's work first (blocks it uses are returned by their owners before this).
  (void)synchronize_all();
}

std::string HostDevice::describe() const {
  const HostDeviceOptions& o = impl_->options;
  if (o.max_delay.count() == 0) return "host device";
  return fmt::format("host device (delays up to {} us, seed {})", o.max_delay.count(), o.seed);
}

StreamKey HostDevice::stream_key(StreamRole role) const {
  return reinterpret_cast<StreamKey>(impl_->streams[static_cast<std::size_t>(role)].get());
}

Result<DeviceBlock> HostDevice::allocate(std::size_t bytes, StreamRole role, std::string_view what) {
  ZINF_ASSIGN_OR_RETURN(DeviceBlock block, impl_->alloc->allocate(bytes, stream_key(role), what));
  if (impl_->options.poison_new_blocks && block.data() != nullptr) {
    // Poisoned as the block's own stream sees it: after the work already queued there, which may
    // still use the block's previous life (reuse on one stream is ordered by that stream, as on a
    // GPU, where allocating writes nothing): now when that stream is idle, else as its next item.
    // Work on other streams is not waited for: a block they still use without having declared it
    // (record_use) is poisoned under them, as it should be.
    void* p = block.data();
    const std::size_t n = block.capacity();
    ZINF_ASSIGN_OR_RETURN(Event queued, record(role));
    ZINF_ASSIGN_OR_RETURN(const bool idle, query(queued));
    if (idle) {
      std::memset(p, 0xFF, n);
    } else {
      ZINF_RETURN_IF_ERROR(enqueue(role, [p, n](const StreamContext&) {
        std::memset(p, 0xFF, n);
        return Status::ok();
      }, "poison a new block"));
    }
  }
  return block;
}

AllocatorStats HostDevice::allocator_stats() const { return impl_->alloc->stats(); }
Result<std::uint64_t> HostDevice::memory_room() const {
  const std::size_t cap = impl_->alloc->cap();
  if (cap == 0) return UINT64_MAX;
  const std::size_t in_use = impl_->alloc->stats().in_use;
  return static_cast<std::uint64_t>(cap > in_use ? cap - in_use : 0);
}

namespace {
Status check_copy(const void* dst, const void* src, std::size_t bytes, const char* dir, std::string_view what) {
  if (bytes > 0 && (dst == nullptr || src == nullptr)) {
    return Status::invalid_argument(fmt::format("host device: {} copy '{}' of {} bytes with a null pointer", dir, what, bytes));
  }
  return Status::ok();
}
}  // namespace

Status HostDevice::copy_h2d(void* device_dst, const void* host_src, std::size_t bytes, std::string_view what) {
  ZINF_RETURN_IF_ERROR(check_copy(device_dst, host_src, bytes, "H2D", what));
  if (bytes == 0) return Status::ok();
  return impl_->stream(StreamRole::kH2D).push(
      [=, impl = impl_.get()] { return impl->copy(StreamRole::kH2D, device_dst, host_src, bytes); }, what);
}

Status HostDevice::copy_d2h(void* host_dst, const void* device_src, std::size_t bytes, std::string_view what) {
  ZINF_RETURN_IF_ERROR(check_copy(host_dst, device_src, bytes, "D2H", what));
  if (bytes == 0) return Status::ok();
  return impl_->stream(StreamRole::kD2H).push(
      [=, impl = impl_.get()] { return impl->copy(StreamRole::kD2H, host_dst, device_src, bytes); }, what);
}

Status HostDevice::fill_zero(StreamRole role, void* device_ptr, std::size_t bytes, std::string_view what) {
  if (bytes == 0) return Status::ok();
  if (device_ptr == nullptr) return Status::invalid_argument(fmt::format("host device: zero '{}' at a null pointer", what));
  return impl_->stream(role).push([=] {
    std::memset(device_ptr, 0, bytes);
    return Status::ok();
  }, what);
}

Result<double> HostDevice::copy_seconds(StreamRole role) const {
  return static_cast<double>(impl_->copy_ns[static_cast<std::size_t>(role)].load()) * 1e-9;
}

Status HostDevice::enqueue(StreamRole role, Work work, std::string_view what) {
  if (!work) return Status::invalid_argument(fmt::format("host device: enqueue '{}' without work", what));
  return impl_->stream(role).push([work = std::move(work), role] { return work(StreamContext{nullptr, role}); }, what);
}

Result<Event> HostDevice::record(StreamRole role) {
  const std::shared_ptr<HostStream>& s = impl_->streams[static_cast<std::size_t>(role)];
  ZINF_ASSIGN_OR_RETURN(std::uint64_t seq, s->mark());
  return Event(std::make_shared<HostEventState>(s, seq));
}

Status HostDevice::wait(StreamRole role, const Event& event) {
  if (event.empty()) return Status::ok();
  const HostEventState* e = host_state(event);
  if (e == nullptr) return Status::invalid_argument("host device: wait on an event of another device");
  // The item holds the event's stream alive; it blocks this stream until the event completes.
  auto state = std::make_shared<HostEventState>(*e);
  return impl_->stream(role).push([state] { return state->stream().wait_for(state->seq()); },
                                  fmt::format("wait for the {} stream's item {}", stream_role_name(e->stream().role()),
                                              e->seq()));
}

Status HostDevice::synchronize(const Event& event) {
  if (event.empty()) return Status::ok();
  const HostEventState* e = host_state(event);
  if (e == nullptr) return Status::invalid_argument("host device: synchronize on an event of another device");
  return e->stream().wait_for(e->seq());
}

Result<bool> HostDevice::query(const Event& event) {
  if (event.empty()) return true;
  const HostEventState* e = host_state(event);
  if (e == nullptr) return Status::invalid_argument("host device: query of an event of another device");
  return e->stream().done(e->seq());
}

Status HostDevice::synchronize_all() {
  Status first;
  for (int r = 0; r < kStreamRoles; ++r) {
    HostStream& s = impl_->stream(static_cast<StreamRole>(r));
    Result<std::uint64_t> seq = s.mark();
    Status st = seq.is_ok() ? s.wait_for(*seq) : seq.status();
    if (first.is_ok() && !st.is_ok()) first = st;
  }
  return first;
}

}  // namespace zinf::device
