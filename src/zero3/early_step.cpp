// Early optimizer steps under backward, kept or rolled back (early_step.h).
#include "zero3/early_step.h"

#include <chrono>

#include <fmt/format.h>

namespace zinf::zero3 {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

bool early_steps_possible(OptimizerTier& optimizer, ParamTier& params, const GradStore& grads,
                          const swap::PartitionLayout& layout) {
  if (!optimizer.steps_subgroups() || grads.step_views().size() != layout.subgroups.size()) return false;
  for (std::size_t sg = 0; sg < layout.subgroups.size(); ++sg) {
    if (params.sink().host_subgroup(sg) == nullptr) return false;
  }
  return true;
}

EarlyStepper::EarlyStepper(const swap::PartitionLayout& layout, OptimizerTier& optimizer,
                           std::vector<optim::GradView> grads)
    : layout_(layout),
      optimizer_(optimizer),
      grads_(std::move(grads)),
      remaining_(layout.subgroups.size()),
      stepped_(layout.subgroups.size()),
      have_stats_(layout.subgroups.size()),
      stats_(layout.subgroups.size()),
      worker_([this] { worker_main(); }) {}

EarlyStepper::~EarlyStepper() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void EarlyStepper::begin(const swap::StepArgs& speculative) {
  std::lock_guard<std::mutex> lock(mu_);
  speculative_ = speculative;
  speculate_ = speculate_next_;
  for (std::size_t sg = 0; sg < layout_.subgroups.size(); ++sg) {
    // Not speculating: no sub-group ever completes early (stats() computes them all).
    remaining_[sg] = speculate_ ? layout_.subgroups[sg].param_count : 0;
    stepped_[sg] = false;
    have_stats_[sg] = false;
  }
  worker_s_ = 0;
  failure_ = Status::ok();
}

void EarlyStepper::partition_final(std::size_t p) {
  const std::size_t sg = layout_.subgroup_of[p];
  if (remaining_[sg] == 0 || --remaining_[sg] > 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(sg);
  }
  cv_.notify_all();
}

void EarlyStepper::worker_main() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping
    const std::size_t sg = queue_.front();
    queue_.pop_front();
    ++busy_;
    const bool failed = !failure_.is_ok();
    lock.unlock();
    const auto t0 = Clock::now();
    Status st = failed ? Status::ok() : step_one(sg);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    lock.lock();
    worker_s_ += s;
    if (!st.is_ok() && failure_.is_ok()) failure_ = st.with_context(fmt::format("early step of sub-group {}", sg));
    --busy_;
    cv_.notify_all();
  }
}

// On the worker: the sub-group's stats, and its step when it is finite (an overflowing one
// would be rolled back anyway).
Status EarlyStepper::step_one(std::size_t sg) {
  ZINF_ASSIGN_OR_RETURN(stats_[sg], optim::grad_stats(grads_[sg]));
  have_stats_[sg] = true;
  if (!stats_[sg].finite()) return Status::ok();
  ZINF_RETURN_IF_ERROR(optimizer_.snapshot(sg));
  ZINF_RETURN_IF_ERROR(optimizer_.step_subgroup(speculative_, sg));
  stepped_[sg] = true;
  return Status::ok();
}

Result<std::vector<optim::GradStats>> EarlyStepper::stats() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queue_.empty() && busy_ == 0; });
    ZINF_RETURN_IF_ERROR(failure_);
  }
  for (std::size_t sg = 0; sg < layout_.subgroups.size(); ++sg) {
    if (have_stats_[sg]) continue;
    ZINF_ASSIGN_OR_RETURN(stats_[sg], optim::grad_stats(grads_[sg]));
    have_stats_[sg] = true;
  }
  return stats_;
}

Result<EarlyStepReport> EarlyStepper::finish(const swap::StepArgs* in) {
  EarlyStepReport r;
  r.hidden_s = worker_s_;
  r.speculated = speculate_;
  const bool keep = in != nullptr && in->grad_scale == speculative_.grad_scale;
  speculate_next_ = keep;  // clipping and overflow tend to persist: speculate after a kept step only
  for (std::size_t sg = 0; sg < layout_.subgroups.size(); ++sg) {
    if (!stepped_[sg]) continue;
    if (keep) {
      ++r.stepped_early;
    } else {
      ZINF_RETURN_IF_ERROR(optimizer_.restore(sg));
      ++r.rolled_back;
    }
  }
  if (in == nullptr) {
    // Skipped: the restored master weights' copies replace the early steps' copies.
    if (r.rolled_back > 0 && speculative_.sink != nullptr) {
      ZINF_RETURN_IF_ERROR(optimizer_.write_param_copies(*speculative_.sink));
    }
  } else if (keep) {
    for (std::size_t sg = 0; sg < layout_.subgroups.size(); ++sg) {
      if (!stepped_[sg]) ZINF_RETURN_IF_ERROR(optimizer_.step_subgroup(*in, sg));
    }
  } else {
    ZINF_RETURN_IF_ERROR(optimizer_.step(*in));
  }
  for (std::size_t sg = 0; sg < layout_.subgroups.size(); ++sg) stepped_[sg] = false;
  return r;
}

}  // namespace zinf::zero3
