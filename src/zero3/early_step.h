// Internal: the optimizer off the critical path (issue 19, part 4). During the last micro-batch's
// backward, each sub-group whose gradients are final is stepped on a worker thread while backward
// goes on, as if nothing will be clipped and nothing overflowed. Then:
//  - the global norm is the sum of the per-sub-group squared norms in sub-group order, the same
//    sum the step at the end takes (the worker computes each sub-group's with the same function);
//  - no overflow and no clipping: the early steps used exactly the step's inputs (grad_scale
//    1 / loss scale is what the step at the end uses when clip_gradients does not clip), so they
//    are kept and only the sub-groups not yet stepped are stepped;
//  - overflow: every early step is rolled back (the tier's snapshot) and the copies rewritten;
//  - clipping: every early step is rolled back and the whole step taken with the clipped scale.
// Either way the bits are those of the step at the end (tested against it). The price is a
// snapshot of each early sub-group's master weights and states (host memory, reused across
// steps), and a wasted early step when a step clips or overflows. Clipping tends to persist
// from step to step (early in training the norm stays above the limit), where rolling back every
// step cost 3x the step on an H100 (docs/gpu.md, run 18): so a step speculates only when the one
// before it was kept as speculated (the first step does); otherwise it is taken at the end.
//
// Only where every sub-group can be stepped alone and the updated copies land in host memory:
// memory optimizer tier (offload_optimizer none / cpu) and a parameter tier whose sink has host
// memory for every sub-group (offload_param none / cpu). The worker then touches only the state
// and the copy of the sub-group it steps, which the passes no longer read.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "zero3/grad_store.h"
#include "zero3/tiers.h"
#include "zinf/model/float_buffer.h"
#include "zinf/optim/grad_stats.h"
#include "zinf/swap/partition_layout.h"

namespace zinf::zero3 {

// Whether the tiers allow early steps (see above): the optimizer steps sub-groups alone, the
// parameter sink has host memory for every sub-group, and the gradients are in memory.
bool early_steps_possible(OptimizerTier& optimizer, ParamTier& params, const GradStore& grads,
                          const swap::PartitionLayout& layout);

struct EarlyStepReport {
  bool speculated = false;        // this step stepped sub-groups early (see above)
  std::size_t stepped_early = 0;  // sub-groups stepped during backward and kept
  std::size_t rolled_back = 0;    // sub-groups stepped during backward and rolled back
  double hidden_s = 0;            // worker seconds stepping while the passes ran
};

class EarlyStepper {
 public:
  // Every reference must outlive the stepper; grads: the rank's gradient partitions, one view
  // per sub-group in memory (GradStore::step_views of a memory store), valid as long.
  EarlyStepper(const swap::PartitionLayout& layout, OptimizerTier& optimizer, std::vector<optim::GradView> grads);
  ~EarlyStepper();  // waits for the worker
  EarlyStepper(const EarlyStepper&) = delete;
  EarlyStepper& operator=(const EarlyStepper&) = delete;

  // Before the last micro-batch's pass: the step as if nothing clips or overflows (its
  // grad_scale is 1 / loss scale).
  void begin(const swap::StepArgs& speculative);
  // Partition p's gradient is final (called from the thread that drives the passes). When its
  // sub-group's are all final, the worker computes the sub-group's stats and steps it.
  void partition_final(std::size_t p);
  // After the passes: waits for the worker, and gives every sub-group's gradient stats (computed
  // here for sub-groups that never completed early).
  Result<std::vector<optim::GradStats>> stats();
  // Ends the step. `in`: the step's real inputs, or nullptr when it is skipped (overflow). Keeps
  // the early steps when in->grad_scale is the speculative one, else rolls them back (and rewrites
  // the copies when skipping); then steps what remains.
  Result<EarlyStepReport> finish(const swap::StepArgs* in);

 private:
  void worker_main();
  Status step_one(std::size_t sg);

  const swap::PartitionLayout& layout_;
  OptimizerTier& optimizer_;
  const std::vector<optim::GradView> grads_;
  swap::StepArgs speculative_;
  std::vector<std::size_t> remaining_;   // per sub-group: partitions not yet final
  // Per sub-group, written by the worker and read after stats() (char: no shared bit words).
  std::vector<char> stepped_;            // stepped early (under a snapshot)
  bool speculate_ = true;                // this step steps early (the last one was kept)
  bool speculate_next_ = true;
  std::vector<char> have_stats_;
  std::vector<optim::GradStats> stats_;  // per sub-group

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::size_t> queue_;
  std::size_t busy_ = 0;   // sub-groups taken by the worker and not finished
  bool stopping_ = false;
  Status failure_;
  double worker_s_ = 0;
  std::thread worker_;  // last: starts after the members it uses
};

}  // namespace zinf::zero3
