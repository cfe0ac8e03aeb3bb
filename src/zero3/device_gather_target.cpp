// The device gather target: device blocks from the device's caching allocator, uploads and
// gradient downloads through pinned staging on the copy streams (device_gather_target.h).
#include "zero3/device_gather_target.h"

#include <chrono>
#include <cstring>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "device/ops.h"
#include "zinf/aio/pinned.h"
#include "zinf/optim/half.h"

namespace zinf::zero3 {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

using device::StreamRole;
using SkipWait = DeviceGatherOptions::SkipWait;

class DeviceGatherTargetImpl final : public DeviceGatherTarget {
 public:
  DeviceGatherTargetImpl(device::Device& device, DeviceGatherOptions options) : device_(device), options_(options) {}

  ~DeviceGatherTargetImpl() override {
    // Staging and download buffers may still be read by a copy stream: drain before they go.
    (void)device_.synchronize_all();
  }

  std::string_view name() const override { return "device"; }
  swap::DType values_dtype() const override { return options_.values; }
  bool asynchronous() const override { return true; }
  const DeviceGatherStats& device_stats() const override { return stats_; }
  device::Device& device() const override { return device_; }

  GatherBlock allocate(std::size_t n) override {
    if (n == 0) return {};
    // Blocks are for the thread that drives the passes (the compute stream's role, on which
    // nothing is enqueued); every copy that touches one declares its stream (record_use), so a
    // returned block is reused only once those copies are done.
    auto block = device_.allocate(n * sizeof(float), StreamRole::kCompute, "gathered parameters or gradients");
    if (!block.is_ok()) return {};
    auto* p = block.value().as<float>();
    blocks_.emplace(p, BlockState{std::move(block).value(), device::Event(), Narrow{}});
    return adopt(p, n);
  }

  GatherBlock allocate_values(std::size_t n) override {
    if (options_.values == swap::DType::kF32) return allocate(n);
    if (n == 0) return {};
    auto block = device_.allocate(n * swap::dtype_size(options_.values), StreamRole::kCompute,
                                  fmt::format("gathered parameters ({})", swap::dtype_name(options_.values)));
    if (!block.is_ok()) return {};
    auto* p = block.value().as<float>();  // the block's memory, n 16-bit values
    blocks_.emplace(p, BlockState{std::move(block).value(), device::Event(), Narrow{}});
    return adopt(p, n);
  }

  Status gather(ParamTier& tier, std::size_t group, std::size_t per_rank, Communicator& comm,
                GatherBlock& block) override {
    if (on_stream() && comm.world_size() > 1 && options_.collectives == nullptr) {
      return Status::internal(fmt::format(
          "{}: gathering into device memory for kernels on its compute stream with {} ranks, and no device "
          "collectives were given",
          device_.describe(), comm.world_size()));
    }
    BlockState& state = state_of(block);
    if (options_.values != swap::DType::kF32) return gather_narrow(tier, group, per_rank, comm, block, state);
    const std::size_t bytes = per_rank * sizeof(float);
    if (const ParamTier::DeviceValues v = tier.device_values(group); v.data != nullptr) {
      // A device-resident tier (device_state.h, one rank): copied on the compute stream, in order
      // after the optimizer step that wrote it and before the kernels that read the block.
      if (device_.ops() == nullptr) return Status::internal(fmt::format("{}: no device arithmetic", device_.describe()));
      ZINF_RETURN_IF_ERROR(device_.ops()->convert(StreamRole::kCompute, block.data(), swap::DType::kF32, v.data, v.dtype, per_rank));
      ZINF_ASSIGN_OR_RETURN(state.ready, device_.record(StreamRole::kCompute));
      return Status::ok();
    }
    if (const ParamTier::HostValues h = tier.pinned_values(group);
        h.data != nullptr && h.dtype != swap::DType::kF32 && comm.world_size() == 1 && device_.ops() != nullptr) {
      return upload_narrow(state, h, per_rank);
    }
    ZINF_ASSIGN_OR_RETURN(Staging * staging, take_staging(bytes));
    ZINF_RETURN_IF_ERROR(tier.read_f32(group, std::span<float>(staging->buf.as_floats(), per_rank)));
    float* mine = block.data() + per_rank * static_cast<std::size_t>(comm.rank());
    ZINF_ASSIGN_OR_RETURN(const device::Event landed,
                          upload_slice(state, mine, staging->buf.data(), bytes, staging, "parameter upload"));
    if (comm.world_size() > 1 && on_stream()) {
      return all_gather_on_device(state, landed, [&] {
        return options_.collectives->all_gather(StreamRole::kD2H, block.data(), per_rank);
      });
    }
    if (comm.world_size() > 1) {
      // The host collective runs on this thread, in the order every rank issues them: the slice
      // must have landed first.
      ZINF_RETURN_IF_ERROR(ready(block));
      ZINF_RETURN_IF_ERROR(comm.all_gather(std::span<const float>(mine, per_rank), block.span()));
    }
    return Status::ok();
  }

