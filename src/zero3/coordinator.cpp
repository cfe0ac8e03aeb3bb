// Parameter coordinator: trace-driven gather/prefetch under a hard live budget, and bucketed
// gradient reduce-scatter into fp32 partitions.
#include "zero3/coordinator.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include <fmt/format.h>

namespace zinf::zero3 {
namespace {
constexpr std::uint64_t kFar = std::numeric_limits<std::uint64_t>::max();
}  // namespace

Coordinator::Coordinator(const model::GptModel& model, const PartitionPlan& plan,
                         const swap::OptimizerLayout& layout, ParamTier& tier, Communicator& comm,
                         const CoordinatorOptions& options, std::vector<model::FloatBuffer>& grad_acc)
    : model_(model), plan_(plan), layout_(layout), tier_(tier), comm_(comm), opt_(options), grad_acc_(grad_acc) {
  const auto params = model.params();
  gathered_.resize(params.size());
  grads_.resize(params.size());
  // Small parameters stay gathered, first come first served up to the model-wide cap.
  std::uint64_t persistent = 0;
  for (std::size_t p = 0; p < params.size(); ++p) {
    const std::uint64_t n = params[p].numel;
    if (n <= opt_.param_persistence_threshold && persistent + n <= opt_.model_persistence_threshold) {
      gathered_[p].persistent = true;
      persistent += n;
    }
  }
  stats_.persistent_elements = persistent;
}

void Coordinator::begin_pass(bool train) {
  train_ = train;
  position_ = 0;
  Trace& t = trace();
  on_trace_ = t.complete;
  if (!t.complete && !t.recording) t.recording = true;
  if (t.recording) t = Trace{};
  pass_start_ = std::chrono::steady_clock::now();
  backward_seen_ = false;
  stats_.backward_start_s = 0;
}

Status Coordinator::end_pass() {
  Trace& t = trace();
  if (t.recording) finish_trace(t);
  for (std::size_t p = 0; p < gathered_.size(); ++p) {
    if (gathered_[p].prefetched) {
      tier_.drop_prefetch(p);
      gathered_[p].prefetched = false;
    }
  }
  ZINF_RETURN_IF_ERROR(flush_bucket());
  for (std::size_t p = 0; p < gathered_.size(); ++p) {
    if (gathered_[p].users != 0) {
      return Status::internal(fmt::format("parameter {} still acquired at the end of a pass", model_.params()[p].name));
    }
    if (grads_[p].data() != nullptr) {
      return Status::internal(fmt::format("gradient of {} never completed in backward", model_.params()[p].name));
    }
  }
  return Status::ok();
}

void Coordinator::invalidate_gathered() {
  for (std::size_t p = 0; p < gathered_.size(); ++p) {
    if (gathered_[p].valid) drop(static_cast<int>(p));
  }
}

void Coordinator::finish_trace(Trace& t) {
  t.recording = false;
  t.complete = true;
  const auto params = model_.params();
  t.traffic.assign(t.params.size() + 1, 0);
  for (std::size_t i = 0; i < t.params.size(); ++i) {
    t.traffic[i + 1] = t.traffic[i] + params[static_cast<std::size_t>(t.params[i])].numel;
  }
}

std::uint64_t Coordinator::next_use_distance(int p) const {
  const Trace& t = trace();
  if (!on_trace_ || !t.complete) return kFar;
  // Elements of parameter traffic from the current event boundary to p's next use.
  const std::size_t boundary = position_ < t.event_first.size() ? t.event_first[position_] : t.params.size();
  for (std::size_t i = boundary; i < t.params.size(); ++i) {
    if (t.params[i] == p) return t.traffic[i] - t.traffic[boundary];
  }
  return kFar;
}

model::FloatBuffer Coordinator::take_buffer(std::size_t n) {
  auto it = spare_.find(n);
  if (it != spare_.end()) {
    model::FloatBuffer b = std::move(it->second);
    spare_.erase(it);
    spare_elements_ -= n;
    return b;
  }
  return model::FloatBuffer::allocate(n);
}

void Coordinator::give_buffer(model::FloatBuffer b) {
  if (b.data() == nullptr) return;
  const std::size_t n = b.size();
  // Keep freed buffers for reuse while live + spare stays under the budget; else free them.
  if (live_ + spare_elements_ + n <= opt_.max_live_parameters) {
    spare_elements_ += n;
    spare_.emplace(n, std::move(b));
  }
}

void Coordinator::drop(int p) {
  Gathered& g = gathered_[static_cast<std::size_t>(p)];
  if (!g.valid) return;
  g.valid = false;
  if (!g.persistent) live_ -= g.buf.size();
  give_buffer(std::move(g.buf));
  g.buf = model::FloatBuffer();
}

Status Coordinator::make_room(std::uint64_t need, int module) {
  while (live_ + need > opt_.max_live_parameters) {
    // Evict the released copy whose next use is farthest away.
    int victim = -1;
    std::uint64_t farthest = 0;
    for (std::size_t p = 0; p < gathered_.size(); ++p) {
      const Gathered& g = gathered_[p];
      if (!g.valid || g.persistent || g.users > 0) continue;
      const std::uint64_t d = next_use_distance(static_cast<int>(p));
      if (victim < 0 || d > farthest) {
        victim = static_cast<int>(p);
        farthest = d;
      }
    }
    if (victim < 0) {
      return Status::resource_exhausted(fmt::format(
          "stage3_max_live_parameters = {} elements, but module {} needs {} more gathered elements while {} are "
          "held by modules in use; raise stage3_max_live_parameters to at least {}",
          opt_.max_live_parameters, model_.modules()[static_cast<std::size_t>(module)].name, need, live_, live_ + need));
    }
    drop(victim);
    ++stats_.evictions;
  }
  // Spare buffers count against the budget too: free them first.
  while (!spare_.empty() && live_ + spare_elements_ + need > opt_.max_live_parameters) {
    spare_elements_ -= spare_.begin()->first;
    spare_.erase(spare_.begin());
  }
  return Status::ok();
}

Status Coordinator::ensure_gathered(int p) {
  Gathered& g = gathered_[static_cast<std::size_t>(p)];
  if (g.valid) {
    if (!g.persistent) ++stats_.reuse_hits;
    return Status::ok();
  }
  const auto idx = static_cast<std::size_t>(p);
  const std::size_t numel = model_.params()[idx].numel;
  const std::size_t per_rank = plan_.slot(idx).per_rank;
  const int world = comm_.world_size();
  model::FloatBuffer full = take_buffer(numel);
  if (full.data() == nullptr && numel > 0) {
    return Status::resource_exhausted(fmt::format("cannot allocate {} fp32 elements to gather {}", numel,
                                                  model_.params()[idx].name));
  }
  if (world == 1) {
    ZINF_RETURN_IF_ERROR(tier_.read_f32(idx, full.span()));
  } else {
    // All-gather the padded slices into a scratch buffer, then cut the padding off.
    if (recv_.size() < per_rank * static_cast<std::size_t>(world)) recv_ = model::FloatBuffer::allocate(per_rank * world);
    std::span<float> mine(recv_.data() + per_rank * static_cast<std::size_t>(comm_.rank()), per_rank);
    ZINF_RETURN_IF_ERROR(tier_.read_f32(idx, mine));
    ZINF_RETURN_IF_ERROR(comm_.all_gather(mine, std::span<float>(recv_.data(), per_rank * world)));
    std::memcpy(full.data(), recv_.data(), numel * sizeof(float));  // slices are back to back
  }
  g.buf = std::move(full);
  g.valid = true;
  g.prefetched = false;
  if (!g.persistent) {
    live_ += numel;
    stats_.live_high_water = std::max(stats_.live_high_water, live_);
  }
  ++stats_.gathers;
  stats_.gathered_elements += numel;
  return Status::ok();
}

void Coordinator::prefetch_after(std::size_t event) {
  const Trace& t = trace();
  if (!on_trace_ || !t.complete) return;
  const std::uint64_t room = live_ < opt_.max_live_parameters ? opt_.max_live_parameters - live_ : 0;
  const std::uint64_t budget = std::min(room, opt_.prefetch_bucket_size);
  std::uint64_t planned = 0;
  const std::size_t first = event + 1 < t.event_first.size() ? t.event_first[event + 1] : t.params.size();
  for (std::size_t i = first; i < t.params.size(); ++i) {
    const auto p = static_cast<std::size_t>(t.params[i]);
    Gathered& g = gathered_[p];
    if (g.valid || g.prefetched) continue;
    const std::uint64_t n = plan_.slot(p).per_rank;
    if (planned + n > budget) break;
    tier_.prefetch(p);
    g.prefetched = true;
    planned += n;
    ++stats_.prefetches;
  }
}

Status Coordinator::acquire(int module, model::Phase phase, std::span<const float*> values) {
  if (phase == model::Phase::kBackward && !backward_seen_) {
    backward_seen_ = true;
    stats_.backward_start_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - pass_start_).count();
  }
  const model::ModuleSpec& spec = model_.modules()[static_cast<std::size_t>(module)];
  Trace& t = trace();
  if (t.recording) {
    t.events.push_back(module);
    t.event_first.push_back(t.params.size());
    t.params.insert(t.params.end(), spec.params.begin(), spec.params.end());
  } else if (on_trace_ && (position_ >= t.events.size() || t.events[position_] != module)) {
    // The pass left the recorded order: stop prefetching and record it again next pass.
    on_trace_ = false;
    t.complete = false;
    ++stats_.trace_invalidations;
  }
  std::uint64_t need = 0;
  for (int p : spec.params) {
    const Gathered& g = gathered_[static_cast<std::size_t>(p)];
    if (!g.valid && !g.persistent) need += model_.params()[static_cast<std::size_t>(p)].numel;
  }
  // Pin what the module already has so eviction cannot take it.
  for (int p : spec.params) ++gathered_[static_cast<std::size_t>(p)].users;
  Status s = make_room(need, module);
  for (std::size_t k = 0; s.is_ok() && k < spec.params.size(); ++k) {
    s = ensure_gathered(spec.params[k]);
    if (s.is_ok()) values[k] = gathered_[static_cast<std::size_t>(spec.params[k])].buf.data();
  }
  if (!s.is_ok()) {
    for (int p : spec.params) --gathered_[static_cast<std::size_t>(p)].users;
    return s;
  }
  ++position_;
  prefetch_after(position_ - 1);
  return Status::ok();
}

