// Fault-injecting wrapper around any backend queue: fails, shortens or delays completions.
#include <thread>
#include <vector>

#include "aio/backend.h"

namespace zinf::aio::detail {
namespace {

class FaultQueue final : public BackendQueue {
 public:
  FaultQueue(std::unique_ptr<BackendQueue> inner, std::shared_ptr<FaultInjector> faults)
      : inner_(std::move(inner)), faults_(std::move(faults)), ops_(inner_->capacity()) {}

  std::size_t capacity() const override { return inner_->capacity(); }

  void prepare(const IoOp& op) override {
    ops_[op.tag] = Seen{op.is_write, op.path};
    inner_->prepare(op);
  }

  void submit() override { inner_->submit(); }

  Result<std::size_t> reap(IoCompletion* out, std::size_t max, std::size_t min_complete) override {
    Result<std::size_t> got = inner_->reap(out, max, min_complete);
    if (!got.is_ok()) return got;
    static const std::string kNoPath;
    for (std::size_t i = 0; i < got.value(); ++i) {
      const Seen& seen = ops_[out[i].tag];
      const FaultDecision d = faults_->on_completion(seen.is_write, seen.path ? *seen.path : kNoPath);
      if (d.delay.count() > 0) std::this_thread::sleep_for(d.delay);
      std::int64_t& result = out[i].result;
      if (d.fail) {
        result = -static_cast<std::int64_t>(d.errno_value);
      } else if (d.zero && result > 0) {
        result = 0;
      } else if (d.shorten_by > 0 && result > 1) {
        // Never shorten to 0: for a read that would mean end of file, not a short transfer.
        const auto by = static_cast<std::int64_t>(d.shorten_by);
        result = result > by ? result - by : 1;
      }
    }
    return got;
  }

  bool supports_fixed_buffers() const override { return inner_->supports_fixed_buffers(); }
  bool set_fixed_buffers(std::span<const iovec> ranges, std::string* why) override {
    return inner_->set_fixed_buffers(ranges, why);
  }

 private:
  struct Seen {
    bool is_write = false;
    const std::string* path = nullptr;
  };
  std::unique_ptr<BackendQueue> inner_;
  std::shared_ptr<FaultInjector> faults_;
  std::vector<Seen> ops_;  // by tag (slot index)
};

}  // namespace

std::unique_ptr<BackendQueue> make_fault_queue(std::unique_ptr<BackendQueue> inner,
                                               std::shared_ptr<FaultInjector> faults) {
  return std::make_unique<FaultQueue>(std::move(inner), std::move(faults));
}

}  // namespace zinf::aio::detail