  Status ready(GatherBlock& block) override {
    BlockState& state = state_of(block);
    if (state.narrow.block.data() != nullptr) ZINF_RETURN_IF_ERROR(widen(block, state));
    if (state.ready.empty()) return Status::ok();
    if (on_stream()) {
      // The compute stream waits; the host goes on enqueueing.
      if (options_.skip_wait != SkipWait::kUploadBeforeUse) ZINF_RETURN_IF_ERROR(device_.wait(StreamRole::kCompute, state.ready));
    } else if (options_.skip_wait != SkipWait::kUploadBeforeUse) {
      const auto t0 = Clock::now();
      ZINF_RETURN_IF_ERROR(device_.synchronize(state.ready));
      stats_.ready_wait_s += since(t0);
    }
    state.ready = device::Event();
    return Status::ok();
  }

  Status zero(GatherBlock& block) override {
    if (on_stream()) {
      return device_.fill_zero(StreamRole::kCompute, block.data(), block.size() * sizeof(float), "gradient buffer");
    }
    // Device memory is host memory here (make_device_gather_target checks). The block may have
    // been a gradient block whose addition into a device-resident store (device_state.h) is
    // still queued on the compute stream: that work goes first.
    ZINF_RETURN_IF_ERROR(compute_done_on_host());
    if (block.size() > 0) std::memset(block.data(), 0, block.size() * sizeof(float));
    return Status::ok();
  }

  Result<std::uint64_t> start_download(const GatherBlock& src, std::size_t offset, std::size_t n) override {
    BlockState& state = state_of(src);
    const std::size_t bytes = n * sizeof(float);
    ZINF_ASSIGN_OR_RETURN(Staging * staging, take_staging(bytes));
    // The kernels that write the gradient were enqueued before grads_ready().
    ZINF_RETURN_IF_ERROR(after_compute(StreamRole::kD2H));
    ZINF_RETURN_IF_ERROR(device_.copy_d2h(staging->buf.data(), src.data() + offset, bytes, "gradient download"));
    state.block.record_use(device_.stream_key(StreamRole::kD2H));
    ZINF_ASSIGN_OR_RETURN(device::Event landed, device_.record(StreamRole::kD2H));
    staging->free_after = landed;
    staging->held = true;  // until release_download
    const std::uint64_t ticket = next_ticket_++;
    downloads_.emplace(ticket, Download{staging, landed, n});
    stats_.d2h_bytes += bytes;
    ++stats_.downloads;
    return ticket;
  }

  Result<std::span<const float>> finish_download(std::uint64_t ticket, bool wait) override {
    auto it = downloads_.find(ticket);
    if (it == downloads_.end()) return Status::internal(fmt::format("no gradient download {}", ticket));
    Download& d = it->second;
    if (options_.skip_wait != SkipWait::kDownloadBeforeRead) {
      if (wait) {
        const auto t0 = Clock::now();
        ZINF_RETURN_IF_ERROR(device_.synchronize(d.landed));
        stats_.download_wait_s += since(t0);
      } else {
        ZINF_ASSIGN_OR_RETURN(bool done, device_.query(d.landed));
        if (!done) return std::span<const float>();
      }
    }
    return std::span<const float>(d.staging->buf.as_floats(), d.n);
  }

  Status add(GatherBlock& acc, const GatherBlock& in) override {
    if (in.size() < acc.size()) {
      return Status::internal(fmt::format("device gather target: adding {} elements into {}", in.size(), acc.size()));
    }
    if (on_stream()) {
      // After the kernels that wrote `in` (enqueued before grads_ready()), on their stream; a
      // later copy out of or into either block waits for the compute stream (after_compute).
      if (device_.ops() == nullptr) return Status::internal(fmt::format("{}: no device arithmetic", device_.describe()));
      return device_.ops()->add(StreamRole::kCompute, acc.data(), in.data(), acc.size());
    }
    // Host memory, written by the model on this thread; an addition into a device-resident store
    // may still be queued on the compute stream and reads blocks like these: it goes first.
    ZINF_RETURN_IF_ERROR(compute_done_on_host());
    return GatherTarget::add(acc, in);
  }