Status Coordinator::release(int module, model::Phase) {
  const model::ModuleSpec& spec = model_.modules()[static_cast<std::size_t>(module)];
  for (int p : spec.params) {
    Gathered& g = gathered_[static_cast<std::size_t>(p)];
    if (g.users <= 0) {
      return Status::internal(fmt::format("release of {} which module {} does not hold",
                                          model_.params()[static_cast<std::size_t>(p)].name, spec.name));
    }
    if (--g.users > 0 || g.persistent) continue;
    // Keep the copy if the trace says it is needed again soon; free it otherwise.
    if (next_use_distance(p) > opt_.max_reuse_distance) drop(p);
  }
  return Status::ok();
}

Status Coordinator::grad_buffers(int module, std::span<float*> grads) {
  if (!backward_seen_) {
    backward_seen_ = true;
    stats_.backward_start_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - pass_start_).count();
  }
  const model::ModuleSpec& spec = model_.modules()[static_cast<std::size_t>(module)];
  for (std::size_t k = 0; k < spec.params.size(); ++k) {
    const auto p = static_cast<std::size_t>(spec.params[k]);
    if (grads_[p].data() == nullptr) {
      const std::size_t n = model_.params()[p].numel;
      grads_[p] = model::FloatBuffer::allocate(n);
      if (grads_[p].data() == nullptr && n > 0) {
        return Status::resource_exhausted(fmt::format("cannot allocate the gradient of {}", model_.params()[p].name));
      }
      std::memset(grads_[p].data(), 0, n * sizeof(float));
    }
    grads[k] = grads_[p].data();
  }
  return Status::ok();
}

