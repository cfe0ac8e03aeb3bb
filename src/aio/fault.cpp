// FaultInjector: decides, per chunk issue and completion, whether a test rule applies to it.
#include "zinf/aio/fault.h"

namespace zinf::aio {

void FaultInjector::add(FaultRule rule) {
  std::lock_guard lock(mutex_);
  rules_.push_back(Active{std::move(rule), 0});
}

void FaultInjector::clear() {
  std::lock_guard lock(mutex_);
  rules_.clear();
}

FaultDecision FaultInjector::on_completion(bool is_write, const std::string& path) {
  return decide(is_write, path, false);
}

FaultDecision FaultInjector::on_issue(bool is_write, const std::string& path) { return decide(is_write, path, true); }

FaultDecision FaultInjector::decide(bool is_write, const std::string& path, bool at_issue) {
  std::lock_guard lock(mutex_);
  FaultDecision decision;
  for (Active& active : rules_) {
    const FaultRule& rule = active.rule;
    if ((rule.action == FaultAction::kStall) != at_issue) continue;
    if (rule.op == FaultOp::kRead && is_write) continue;
    if (rule.op == FaultOp::kWrite && !is_write) continue;
    if (!rule.path_contains.empty() && path.find(rule.path_contains) == std::string::npos) continue;
    const std::uint64_t index = active.seen++;
    if (index < rule.skip || index - rule.skip >= rule.count) continue;
    switch (rule.action) {
      case FaultAction::kFail:
        decision.fail = true;
        decision.errno_value = rule.errno_value;
        break;
      case FaultAction::kShorten:
        decision.shorten_by = rule.shorten_by;
        break;
      case FaultAction::kZero:
        decision.zero = true;
        break;
      case FaultAction::kDelay:
        decision.delay += rule.delay;
        break;
      case FaultAction::kBreakQueue:
        decision.break_queue = true;
        decision.errno_value = rule.errno_value;
        break;
      case FaultAction::kStall:
        decision.stall = true;
        decision.stall_cancellable = rule.cancellable;
        break;
    }
    injected_.fetch_add(1);
  }
  return decision;
}

}  // namespace zinf::aio
