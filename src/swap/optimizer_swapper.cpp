// OptimizerSwapper: tiled, pipelined optimizer step over double-buffered state in swap stores.
#include "zinf/swap/optimizer_swapper.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "zinf/log.h"
#include "zinf/optim/half.h"
#include "swap/optimizer_slot.h"
#include "zinf/swap/param_sink.h"

namespace zinf::swap {

namespace {

using detail::Clock;
using detail::seconds_since;

constexpr const char* kMetaLayout = "optimizer.layout";
constexpr const char* kMetaName = "optimizer.name";
constexpr const char* kMetaSlot = "optimizer.slot";
constexpr const char* kMetaStep = "optimizer.step";
constexpr const char* kMetaStates = "optimizer.states_created";
constexpr const char* kMetaMaster = "optimizer.master_written";

}  // namespace

OptimizerSwapper::OptimizerSwapper(OptimizerSwapConfig config, optim::Optimizer optimizer)
    : config_(std::move(config)), optimizer_(std::move(optimizer)) {}

OptimizerSwapper::~OptimizerSwapper() {
  (void)wait_gradient_transfers();
  (void)drain();
  slots_.clear();  // blocks go back before the pool goes
  pool_.reset();
}

Result<std::unique_ptr<OptimizerSwapper>> OptimizerSwapper::create(const OptimizerSwapConfig& config,
                                                                   std::vector<ParamPartition> params,
                                                                   optim::Optimizer optimizer, aio::Handle& handle,
                                                                   OpenMode mode) {
  if (config.store.nvme_paths.empty()) {
    return Status::invalid_argument("offload_optimizer.nvme_path is required when the device is nvme");
  }
  std::unique_ptr<OptimizerSwapper> sw(new OptimizerSwapper(config, std::move(optimizer)));
  sw->layout_ = PartitionLayout::build(std::move(params), config.sub_group_size);
  ZINF_RETURN_IF_ERROR(sw->open_stores(handle, mode));
  ZINF_RETURN_IF_ERROR(sw->plan_tiles(handle));
  return sw;
}

Status OptimizerSwapper::plan_tiles(aio::Handle& handle) {
  const std::size_t states = optimizer_.state_count();
  const std::size_t gsize = config_.swap_gradients ? dtype_size(config_.gradient_dtype) : 0;
  const std::size_t per_element = 4 * (1 + states) + gsize + 2;
  const std::size_t stages = 1 + (config_.pipeline_read ? 1 : 0) + (config_.pipeline_write ? 1 : 0);
  const std::uint64_t largest = std::max(layout_.largest_subgroup(), PartitionLayout::kAlign);
  PinnedPoolOptions po;
  // buffer_size 0: the largest sub-group (the reference's default), and at least one tile of
  // kAlign elements per stage (a model whose sub-groups are that small, with swapped gradients).
  const std::uint64_t least = (stages * per_element * PartitionLayout::kAlign + 4 * config_.buffer_count - 1) /
                              (4 * std::max<std::size_t>(1, config_.buffer_count));
  po.budget = PoolBudget{"offload_optimizer", config_.buffer_count,
                         config_.buffer_size != 0 ? config_.buffer_size
                                                  : static_cast<std::size_t>(std::max(largest, least)), 4};
  po.pin_memory = config_.pin_memory;
  ZINF_RETURN_IF_ERROR(po.budget.checked_bytes().status());
  tile_ = std::min(align_down(po.budget.bytes() / (stages * per_element), PartitionLayout::kAlign), largest);
  if (tile_ == 0) {
    const std::uint64_t need = stages * per_element * PartitionLayout::kAlign;
    return Status::resource_exhausted(fmt::format(
        "offload_optimizer.buffer_count x buffer_size = {} x {} fp32 elements = {} bytes cannot hold one tile of "
        "{} elements for {} pipeline stage(s) at {} bytes per element ({} bytes); raise "
        "offload_optimizer.buffer_size to at least {} elements",
        po.budget.buffer_count, po.budget.buffer_size, po.budget.bytes(), PartitionLayout::kAlign, stages,
        per_element, need, (need + 4 * config_.buffer_count - 1) / (4 * config_.buffer_count)));
  }
  // A budget the tiles leave mostly unused (a small model under the reference's defaults) grows
  // on demand: its unused part never becomes memory. One the tiles fill is allocated whole and
  // registered for fixed-buffer I/O, which the large models whose steps are I/O-bound need.
  po.grow_on_demand = 2 * stages * align_up(tile_ * per_element, kSwapAlignment) <= po.budget.bytes();
  ZINF_ASSIGN_OR_RETURN(pool_, PinnedPool::create(po, &handle));
  // Each stage's slot: master, states, swapped gradients, 16-bit copies, back to back.
  for (std::size_t i = 0; i < stages; ++i) {
    auto s = std::make_unique<Slot>();
    ZINF_ASSIGN_OR_RETURN(s->block, pool_->acquire(static_cast<std::size_t>(tile_ * per_element)));
    std::byte* p = s->block.data();
    s->master = reinterpret_cast<float*>(p);
    for (std::size_t k = 0; k < states; ++k) s->states.push_back(reinterpret_cast<float*>(p + 4 * tile_ * (1 + k)));
    p += 4 * tile_ * (1 + states);
    s->grad = gsize != 0 ? p : nullptr;
    s->copy = p + gsize * tile_;
    slots_.push_back(std::move(s));
  }
  for (std::size_t g = 0; g < layout_.subgroups.size(); ++g) {
    const std::uint64_t n = layout_.subgroups[g].numel;
    for (std::uint64_t start = 0; start < n; start += tile_) tiles_.push_back(Tile{g, start, std::min(tile_, n - start)});
  }
  return Status::ok();
}

std::string OptimizerSwapper::state_key(std::size_t subgroup, std::size_t which, int slot) const {
  if (which == 0) return fmt::format("sg{}/master.s{}", subgroup, slot);
  return fmt::format("sg{}/{}.s{}", subgroup, optimizer_.state_name(which - 1), slot);
}

std::string OptimizerSwapper::grad_key(std::size_t subgroup) const { return fmt::format("sg{}/grad", subgroup); }

Status OptimizerSwapper::open_stores(aio::Handle& handle, OpenMode mode) {
  StoreConfig sc = config_.store;
  sc.kind = StoreKind::kOptimizer;
  ZINF_ASSIGN_OR_RETURN(store_, SwapStore::open(sc, mode, handle));
  if (config_.swap_gradients) {
    sc.kind = StoreKind::kGradients;
    sc.durable = false;  // gradients do not outlive a step
    ZINF_ASSIGN_OR_RETURN(grad_store_, SwapStore::open(sc, OpenMode::kCreate, handle));
    for (std::size_t g = 0; g < layout_.subgroups.size(); ++g) {
      ZINF_RETURN_IF_ERROR(
          grad_store_->allocate(grad_key(g), config_.gradient_dtype, layout_.subgroups[g].numel).status());
    }
  }
  if (!store_->metadata(kMetaLayout).empty()) return load_metadata();
  for (std::size_t g = 0; g < layout_.subgroups.size(); ++g) {
    for (std::size_t which = 0; which <= optimizer_.state_count(); ++which) {
      for (int slot = 0; slot < 2; ++slot) {
        ZINF_RETURN_IF_ERROR(
            store_->allocate(state_key(g, which, slot), DType::kF32, layout_.subgroups[g].numel).status());
      }
    }
  }
  store_->set_metadata(kMetaLayout, layout_.fingerprint());
  store_->set_metadata(kMetaName, std::string(optimizer_.config().name()));
  return commit_metadata(0, 0, false, false);
}

Status OptimizerSwapper::load_metadata() {
  const std::string stored = store_->metadata(kMetaLayout);
  if (stored != layout_.fingerprint()) {
    return Status::invalid_argument(fmt::format(
        "optimizer swap store {} holds another layout ({}) than the model's ({}); start it anew (OpenMode::kCreate)",
        store_->folder(), stored, layout_.fingerprint()));
  }
  if (store_->metadata(kMetaName) != optimizer_.config().name()) {
    return Status::invalid_argument(fmt::format("optimizer swap store {} holds {} state, not {}", store_->folder(),
                                                store_->metadata(kMetaName), optimizer_.config().name()));
  }
  slot_ = store_->metadata(kMetaSlot) == "1" ? 1 : 0;
  const std::string step = store_->metadata(kMetaStep);
  committed_step_ = step.empty() ? 0 : std::strtoll(step.c_str(), nullptr, 10);
  states_created_ = store_->metadata(kMetaStates) == "1";
  master_written_ = store_->metadata(kMetaMaster) == "1";
  return Status::ok();
}

Status OptimizerSwapper::commit_metadata(int slot, std::int64_t step, bool states_created, bool master_written) {
  const std::string old[4] = {store_->metadata(kMetaSlot), store_->metadata(kMetaStep),
                              store_->metadata(kMetaStates), store_->metadata(kMetaMaster)};
  store_->set_metadata(kMetaSlot, std::to_string(slot));
  store_->set_metadata(kMetaStep, std::to_string(step));
  store_->set_metadata(kMetaStates, states_created ? "1" : "0");
  store_->set_metadata(kMetaMaster, master_written ? "1" : "0");
  const Status st = store_->commit();
  if (!st.is_ok()) {
    store_->set_metadata(kMetaSlot, old[0]);
    store_->set_metadata(kMetaStep, old[1]);
    store_->set_metadata(kMetaStates, old[2]);
    store_->set_metadata(kMetaMaster, old[3]);
    return st.with_context("committing the optimizer state");
  }
  slot_ = slot;
  loaded_.assign(loaded_.size(), false);  // the uncommitted slot is free again
  committed_step_ = step;
  states_created_ = states_created;
  master_written_ = master_written;
  return Status::ok();
}

Status OptimizerSwapper::check_args(const StepArgs& in) const {
  const std::size_t groups = layout_.subgroups.size();
  if (in.ctx.step < 1) return Status::invalid_argument(fmt::format("optimizer step count {} must be >= 1", in.ctx.step));
  if (config_.swap_gradients && !in.grads.empty()) {
    return Status::invalid_argument("gradients are swapped (swap_gradients): pass no in-memory gradients");
  }
  if (!config_.swap_gradients && in.grads.size() != groups) {
    return Status::invalid_argument(
        fmt::format("gradients: {} views given for {} sub-groups (one per sub-group)", in.grads.size(), groups));
  }
  for (std::size_t g = 0; g < in.grads.size(); ++g) {
    if (in.grads[g].size != layout_.subgroups[g].numel || in.grads[g].data == nullptr) {
      return Status::invalid_argument(fmt::format("gradients of sub-group {}: {} elements given, {} needed (padded layout)",
                                                  g, in.grads[g].size, layout_.subgroups[g].numel));
    }
  }
  return Status::ok();
}

Status OptimizerSwapper::issue_reads(Slot& s, const Tile& t, bool states, bool grads) {
  const std::size_t bytes = static_cast<std::size_t>(t.length * 4);
  for (std::size_t which = 0; states && which <= optimizer_.state_count(); ++which) {
    float* buffer = which == 0 ? s.master : s.states[which - 1];
    if (which > 0 && !states_created_) {
      std::memset(buffer, 0, bytes);  // state is created on first use
      continue;
    }
    ZINF_ASSIGN_OR_RETURN(IoBatch b, store_->read_async(state_key(t.subgroup, which, slot_), t.start * 4, buffer, bytes));
    s.reads.emplace_back(store_.get(), std::move(b));
  }
  if (grad_store_ && grads) {
    const std::size_t g = dtype_size(config_.gradient_dtype);
    ZINF_ASSIGN_OR_RETURN(IoBatch b, grad_store_->read_async(grad_key(t.subgroup), t.start * g, s.grad, t.length * g));
    s.reads.emplace_back(grad_store_.get(), std::move(b));
  }
  return Status::ok();
}

Status OptimizerSwapper::wait_reads(Slot& s) {
  Status first;
  for (auto& [store, batch] : s.reads) {
    Status st = store->wait(batch);
    if (!st.is_ok() && first.is_ok()) first = std::move(st);
  }
  s.reads.clear();
  return first;
}

Status OptimizerSwapper::read_ahead() {
  if (ahead_ > 0 || !master_written_) return Status::ok();
  const std::size_t count = std::min(slots_.size(), tiles_.size());
  ahead_before_ = store_->stats();
  for (std::size_t i = 0; i < count; ++i) {
    Slot& s = *slots_[i];
    const Tile& t = tiles_[i];
    // The slots are idle between steps (the last step drained them); waited for safety all the same.
    Status st = wait_writes(s);
    // The gradients (swap_gradients) are read by the step: write_gradients may still rewrite them.
    if (st.is_ok()) st = issue_reads(s, t, /*states=*/true, /*grads=*/false);
    if (st.is_ok()) {
      ahead_ = i + 1;
      continue;
    }
    (void)cancel_read_ahead();  // the error being returned is the one that matters
    return st.with_context(fmt::format("reading ahead sub-group {} elements [{}, {})", t.subgroup, t.start,
                                       t.start + t.length));
  }
  return Status::ok();
}

Status OptimizerSwapper::cancel_read_ahead() {
  Status first;
  for (std::size_t i = 0; i < ahead_; ++i) {
    Status st = wait_reads(*slots_[i]);
    if (!st.is_ok() && first.is_ok()) first = std::move(st);
  }
  ahead_ = 0;
  return first.with_context("optimizer state read ahead of the step (dropped)");
}

Status OptimizerSwapper::compute(Slot& s, const Tile& t, const StepArgs& in) {
  const std::size_t n = static_cast<std::size_t>(t.length);
  std::vector<std::span<float>> states;
  for (float* p : s.states) states.emplace_back(p, n);
  optim::GradView grad{s.grad, config_.gradient_dtype, n, in.grad_scale};
  if (!grad_store_) {
    const optim::GradView& whole = in.grads[t.subgroup];
    grad = optim::GradView{static_cast<const std::byte*>(whole.data) + t.start * dtype_size(whole.dtype), whole.dtype,
                           n, in.grad_scale};
  }
  // 16-bit copies come out of the kernel (into the sink's memory, or the slot's copy area);
  // fp32 ones are the master tile, handed over after it.
  optim::HalfCopy copy;
  ParamSink* sink = in.sink;
  if (sink != nullptr && sink->dtype() != DType::kF32) {
    void* host = sink->host_subgroup(t.subgroup);
    copy = optim::HalfCopy{host != nullptr ? static_cast<std::byte*>(host) + t.start * dtype_size(sink->dtype())
                                           : static_cast<void*>(s.copy),
                           sink->dtype()};
  }
  const auto t0 = Clock::now();
  Status st = optimizer_.step(in.ctx, std::span<float>(s.master, n), states, grad, copy, config_.exec);
  if (st.is_ok() && sink != nullptr && sink->dtype() == DType::kF32) {
    if (auto* host = static_cast<float*>(sink->host_subgroup(t.subgroup))) std::memcpy(host + t.start, s.master, n * 4);
  }
  stats_.compute_seconds += seconds_since(t0);
  return st;
}

Status OptimizerSwapper::issue_writes(Slot& s, const Tile& t, const StepArgs& in, int slot) {
  const std::size_t bytes = static_cast<std::size_t>(t.length * 4);
  for (std::size_t which = 0; which <= optimizer_.state_count(); ++which) {
    const float* buffer = which == 0 ? s.master : s.states[which - 1];
    ZINF_ASSIGN_OR_RETURN(IoBatch b, store_->write_async(state_key(t.subgroup, which, slot), t.start * 4, buffer, bytes));
    s.writes.emplace_back(store_.get(), std::move(b));
  }
  if (in.sink != nullptr && in.sink->host_subgroup(t.subgroup) == nullptr) return write_copies(s, t, *in.sink);
  return Status::ok();
}

Status OptimizerSwapper::write_copies(Slot& s, const Tile& t, ParamSink& sink) {
  const void* copy = sink.dtype() == DType::kF32 ? static_cast<const void*>(s.master) : s.copy;
  return sink.write(t.subgroup, t.start, t.length, copy, s.copy_writes);
}

Status OptimizerSwapper::wait_state_writes(Slot& s) {
  const auto t0 = Clock::now();
  Status first;
  for (auto& [store, batch] : s.writes) {
    Status st = store->wait(batch);
    if (!st.is_ok() && first.is_ok()) first = std::move(st);
  }
  s.writes.clear();
  stats_.write_wait_seconds += seconds_since(t0);
  return first;
}

Status OptimizerSwapper::wait_copy_writes(Slot& s) {
  const auto t0 = Clock::now();
  Status first;
  for (const SwapTicket& t : s.copy_writes) {
    Status st = t.wait();
    if (!st.is_ok() && first.is_ok()) first = std::move(st);
  }
  s.copy_writes.clear();
  const double waited = seconds_since(t0);
  stats_.write_wait_seconds += waited;
  stats_.copy_wait_seconds += waited;
  return first;
}

Status OptimizerSwapper::wait_writes(Slot& s) {
  Status first = wait_state_writes(s);
  Status copies = wait_copy_writes(s);
  return first.is_ok() ? copies : first;
}

Status OptimizerSwapper::drain_writes() {
  Status first;
  for (auto& s : slots_) {
    Status w = wait_writes(*s);
    if (first.is_ok()) first = std::move(w);
  }
  return first;
}

Status OptimizerSwapper::drain() {
  Status first;
  for (auto& s : slots_) {
    Status r = wait_reads(*s);
    Status w = wait_writes(*s);
    if (first.is_ok()) first = !r.is_ok() ? r : w;
  }
  return first;
}

// Tile i runs in slot i mod stages. A slot's reads overwrite its master and states, which its
// previous tile's state writes read from; its 16-bit copy area is rewritten only by the next
// compute. So a read waits for the state writes (and the copy writes when an fp32 sink is
// written from the master), and the compute for the copy writes.
// Tiles below `ahead` had their master and states read by read_ahead().
Status OptimizerSwapper::run_pipeline(const StepArgs& in, std::size_t ahead) {
  const bool pread = config_.pipeline_read, pwrite = config_.pipeline_write;
  const std::size_t stages = slots_.size();
  const int next_slot = 1 - slot_;
  auto where = [&](std::size_t i) {
    const Tile& t = tiles_[i];
    return fmt::format("sub-group {} elements [{}, {}){}", t.subgroup, t.start, t.start + t.length,
                       i < ahead ? " (read ahead of the step)" : "");
  };
  const bool copies_from_master =
      in.sink != nullptr && in.sink->dtype() == DType::kF32 && in.sink->host_subgroup(0) == nullptr;
  auto read = [&](std::size_t i) -> Status {
    Slot& s = *slots_[i % stages];
    const Status written = copies_from_master ? wait_writes(s) : wait_state_writes(s);
    ZINF_RETURN_IF_ERROR(written.with_context(fmt::format("before reading {}", where(i))));
    return issue_reads(s, tiles_[i], /*states=*/i >= ahead, /*grads=*/true).with_context(where(i));
  };
  for (std::size_t i = 0; i < tiles_.size(); ++i) {
    const Tile& t = tiles_[i];
    Slot& s = *slots_[i % stages];
    if (i == 0 || !pread) ZINF_RETURN_IF_ERROR(read(i));
    const auto t0 = Clock::now();
    const Status read_status = wait_reads(s);
    stats_.read_wait_seconds += seconds_since(t0);
    ZINF_RETURN_IF_ERROR(read_status.with_context(where(i)));
    if (pread && i + 1 < tiles_.size()) ZINF_RETURN_IF_ERROR(read(i + 1));
    ZINF_RETURN_IF_ERROR(wait_copy_writes(s).with_context(fmt::format("before computing {}", where(i))));
    ZINF_RETURN_IF_ERROR(compute(s, t, in).with_context(where(i)));
    ZINF_RETURN_IF_ERROR(issue_writes(s, t, in, next_slot).with_context(where(i)));
    if (!pwrite) ZINF_RETURN_IF_ERROR(wait_writes(s).with_context(where(i)));
    ++stats_.tiles;
  }
  return Status::ok();
}

Status OptimizerSwapper::step(const StepArgs& in) {
  ZINF_RETURN_IF_ERROR(check_args(in));
  if (!master_written_) {
    return Status::invalid_argument("optimizer step before the master weights were written: call init_master()");
  }
  // The gradients the step reads: a range write still in flight is part of them.
  ZINF_RETURN_IF_ERROR(wait_gradient_write().with_context(
      fmt::format("optimizer step {}: the last gradient write failed", in.ctx.step)));
  // A range read still in flight reads what the step does not change, into its caller's buffer.
  ZINF_RETURN_IF_ERROR(wait_gradient_read().with_context(
      fmt::format("optimizer step {}: a gradient read started before it failed", in.ctx.step)));
  const auto t0 = Clock::now();
  stats_ = StepStats{};
  // The step takes over the read-ahead's reads (waited below, or by drain() on failure).
  const std::size_t ahead = std::exchange(ahead_, 0);
  const StoreStats before = ahead > 0 ? ahead_before_ : store_->stats();
  const StoreStats grad_before = grad_store_ ? grad_store_->stats() : StoreStats{};
  Status st = run_pipeline(in, ahead);
  const Status drained = drain();
  if (st.is_ok()) st = drained;
  if (!st.is_ok()) {
    return st.with_context(fmt::format("optimizer step {} failed (the state of step {} stays committed and intact)",
                                       in.ctx.step, committed_step_));
  }
  const auto tcommit = Clock::now();
  ZINF_RETURN_IF_ERROR(commit_metadata(1 - slot_, in.ctx.step, true, true));
  stats_.commit_seconds = seconds_since(tcommit);
  const StoreStats after = store_->stats();
  const StoreStats grad_after = grad_store_ ? grad_store_->stats() : StoreStats{};
  stats_.bytes_read = after.bytes_read - before.bytes_read + grad_after.bytes_read - grad_before.bytes_read;
  stats_.bytes_written = after.bytes_written - before.bytes_written;
  stats_.seconds = seconds_since(t0);
  log(LogLevel::kDebug,
      fmt::format("optimizer step {}: {} tiles of up to {} elements in {:.3f} s: compute {:.3f} s, waiting on reads "
                  "{:.3f} s, on writes {:.3f} s (16-bit copies {:.3f} s), commit {:.3f} s; read {} bytes, wrote {}",
                  in.ctx.step, stats_.tiles, tile_, stats_.seconds, stats_.compute_seconds, stats_.read_wait_seconds,
                  stats_.write_wait_seconds, stats_.copy_wait_seconds, stats_.commit_seconds, stats_.bytes_read,
                  stats_.bytes_written));
  return Status::ok();
}

}  // namespace zinf::swap