Status Coordinator::grads_ready(int module) {
  const model::ModuleSpec& spec = model_.modules()[static_cast<std::size_t>(module)];
  for (int p : spec.params) {
    if (model_.params()[static_cast<std::size_t>(p)].module != module) continue;  // completes later
    bucket_.push_back(p);
    bucket_elements_ += model_.params()[static_cast<std::size_t>(p)].numel;
  }
  // One rank has nothing to reduce: add each gradient in as soon as it is complete.
  if (bucket_elements_ >= opt_.reduce_bucket_size || comm_.world_size() == 1) return flush_bucket();
  return Status::ok();
}

Status Coordinator::flush_bucket() {
  if (bucket_.empty()) return Status::ok();
  const int world = comm_.world_size();
  std::size_t total = 0;
  for (int p : bucket_) total += plan_.slot(static_cast<std::size_t>(p)).per_rank;
  // Where each bucket gradient's reduced slice is read from: straight from the full gradient
  // with one rank (nothing to reduce), else from the reduce-scatter's output.
  const float* reduced = nullptr;
  if (world > 1) {
    // send: W blocks of `total`, block r holding every bucket gradient's rank-r slice (padded).
    const std::size_t send_n = total * static_cast<std::size_t>(world);
    if (send_.size() < send_n) send_ = model::FloatBuffer::allocate(send_n);
    if (recv_.size() < total) recv_ = model::FloatBuffer::allocate(total);
    if ((send_.data() == nullptr || recv_.data() == nullptr) && total > 0) {
      return Status::resource_exhausted(fmt::format("cannot allocate a {}-element gradient bucket", send_n));
    }
    for (int r = 0; r < world; ++r) {
      float* block = send_.data() + total * static_cast<std::size_t>(r);
      std::size_t off = 0;
      for (int p : bucket_) {
        const auto idx = static_cast<std::size_t>(p);
        const ElementRange range = plan_.owned(idx, r);
        const std::size_t per_rank = plan_.slot(idx).per_rank;
        std::memcpy(block + off, grads_[idx].data() + range.begin, range.size() * sizeof(float));
        std::memset(block + off + range.size(), 0, (per_rank - range.size()) * sizeof(float));
        off += per_rank;
      }
    }
    ZINF_RETURN_IF_ERROR(comm_.reduce_scatter(std::span<const float>(send_.data(), send_n),
                                              std::span<float>(recv_.data(), total)));
    reduced = recv_.data();
  }
  std::size_t off = 0;
  for (int p : bucket_) {
    const auto idx = static_cast<std::size_t>(p);
    const std::size_t per_rank = plan_.slot(idx).per_rank;
    float* acc = grad_acc_[layout_.subgroup_of[idx]].data() + layout_.offset_in_subgroup[idx];
    const float* in = reduced != nullptr ? reduced + off : grads_[idx].data();
    for (std::size_t i = 0; i < per_rank; ++i) acc[i] += in[i];
    off += per_rank;
    grads_[idx] = model::FloatBuffer();
  }
  bucket_.clear();
  bucket_elements_ = 0;
  ++stats_.buckets;
  return Status::ok();
}

}  // namespace zinf::zero3