  bool reduces_in_place() const override { return on_stream() && options_.collectives != nullptr; }

  Status reduce_scatter(GatherBlock& grad, std::size_t per_rank) override {
    if (!reduces_in_place()) return GatherTarget::reduce_scatter(grad, per_rank);
    BlockState& state = state_of(grad);
    // After the kernels that wrote the gradient (enqueued before grads_ready()); the download of
    // the rank's slice follows on the same stream.
    ZINF_RETURN_IF_ERROR(after_compute(StreamRole::kD2H));
    ZINF_RETURN_IF_ERROR(options_.collectives->reduce_scatter(StreamRole::kD2H, grad.data(), per_rank));
    state.block.record_use(device_.stream_key(StreamRole::kD2H));
    ++stats_.reduce_scatters;
    return Status::ok();
  }

  Status finish_collectives() override {
    return options_.collectives != nullptr ? options_.collectives->finish() : Status::ok();
  }

  // One buffer is left to uploads (a backward re-gathers while gradients go down), so that
  // neither takes a buffer past staging_buffers (but with one buffer, one download goes on).
  std::size_t max_downloads_in_flight() const override {
    return options_.staging_buffers > 1 ? options_.staging_buffers - 1 : 1;
  }

  void release_download(std::uint64_t ticket) override {
    auto it = downloads_.find(ticket);
    if (it == downloads_.end()) return;
    it->second.staging->held = false;
    downloads_.erase(it);
  }

 protected:
  void free(float* data, std::size_t) override { blocks_.erase(data); }  // ~DeviceBlock fences it

 private:
  // A 16-bit upload waiting to be widened into its block (upload_narrow).
  struct Narrow {
    device::DeviceBlock block;
    swap::DType dtype = swap::DType::kBF16;
    std::size_t n = 0;
  };
  struct BlockState {
    device::DeviceBlock block;
    device::Event ready;  // the upload (or widening) that fills it; empty once ready() has seen it
    Narrow narrow;
  };

  // A memory tier's 16-bit partition, page-locked: uploaded as it is into a scratch block (half
  // the bytes of fp32, no host conversion, no staging). It is widened in ready(), not here: a
  // gather ahead of use must not put a wait for its upload on the compute stream before the
  // kernels of the module that computes now.
  Status upload_narrow(BlockState& state, const ParamTier::HostValues& h, std::size_t n) {
    const std::size_t raw = n * swap::dtype_size(h.dtype);
    ZINF_ASSIGN_OR_RETURN(device::DeviceBlock scratch,
                          device_.allocate(raw, StreamRole::kCompute, "parameter upload (16-bit)"));
    // The scratch may be a block whose last widening is still queued on the compute stream.
    if (options_.skip_wait != SkipWait::kComputeBeforeCopy) {
      ZINF_ASSIGN_OR_RETURN(device::Event computed, device_.record(StreamRole::kCompute));
      ZINF_RETURN_IF_ERROR(device_.wait(StreamRole::kH2D, computed));
    }
    ZINF_RETURN_IF_ERROR(device_.copy_h2d(scratch.data(), h.data, raw, "parameter upload (16-bit)"));
    scratch.record_use(device_.stream_key(StreamRole::kH2D));
    ZINF_ASSIGN_OR_RETURN(state.ready, device_.record(StreamRole::kH2D));
    state.narrow = Narrow{std::move(scratch), h.dtype, n};
    stats_.h2d_bytes += raw;
    ++stats_.uploads;
    return Status::ok();
  }

