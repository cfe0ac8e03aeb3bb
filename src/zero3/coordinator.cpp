// Parameter coordinator: trace-driven gather/prefetch of partition groups under a hard live
// budget, a cross-rank trace check, and bucketed gradient reduce-scatter into fp32 partitions.
#include "zero3/coordinator.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "common/checksum.h"
#include "zero3/host_budget.h"

namespace zinf::zero3 {
namespace {
constexpr std::uint64_t kFar = std::numeric_limits<std::uint64_t>::max();
// The trace check's module for "this rank's pass ended".
constexpr std::uint64_t kEndOfPass = std::numeric_limits<std::uint64_t>::max();
}  // namespace

Coordinator::Coordinator(const model::Model& model, const PartitionPlan& plan,
                         const swap::PartitionLayout& layout, ParamTier& tier, GatherTarget& target,
                         Communicator& comm, const CoordinatorOptions& options,
                         GradStore& grad_store)
    : model_(model),
      plan_(plan),
      layout_(layout),
      tier_(tier),
      target_(target),
      comm_(comm),
      opt_(options),
      grad_store_(grad_store) {
  const auto params = model.params();
  gathered_.resize(plan.num_groups());
  grads_.resize(plan.num_groups());
  held_.resize(plan.num_groups());
  for (const model::ModuleSpec& m : model.modules()) {
    std::vector<int> groups;
    for (int p : m.params) {
      const auto g = static_cast<int>(plan.place(static_cast<std::size_t>(p)).group);
      if (std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
    }
    module_groups_.push_back(std::move(groups));
  }
  // Groups of small parameters stay gathered, first come first served up to the model-wide cap.
  std::uint64_t persistent = 0;
  for (std::size_t g = 0; g < plan.num_groups(); ++g) {
    const GroupSlot& slot = plan.group(g);
    const bool small = std::all_of(slot.params.begin(), slot.params.end(), [&](std::size_t p) {
      return params[p].numel <= opt_.param_persistence_threshold;
    });
    if (small && persistent + slot.numel <= opt_.model_persistence_threshold) {
      gathered_[g].persistent = true;
      persistent += slot.numel;
    }
  }
  stats_.persistent_elements = persistent;
  // The sizes host_budget counts the gradient buffers by, under this coordinator's persistence.
  GatheredSizes sizes;
  std::set<std::uint64_t> seen;
  for (std::size_t g = 0; g < plan.num_groups(); ++g) {
    const std::uint64_t n = gathered_size(g);
    sizes.total += n;
    if (gathered_[g].persistent) continue;
    sizes.largest = std::max(sizes.largest, n);
    if (seen.insert(n).second) sizes.distinct += n;
  }
  grad_limit_ = gradient_buffer_elements(sizes, opt_.reduce_bucket_size, comm_.world_size());
}

std::size_t Coordinator::gathered_size(std::size_t group) const {
  return plan_.group(group).per_rank * static_cast<std::size_t>(comm_.world_size());
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
  if (t.recording) {
    ZINF_RETURN_IF_ERROR(check_agreement(kEndOfPass, 0, "ends its pass"));
    finish_trace(t);
    ZINF_RETURN_IF_ERROR(check_trace_hash(t));
    if (train_) stats_.train_trace_hash = t.hash;
  }
  for (std::size_t g = 0; g < gathered_.size(); ++g) {
    if (gathered_[g].prefetched) {
      tier_.drop_prefetch(g);
      gathered_[g].prefetched = false;
    }
  }
  ZINF_RETURN_IF_ERROR(flush_bucket());
  if (!hold_) {
    // A held sum whose group got no gradient in this pass still comes back with the step.
    for (std::size_t g = 0; g < held_.size(); ++g) {
      if (held_[g].data() != nullptr) ZINF_RETURN_IF_ERROR(hold_or_download(g));
    }
  }
  ZINF_RETURN_IF_ERROR(drain_downloads(true));
  // The engine's host collectives follow the pass (device_collectives.h).
  ZINF_RETURN_IF_ERROR(target_.finish_collectives());
  for (std::size_t g = 0; g < gathered_.size(); ++g) {
    const std::string& name = model_.params()[plan_.group(g).params.front()].name;
    if (gathered_[g].users != 0) return Status::internal(fmt::format("{} still acquired at the end of a pass", name));
    if (grads_[g].data() != nullptr) {
      return Status::internal(fmt::format("gradient of {} never completed in backward", name));
    }
  }
  return Status::ok();
}

// Every rank contributes the event it is at (module and phase, or kEndOfPass), gathered whole.
// Run only while recording, which every rank does on the same passes.
Status Coordinator::check_agreement(std::uint64_t module, std::uint64_t phase, const char* what) {
  const auto world = static_cast<std::size_t>(comm_.world_size());
  if (world == 1) return Status::ok();
  const std::array<std::uint64_t, 2> event = {module, phase};
  std::vector<std::uint64_t> all(world * event.size());
  ZINF_RETURN_IF_ERROR(target_.finish_collectives());
  ZINF_RETURN_IF_ERROR(comm_.all_gather_u64(event, all));
  bool agree = true;
  for (std::size_t r = 0; r < world; ++r) agree = agree && all[r * 2] == module && all[r * 2 + 1] == phase;
  if (agree) return Status::ok();
  const Trace& t = trace();
  std::string here = "ends its pass";
  if (module != kEndOfPass) {
    here = fmt::format("acquires {} for {}", model_.modules()[module].name,
                       model::phase_name(static_cast<model::Phase>(phase)));
  }
  return Status::aborted(fmt::format(
      "ranks disagree on the module trace at event {} of the recorded {} pass: rank {} {} ({}), another rank does "
      "not; every rank must run the same model, config and code path (activation checkpointing included)",
      t.events.size(), train_ ? "train" : "eval", comm_.rank(), here, what));
}

Status Coordinator::check_trace_hash(const Trace& t) {
  if (comm_.world_size() == 1) return Status::ok();
  ZINF_RETURN_IF_ERROR(target_.finish_collectives());
  std::uint64_t root_hash = t.hash;
  ZINF_RETURN_IF_ERROR(comm_.broadcast(std::as_writable_bytes(std::span<std::uint64_t>(&root_hash, 1)), 0));
  std::array<std::uint64_t, 1> differ = {root_hash != t.hash ? 1u : 0u};
  ZINF_RETURN_IF_ERROR(comm_.all_reduce_sum_u64(differ));
  if (differ[0] == 0) return Status::ok();
  return Status::aborted(fmt::format(
      "ranks recorded different module traces: rank {} has hash {:016x}, rank 0 {:016x} ({} rank(s) differ); every "
      "rank must run the same model, config and code path",
      comm_.rank(), t.hash, root_hash, differ[0]));
}

void Coordinator::invalidate_gathered() {
  for (std::size_t g = 0; g < gathered_.size(); ++g) {
    if (gathered_[g].valid) drop(static_cast<int>(g));
  }
}

void Coordinator::finish_trace(Trace& t) {
  t.recording = false;
  t.complete = true;
  t.traffic.assign(t.groups.size() + 1, 0);
  for (std::size_t i = 0; i < t.groups.size(); ++i) {
    t.traffic[i + 1] = t.traffic[i] + gathered_size(static_cast<std::size_t>(t.groups[i]));
  }
}

std::uint64_t Coordinator::next_use_distance(int g) const {
  const Trace& t = trace();
  if (!on_trace_ || !t.complete) return kFar;
  // Elements of parameter traffic from the current event boundary to g's next use.
  const std::size_t boundary = position_ < t.event_first.size() ? t.event_first[position_] : t.groups.size();
  for (std::size_t i = boundary; i < t.groups.size(); ++i) {
    if (t.groups[i] == g) return t.traffic[i] - t.traffic[boundary];
  }
  if (!next_pass_reuses_) return kFar;
  // The next pass replays the trace from its start on the same values.
  const std::uint64_t rest_of_pass = t.traffic.back() - t.traffic[boundary];
  for (std::size_t i = 0; i < boundary; ++i) {
    if (t.groups[i] == g) return rest_of_pass + t.traffic[i];
  }
  return kFar;
}

void Coordinator::give_buffer(GatherBlock b) {
  // Keep freed buffers for reuse while live + spare stays under the budget; else free them.
  if (live_ + spare_.elements() + b.size() <= opt_.max_live_parameters) spare_.keep(std::move(b));
}

void Coordinator::drop(int g) {
  Gathered& gathered = gathered_[static_cast<std::size_t>(g)];
  if (!gathered.valid) return;
  gathered.valid = false;
  if (!gathered.persistent) live_ -= gathered.buf.size();
  give_buffer(std::move(gathered.buf));
  gathered.buf = GatherBlock();
}

Status Coordinator::make_room(std::uint64_t need, int module) {
  if (live_ + need <= opt_.max_live_parameters) return Status::ok();
  // The sizes this acquire gathers that no spare block has.
  std::vector<std::uint64_t> wanted;
  for (int g : groups_of(module)) {
    const auto idx = static_cast<std::size_t>(g);
    if (!gathered_[idx].valid && !gathered_[idx].persistent && !spare_.holds(gathered_size(idx))) {
      wanted.push_back(gathered_size(idx));
    }
  }
  while (live_ + need > opt_.max_live_parameters) {
    // Evict the released copy whose next use is farthest away. A copy whose next use lies beyond
    // a whole budget of traffic cannot be reused before it goes anyway: among those, one of a
    // wanted size goes first, and its block is then the gather's (acquire takes it) instead of
    // freed memory the gather allocates afresh.
    int victim = -1, sized = -1;
    std::uint64_t farthest = 0, sized_farthest = 0;
    for (std::size_t g = 0; g < gathered_.size(); ++g) {
      const Gathered& gathered = gathered_[g];
      if (!gathered.valid || gathered.persistent || gathered.users > 0) continue;
      const std::uint64_t d = next_use_distance(static_cast<int>(g));
      if (victim < 0 || d > farthest) {
        victim = static_cast<int>(g);
        farthest = d;
      }
      const bool wanted_size = std::find(wanted.begin(), wanted.end(), gathered.buf.size()) != wanted.end();
      if (wanted_size && d > opt_.max_live_parameters && (sized < 0 || d > sized_farthest)) {
        sized = static_cast<int>(g);
        sized_farthest = d;
      }
    }
    if (sized >= 0) {
      wanted.erase(std::find(wanted.begin(), wanted.end(), gathered_[static_cast<std::size_t>(sized)].buf.size()));
      victim = sized;
    }
    // 0 is the reference's "no prefetch" (its budget never limits demand fetches): hold only
    // the modules in use, nothing kept or prefetched beyond them.
    if (victim < 0 && opt_.max_live_parameters == 0) break;
    if (victim < 0) {
      return Status::resource_exhausted(fmt::format(
          "stage3_max_live_parameters = {} elements, but module {} needs {} more gathered elements while {} are "
          "held by modules in use; raise stage3_max_live_parameters to at least {}",
          opt_.max_live_parameters, model_.modules()[static_cast<std::size_t>(module)].name, need, live_, live_ + need));
    }
    drop(victim);
    ++stats_.evictions;
  }
  return Status::ok();
}

void Coordinator::trim_spare_for(std::uint64_t need) {
  spare_.trim_to(live_ + need <= opt_.max_live_parameters ? opt_.max_live_parameters - live_ - need : 0);
}

// Reads this rank's slice into its place in the gathered buffer and all-gathers in place: the
// buffer then holds the group's parameters back to back (plus padding at the end).
Status Coordinator::ensure_gathered(int g, GatherBlock block) {
  Gathered& gathered = gathered_[static_cast<std::size_t>(g)];
  if (gathered.valid) {
    if (gathered.ahead) {
      ++stats_.ahead_hits;
    } else if (!gathered.persistent) {
      ++stats_.reuse_hits;
    }
    gathered.ahead = false;
    return Status::ok();
  }
  return start_gather(g, std::move(block));
}

Status Coordinator::start_gather(int g, GatherBlock full) {
  Gathered& gathered = gathered_[static_cast<std::size_t>(g)];
  const auto idx = static_cast<std::size_t>(g);
  const std::size_t per_rank = plan_.group(idx).per_rank;
  const std::size_t size = gathered_size(idx);
  if (full.data() == nullptr) full = spare_.take(size);
  if (full.data() == nullptr) full = target_.allocate_values(size);
  if (full.data() == nullptr && size > 0) {
    return Status::resource_exhausted(fmt::format("cannot allocate {} {} elements of {} memory to gather {}", size,
                                                  swap::dtype_name(target_.values_dtype()), target_.name(),
                                                  model_.params()[plan_.group(idx).params.front()].name));
  }
  const auto t0 = std::chrono::steady_clock::now();
  ZINF_RETURN_IF_ERROR(target_.gather(tier_, idx, per_rank, comm_, full));
  stats_.gather_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  gathered.buf = std::move(full);
  gathered.valid = true;
  gathered.prefetched = false;
  gathered.ahead = false;
  if (!gathered.persistent) {
    live_ += size;
    stats_.live_high_water = std::max(stats_.live_high_water, live_);
  }
  ++stats_.gathers;
  stats_.gathered_elements += plan_.group(idx).numel;
  return Status::ok();
}

Status Coordinator::gather_ahead(std::size_t event) {
  const Trace& t = trace();
  if (!target_.asynchronous() || !on_trace_ || !t.complete || event + 1 >= t.event_first.size()) return Status::ok();
  const std::size_t first = t.event_first[event + 1];
  const std::size_t last = event + 2 < t.event_first.size() ? t.event_first[event + 2] : t.groups.size();
  for (std::size_t i = first; i < last; ++i) {
    const int g = t.groups[i];
    Gathered& gathered = gathered_[static_cast<std::size_t>(g)];
    if (gathered.valid || (direct_bf16_ && device_bf16(g) != nullptr)) continue;
    const std::uint64_t size = gathered_size(static_cast<std::size_t>(g));
    if (!gathered.persistent && live_ + size > opt_.max_live_parameters) break;
    // Spare blocks count against the budget too; one of this size is taken before the rest are
    // trimmed, so that the trim does not free the block the gather would reuse.
    GatherBlock block;
    if (!gathered.persistent) {
      block = spare_.take(size);
      trim_spare_for(size);
    }
    ZINF_RETURN_IF_ERROR(start_gather(g, std::move(block)));
    gathered.ahead = true;
    ++stats_.gathers_ahead;
  }
  return Status::ok();
}

void Coordinator::prefetch_after(std::size_t event) {
  const Trace& t = trace();
  if (!on_trace_ || !t.complete) return;
  const std::uint64_t room = live_ < opt_.max_live_parameters ? opt_.max_live_parameters - live_ : 0;
  const std::uint64_t budget = std::min(room, opt_.prefetch_bucket_size);
  std::uint64_t planned = 0;
  const std::size_t first = event + 1 < t.event_first.size() ? t.event_first[event + 1] : t.groups.size();
  for (std::size_t i = first; i < t.groups.size(); ++i) {
    const auto g = static_cast<std::size_t>(t.groups[i]);
    Gathered& gathered = gathered_[g];
    if (gathered.valid || gathered.prefetched) continue;
    const std::uint64_t n = plan_.group(g).per_rank;
    if (planned + n > budget) break;
    tier_.prefetch(g);
    gathered.prefetched = true;
    planned += n;
    ++stats_.prefetches;
  }
}

Status Coordinator::note_event(int module, model::Phase phase) {
  if (phase == model::Phase::kBackward && !backward_seen_) {
    backward_seen_ = true;
    stats_.backward_start_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - pass_start_).count();
  }
  const std::vector<int>& groups = groups_of(module);
  Trace& t = trace();
  if (t.recording) {
    ZINF_RETURN_IF_ERROR(check_agreement(static_cast<std::uint64_t>(module), static_cast<std::uint64_t>(phase),
                                         "records it"));
    // Chained XXH3 over (module, phase) per event: the same on every rank for the same order.
    const std::uint64_t link[3] = {t.hash, static_cast<std::uint64_t>(module), static_cast<std::uint64_t>(phase)};
    t.hash = checksum64(link, sizeof(link));
    t.events.push_back(module);
    t.event_first.push_back(t.groups.size());
    t.groups.insert(t.groups.end(), groups.begin(), groups.end());
  } else if (on_trace_ && (position_ >= t.events.size() || t.events[position_] != module)) {
    // The pass left the recorded order: stop prefetching and record it again next pass.
    on_trace_ = false;
    t.complete = false;
    ++stats_.trace_invalidations;
  }
  return Status::ok();
}

const std::uint16_t* Coordinator::device_bf16(int g) {
  const ParamTier::DeviceValues v = tier_.device_values(static_cast<std::size_t>(g));
  return v.dtype == swap::DType::kBF16 ? static_cast<const std::uint16_t*>(v.data) : nullptr;
}

Status Coordinator::acquire_bf16(int module, model::Phase phase, std::span<const std::uint16_t*> values) {
  const model::ModuleSpec& spec = model_.modules()[static_cast<std::size_t>(module)];
  const std::vector<int>& groups = groups_of(module);
  if (values.size() != spec.params.size()) {
    return Status::internal(fmt::format("acquire_bf16 '{}': {} value slots for {} parameters", spec.name,
                                        values.size(), spec.params.size()));
  }
  bool in_place = comm_.world_size() == 1;
  for (int g : groups) in_place = in_place && device_bf16(g) != nullptr;
  if (!in_place && target_.values_dtype() == swap::DType::kBF16) {
    // The target gathers bf16 values: handed out from the gathered blocks as acquire() does.
    ZINF_RETURN_IF_ERROR(acquire_gathered(module, phase));
    for (std::size_t k = 0; k < spec.params.size(); ++k) {
      const ParamPlace& place = plan_.place(static_cast<std::size_t>(spec.params[k]));
      values[k] = reinterpret_cast<const std::uint16_t*>(gathered_[place.group].buf.data()) + place.offset;
    }
    return after_acquire();
  }
  if (comm_.world_size() != 1) return Status::unsupported("bf16 values in place: one rank only");
  if (!in_place) {
    return Status::unsupported(fmt::format("{}: its parameters are not kept as bf16 in device memory", spec.name));
  }
  ZINF_RETURN_IF_ERROR(note_event(module, phase));
  // users pairs with release(); nothing is gathered, so release never drops anything here. The
  // tier's copy is written by the optimizer step on the compute stream, where the model's kernels
  // run after it.
  for (int g : groups) ++gathered_[static_cast<std::size_t>(g)].users;
  for (std::size_t k = 0; k < spec.params.size(); ++k) {
    const ParamPlace& place = plan_.place(static_cast<std::size_t>(spec.params[k]));
    values[k] = device_bf16(static_cast<int>(place.group)) + place.offset;
  }
  ++position_;
  direct_bf16_ = true;
  return Status::ok();
}

Status Coordinator::acquire(int module, model::Phase phase, std::span<const float*> values) {
  const model::ModuleSpec& spec = model_.modules()[static_cast<std::size_t>(module)];
  if (target_.values_dtype() != swap::DType::kF32) {
    return Status::unsupported(fmt::format("{}: the {} gather target holds {} values (acquire_bf16)", spec.name,
                                           target_.name(), swap::dtype_name(target_.values_dtype())));
  }
  ZINF_RETURN_IF_ERROR(acquire_gathered(module, phase));
  for (std::size_t k = 0; k < spec.params.size(); ++k) {
    const ParamPlace& place = plan_.place(static_cast<std::size_t>(spec.params[k]));
    values[k] = gathered_[place.group].buf.data() + place.offset;
  }
  return after_acquire();
}

Status Coordinator::after_acquire() {
  ++position_;
  prefetch_after(position_ - 1);
  return gather_ahead(position_ - 1);
}

Status Coordinator::acquire_gathered(int module, model::Phase phase) {
  const std::vector<int>& groups = groups_of(module);
  ZINF_RETURN_IF_ERROR(note_event(module, phase));
  std::uint64_t need = 0;
  for (int g : groups) {
    const Gathered& gathered = gathered_[static_cast<std::size_t>(g)];
    if (!gathered.valid && !gathered.persistent) need += gathered_size(static_cast<std::size_t>(g));
  }
  // Pin what the module already has so eviction cannot take it.
  for (int g : groups) ++gathered_[static_cast<std::size_t>(g)].users;
  Status s = make_room(need, module);
  // A spare block of a group's exact size (an eviction may just have freed it) becomes its gather
  // buffer before the other spares are trimmed to the budget: trimming first would free the very
  // block the gather then allocates afresh, and under a budget that holds little more than the
  // modules in use every gathered byte would be new memory, every pass (docs/zero3.md). The
  // taken blocks count in `need`.
  std::vector<GatherBlock> blocks(groups.size());
  if (s.is_ok()) {
    for (std::size_t k = 0; k < groups.size(); ++k) {
      const auto g = static_cast<std::size_t>(groups[k]);
      if (!gathered_[g].valid && !gathered_[g].persistent) blocks[k] = spare_.take(gathered_size(g));
    }
    trim_spare_for(need);
  }
  for (std::size_t k = 0; s.is_ok() && k < groups.size(); ++k) s = ensure_gathered(groups[k], std::move(blocks[k]));
  for (std::size_t k = 0; s.is_ok() && k < groups.size(); ++k) s = target_.ready(gathered_[static_cast<std::size_t>(groups[k])].buf);
  if (!s.is_ok()) {
    for (int g : groups) --gathered_[static_cast<std::size_t>(g)].users;
    return s;
  }
  return Status::ok();
}

Status Coordinator::release(int module, model::Phase) {
  for (int g : groups_of(module)) {
    Gathered& gathered = gathered_[static_cast<std::size_t>(g)];
    if (gathered.users <= 0) {
      return Status::internal(fmt::format("release of a group that module {} does not hold",
                                          model_.modules()[static_cast<std::size_t>(module)].name));
    }
    if (--gathered.users > 0 || gathered.persistent) continue;
    // Keep the copy if the trace says it is needed again soon; free it otherwise.
    if (next_use_distance(g) > opt_.max_reuse_distance) drop(g);
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
    const ParamPlace& place = plan_.place(static_cast<std::size_t>(spec.params[k]));
    GatherBlock& buf = grads_[place.group];
    if (buf.data() == nullptr) {
      // Gathered size, zero: the padding past the group's end is reduced as zeros.
      const std::size_t n = gathered_size(place.group);
      // Spare gradient buffers and live ones share grad_limit_; past it, spares go first.
      if (!grad_spare_.holds(n)) {
        const std::uint64_t want = grad_live_ + n;
        grad_spare_.trim_to(want < grad_limit_ ? grad_limit_ - want : 0);
        ++stats_.grad_allocations;
      }
      buf = grad_spare_.take(n);
      if (buf.data() == nullptr) buf = target_.allocate(n);
      if (buf.data() == nullptr && n > 0) {
        return Status::resource_exhausted(fmt::format("cannot allocate {} fp32 elements of {} memory for the gradient of {}",
                                                      n, target_.name(),
                                                      model_.params()[static_cast<std::size_t>(spec.params[k])].name));
      }
      ZINF_RETURN_IF_ERROR(target_.zero(buf));
      grad_live_ += n;
      stats_.grad_high_water = std::max(stats_.grad_high_water, grad_live_ + grad_spare_.elements());
    }
    grads[k] = buf.data() + place.offset;
  }
  return Status::ok();
}

Status Coordinator::grads_ready(int module) {
  // A group is the parameters one module owns: complete when that module's backward is done.
  for (int g : groups_of(module)) {
    const std::size_t first = plan_.group(static_cast<std::size_t>(g)).params.front();
    if (model_.params()[first].module != module) continue;  // another module's group: completes later
    bucket_.push_back(g);
    bucket_elements_ += plan_.group(static_cast<std::size_t>(g)).numel;
  }
  // One rank has nothing to reduce, and a target that reduces in its own memory reduces each
  // gradient alone: add each gradient in (or start its reduction) as soon as it is complete.
  if (bucket_elements_ >= opt_.reduce_bucket_size || comm_.world_size() == 1 || target_.reduces_in_place()) {
    ZINF_RETURN_IF_ERROR(flush_bucket());
  }
  return drain_downloads(false);
}

Status Coordinator::flush_bucket() {
  if (bucket_.empty()) return Status::ok();
  const int world = comm_.world_size();
  std::size_t total = 0;
  for (int g : bucket_) total += plan_.group(static_cast<std::size_t>(g)).per_rank;
  // Where each group's reduced slice is read from: its own gradient with one rank (nothing to
  // reduce) or when the target reduces it in its memory (hold_or_download), else the
  // reduce-scatter's output.
  const float* reduced = nullptr;
  if (world > 1 && !target_.reduces_in_place()) {
    // send: W blocks of `total`, block r holding every bucket group's rank-r slice. A bucket of
    // one group is already laid out so (its gradient has the gathered layout): no packing.
    const std::size_t send_n = total * static_cast<std::size_t>(world);
    if (recv_.size() < total) recv_ = model::FloatBuffer::allocate(total);
    const float* send = grads_[static_cast<std::size_t>(bucket_.front())].data();
    if (bucket_.size() > 1) {
      if (send_.size() < send_n) send_ = model::FloatBuffer::allocate(send_n);
      if (send_.data() == nullptr && total > 0) {
        return Status::resource_exhausted(fmt::format("cannot allocate a {}-element gradient bucket", send_n));
      }
      for (int r = 0; r < world; ++r) {
        float* block = send_.data() + total * static_cast<std::size_t>(r);
        for (int g : bucket_) {
          const std::size_t per_rank = plan_.group(static_cast<std::size_t>(g)).per_rank;
          std::memcpy(block, grads_[static_cast<std::size_t>(g)].data() + per_rank * static_cast<std::size_t>(r),
                      per_rank * sizeof(float));
          block += per_rank;
        }
      }
      send = send_.data();
    }
    if (recv_.data() == nullptr && total > 0) {
      return Status::resource_exhausted(fmt::format("cannot allocate a {}-element gradient bucket", total));
    }
    ZINF_RETURN_IF_ERROR(
        comm_.reduce_scatter(std::span<const float>(send, send_n), std::span<float>(recv_.data(), total)));
    reduced = recv_.data();
  }
  std::size_t off = 0;
  for (int g : bucket_) {
    const auto idx = static_cast<std::size_t>(g);
    const std::size_t per_rank = plan_.group(idx).per_rank;
    const std::size_t grad_n = grads_[idx].size();
    if (reduced != nullptr) {
      ZINF_RETURN_IF_ERROR(accumulate(idx, reduced + off));
    } else if (grad_store_.on_device()) {
      // The store is in the same device memory: added there on the compute stream, nothing comes back.
      ZINF_RETURN_IF_ERROR(grad_store_.accumulate_on_device(idx, grads_[idx].data()));
      if (on_added_) on_added_(idx);
    } else if (!target_.asynchronous()) {
      ZINF_RETURN_IF_ERROR(accumulate(idx, grads_[idx].data()));
    } else {
      // The gradient is in device memory: held there, or downloaded and added in once landed.
      ZINF_RETURN_IF_ERROR(hold_or_download(idx));
    }
    off += per_rank;
    grad_live_ -= grad_n;
    if (!target_.asynchronous() &&
        grad_live_ + grad_spare_.elements() + grads_[idx].size() <= grad_limit_) {
      // Kept for the next module's (or the next pass's) gradients, within grad_limit_.
      grad_spare_.keep(std::move(grads_[idx]));
    }
    grads_[idx] = GatherBlock();
  }
  bucket_.clear();
  bucket_elements_ = 0;
  ++stats_.buckets;
  return Status::ok();
}

Status Coordinator::hold_or_download(std::size_t g) {
  GatherBlock& held = held_[g];
  GatherBlock& grad = grads_[g];  // empty when end_pass() brings back a sum its pass did not add to
  if (held.data() != nullptr && grad.data() != nullptr) ZINF_RETURN_IF_ERROR(target_.add(held, grad));
  if (hold_) {
    if (held.data() != nullptr) return Status::ok();
    if (held_elements_ + grad.size() <= opt_.hold_gradient_elements) {
      // The first micro-batch's gradient becomes the sum (the model wrote it into a zeroed block).
      held_elements_ += grad.size();
      stats_.held_high_water = std::max(stats_.held_high_water, held_elements_);
      held = std::move(grad);
      return Status::ok();
    }
  }
  GatherBlock& src = held.data() != nullptr ? held : grad;
  // The host runs ahead of the device's compute: without a bound, the last backward would start
  // a download (and its pinned staging) for every group before the first lands, 4 bytes a
  // parameter of host memory. Past the target's bound the oldest is waited for and added first.
  const std::size_t bound = std::max<std::size_t>(target_.max_downloads_in_flight(), 1);
  if (downloads_.size() >= bound) ZINF_RETURN_IF_ERROR(drain_downloads(true, bound - 1));
  const std::size_t per_rank = plan_.group(g).per_rank;
  std::size_t slice = 0;  // the gradient's own elements with one rank
  if (comm_.world_size() > 1) {
    // Reduced across ranks where it is, once per step's sum: only this rank's slice comes down.
    ZINF_RETURN_IF_ERROR(target_.reduce_scatter(src, per_rank));
    slice = per_rank * static_cast<std::size_t>(comm_.rank());
  }
  ZINF_ASSIGN_OR_RETURN(std::uint64_t ticket, target_.start_download(src, slice, per_rank));
  downloads_.push_back({g, ticket});
  ++stats_.grad_downloads;
  if (held.data() != nullptr) {
    held_elements_ -= held.size();
    held = GatherBlock();  // fenced by its download
  }
  return Status::ok();
}

void Coordinator::drop_held_gradients() {
  for (GatherBlock& b : held_) b = GatherBlock();
  held_elements_ = 0;
}

Status Coordinator::accumulate(std::size_t group, const float* reduced) {
  const auto t0 = std::chrono::steady_clock::now();
  ZINF_RETURN_IF_ERROR(grad_store_.accumulate(group, std::span<const float>(reduced, plan_.group(group).per_rank)));
  stats_.grad_store_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (on_added_) on_added_(group);
  return Status::ok();
}

Status Coordinator::drain_downloads(bool wait, std::size_t leave) {
  std::size_t done = 0;
  for (; done < downloads_.size(); ++done) {
    const PendingDownload& d = downloads_[done];
    const bool must = wait && downloads_.size() - done > leave;
    ZINF_ASSIGN_OR_RETURN(std::span<const float> landed, target_.finish_download(d.ticket, must));
    if (landed.data() == nullptr) break;  // still in flight: later ones wait for their turn
    ZINF_RETURN_IF_ERROR(accumulate(d.group, landed.data()));
    target_.release_download(d.ticket);
  }
  downloads_.erase(downloads_.begin(), downloads_.begin() + static_cast<std::ptrdiff_t>(done));
  return Status::ok();
}

}  // namespace zinf::zero3