  // The compute stream waits for the 16-bit upload and widens it into the block; ready() then
  // waits for the widening (on the host for a host-thread consumer; nothing more on the stream).
  Status widen(GatherBlock& block, BlockState& state) {
    Narrow narrow = std::move(state.narrow);
    state.narrow = Narrow{};
    if (options_.skip_wait != SkipWait::kUploadBeforeUse) ZINF_RETURN_IF_ERROR(device_.wait(StreamRole::kCompute, state.ready));
    ZINF_RETURN_IF_ERROR(device_.ops()->convert(StreamRole::kCompute, block.data(), swap::DType::kF32,
                                                narrow.block.data(), narrow.dtype, narrow.n));
    ZINF_ASSIGN_OR_RETURN(state.ready, device_.record(StreamRole::kCompute));
    return Status::ok();  // the scratch goes back: fenced by its upload, ordered on the compute stream
  }
  struct PinnedFloats {
    aio::PinnedBuffer mem;
    float* as_floats() const { return static_cast<float*>(mem.data()); }
    void* data() const { return mem.data(); }
    std::size_t size() const { return mem.size(); }
  };
  struct Staging {
    PinnedFloats buf;
    device::Event free_after;  // the copy that reads (H2D) or fills (D2H) it
    bool held = false;         // a download not yet released
  };
  struct Download {
    Staging* staging;
    device::Event landed;
    std::size_t n;
  };

  // Uploads `bytes` of pinned `src` into `dst`, inside `state`'s block, on the H2D stream after
  // the compute work enqueued so far (a reused block may still be read by kernels enqueued before
  // it was released). The block is ready, and `staging` (null: none) free again, once it lands.
  Result<device::Event> upload_slice(BlockState& state, void* dst, const void* src, std::size_t bytes,
                                     Staging* staging, std::string_view what) {
    ZINF_RETURN_IF_ERROR(after_compute(StreamRole::kH2D));
    ZINF_RETURN_IF_ERROR(device_.copy_h2d(dst, src, bytes, what));
    state.block.record_use(device_.stream_key(StreamRole::kH2D));
    ZINF_ASSIGN_OR_RETURN(device::Event landed, device_.record(StreamRole::kH2D));
    if (staging != nullptr && options_.skip_wait != SkipWait::kStagingReuse) staging->free_after = landed;
    state.ready = landed;
    stats_.h2d_bytes += bytes;
    ++stats_.uploads;
    return landed;
  }

  // W > 1 with a compute-stream consumer: `collective` (an all-gather of the block, enqueued on
  // the D2H stream) once this rank's slice has landed; the block is ready after it. The upload
  // waited for the compute work that may still read a reused block, so the all-gather's writes
  // come after that work too.
  template <typename Collective>
  Status all_gather_on_device(BlockState& state, const device::Event& landed, Collective&& collective) {
    if (options_.skip_wait != SkipWait::kUploadBeforeCollective) ZINF_RETURN_IF_ERROR(device_.wait(StreamRole::kD2H, landed));
    ZINF_RETURN_IF_ERROR(collective());
    state.block.record_use(device_.stream_key(StreamRole::kD2H));
    ZINF_ASSIGN_OR_RETURN(state.ready, device_.record(StreamRole::kD2H));
    ++stats_.all_gathers;
    return Status::ok();
  }

  // gather() into a block of 16-bit values (DeviceGatherOptions::values, a compute-stream
  // consumer): a memory tier's pinned 16-bit partition of that type uploaded as it is, else the
  // tier's fp32 values rounded in the staging buffer and uploaded; with W > 1 all-gathered as
  // the fp32 values are.
  Status gather_narrow(ParamTier& tier, std::size_t group, std::size_t per_rank, Communicator& comm,
                       GatherBlock& block, BlockState& state) {
    const swap::DType dtype = options_.values;
    auto* values = reinterpret_cast<std::uint16_t*>(block.data());
    const ParamTier::HostValues h = tier.pinned_values(group);
    const void* src = h.data;
    Staging* staging = nullptr;
    if (src == nullptr || h.dtype != dtype) {
      ZINF_ASSIGN_OR_RETURN(staging, take_staging(per_rank * sizeof(float)));
      float* f = staging->buf.as_floats();
      ZINF_RETURN_IF_ERROR(tier.read_f32(group, std::span<float>(f, per_rank)));
      // Vectorised and on the pool's threads (an NVMe-parameter run rounds every value it
      // gathers here), the bits of optim::f32_to_bf16_bits.
      ZINF_RETURN_IF_ERROR(optim::narrow_f32_in_place(f, per_rank, dtype));
      src = staging->buf.data();
    }
    ZINF_ASSIGN_OR_RETURN(const device::Event landed,
                          upload_slice(state, values + per_rank * static_cast<std::size_t>(comm.rank()), src,
                                       per_rank * swap::dtype_size(dtype), staging, "parameter upload (16-bit)"));
    if (comm.world_size() == 1) return Status::ok();
    return all_gather_on_device(state, landed, [&] {
      return options_.collectives->all_gather16(StreamRole::kD2H, values, per_rank);
    });
  }

  BlockState& state_of(const GatherBlock& block) { return blocks_.at(block.data()); }

  bool on_stream() const { return options_.consumer == DeviceGatherOptions::Consumer::kComputeStream; }

  // Blocks the calling thread until the compute work enqueued so far has run.
  Status compute_done_on_host() {
    ZINF_ASSIGN_OR_RETURN(device::Event computed, device_.record(StreamRole::kCompute));
    return device_.synchronize(computed);
  }

  // With a consumer on the compute stream: later work on `copy` waits for the compute work
  // enqueued so far.
  Status after_compute(StreamRole copy) {
    if (!on_stream() || options_.skip_wait == SkipWait::kComputeBeforeCopy) return Status::ok();
    ZINF_ASSIGN_OR_RETURN(device::Event computed, device_.record(StreamRole::kCompute));
    return device_.wait(copy, computed);
  }

  // A staging buffer of at least `bytes` whose last copy has completed: a free one, else a new
  // one while fewer than options_.staging_buffers exist, else the least recently used free one
  // after waiting for its copy (grown if too small).
  Result<Staging*> take_staging(std::size_t bytes) {
    Staging* fallback = nullptr;
    for (auto& s : staging_) {
      if (s->held) continue;
      if (s->buf.size() >= bytes) {
        ZINF_ASSIGN_OR_RETURN(bool done, device_.query(s->free_after));
        if (done) return touch(s.get());
      }
      if (fallback == nullptr) fallback = s.get();
    }
    if (staging_.size() < options_.staging_buffers || fallback == nullptr) {
      staging_.push_back(std::make_unique<Staging>());
      fallback = staging_.back().get();
    } else {
      const auto t0 = Clock::now();
      ZINF_RETURN_IF_ERROR(device_.synchronize(fallback->free_after));
      stats_.staging_wait_s += since(t0);
    }
    if (fallback->buf.size() < bytes) {
      stats_.staging_bytes -= fallback->buf.size();
      ZINF_ASSIGN_OR_RETURN(fallback->buf.mem, aio::PinnedBuffer::allocate(bytes));
      stats_.staging_bytes += fallback->buf.size();
    }
    fallback->free_after = device::Event();
    return touch(fallback);
  }

  // Moves s to the back of staging_ (most recently used), so the fallback above is the oldest.
  Staging* touch(Staging* s) {
    for (std::size_t i = 0; i < staging_.size(); ++i) {
      if (staging_[i].get() != s) continue;
      auto keep = std::move(staging_[i]);
      staging_.erase(staging_.begin() + static_cast<std::ptrdiff_t>(i));
      staging_.push_back(std::move(keep));
      break;
    }
    return s;
  }

  device::Device& device_;
  DeviceGatherOptions options_;
  std::unordered_map<const float*, BlockState> blocks_;
  std::vector<std::unique_ptr<Staging>> staging_;
  std::unordered_map<std::uint64_t, Download> downloads_;
  std::uint64_t next_ticket_ = 1;
  DeviceGatherStats stats_;
};

}  // namespace

Result<std::unique_ptr<DeviceGatherTarget>> make_device_gather_target(device::Device& device,
                                                                      DeviceGatherOptions options) {
  if (!device.host_addressable() && options.consumer == DeviceGatherOptions::Consumer::kHostThread) {
    return Status::invalid_argument(fmt::format(
        "{}: its memory is not host memory, so a model computing on the host thread cannot read it; the "
        "consumer must compute on the device's compute stream",
        device.describe()));
  }
  if (options.staging_buffers == 0) return Status::invalid_argument("device gather target: staging_buffers is 0");
  if (options.values != swap::DType::kF32 &&
      (options.values != swap::DType::kBF16 || options.consumer != DeviceGatherOptions::Consumer::kComputeStream)) {
    return Status::invalid_argument(fmt::format(
        "device gather target: {} values; the values are fp32, or bf16 for a model on the compute stream",
        swap::dtype_name(options.values)));
  }
  return std::unique_ptr<DeviceGatherTarget>(new DeviceGatherTargetImpl(device, options));
}

}  // namespace zinf::zero3
