// The ZeRO-3 training engine: any model::Model whose parameters, gradients and optimizer state are
// partitioned across ranks and kept in memory or offloaded to CPU / NVMe per ds_config.
//
// One train_step() is one optimizer step: gradient_accumulation_steps micro-batches of forward
// and backward (parameters gathered module by module by the coordinator, gradients
// reduce-scattered into fp32 partitions), then the global norm and overflow check, clipping,
// loss scaling, the LR schedule, and the optimizer over the rank's partitions (pipelined over
// NVMe when offloaded). Results do not depend on where state lives: the same config with any
// offload devices gives bit-identical losses and weights.
//
// Threading: one call at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zinf/aio/fault.h"
#include "zinf/config/ds_config.h"
#include "zinf/model/model.h"
#include "zinf/status.h"
#include "zinf/zero3/comm.h"
#include "zinf/zero3/disk_space.h"

namespace zinf::zero3 {

// Where the coordinator keeps a module's gathered parameters and gradients.
//  - kHostMemory: host memory, filled and read in place (the CPU path).
//  - kHostDevice: device memory of a host device (src/device: streams as threads, device memory
//    in host memory), moved through its copy streams: the next module is uploaded while this one
//    computes, gradients are downloaded while backward goes on. It runs the device-resident
//    engine's orchestration on any machine, with the same bits as kHostMemory; random delays per
//    stream item and poisoned new blocks test it (a missing wait shows up as a wrong result).
//  - kModelDevice: the model's own device (model::Model::compute_device(): a GPU model). The
//    coordinator gathers fp32 values into its memory through its copy streams and hands the
//    model device pointers; the model's kernels on the compute stream wait for each upload, and
//    each gradient is downloaded after the kernels that write it, while backward goes on. One
//    rank per engine (W > 1 needs device collectives: refused, naming why).
struct EngineDevice {
  enum class Kind { kHostMemory, kHostDevice, kModelDevice };
  Kind kind = Kind::kHostMemory;
  std::uint64_t seed = 0;         // the host device's delay pattern
  std::uint32_t max_delay_us = 0; // a random sleep up to this long before each stream item
  bool poison_new_blocks = false; // fill new device blocks with NaNs
  std::uint64_t memory_cap_bytes = 0;  // the device memory the engine may hold (0: no cap)
  // Device memory for gradients summed across the micro-batches of a step where they were
  // computed, instead of downloading and adding each micro-batch's (one rank, gradient partitions
  // in host memory or on NVMe): only the step's sums come back. The same bits either way.
  // kAutoHold: up to 40% of the device's room when the engine starts (Device::memory_room; all a
  // host device without a cap has); 0: none; else bytes. Groups past the limit come back as before.
  static constexpr std::uint64_t kAutoHold = UINT64_MAX;
  std::uint64_t hold_gradient_bytes = kAutoHold;
};

struct EngineOptions {
  config::DsConfig ds;    // resolved (load_ds_config)
  std::uint64_t seed = 1234;  // parameter initialisation
  std::string init_from;  // a safetensors file with the full fp32 weights (optional)
  // Or any source of initial weights: fills `out` with parameter `index`'s full fp32 value
  // (model().params()[index].numel elements), e.g. HfFolder::read_param. Called once per
  // parameter a rank holds a piece of, in parameter order. Takes precedence over init_from.
  std::function<Status(std::size_t index, std::span<float> out)> initial_weights = {};
  // Test-only: a fault injector for the NVMe tiers' aio requests (aio::AioConfig::faults).
  std::shared_ptr<aio::FaultInjector> aio_faults = {};
  // Where the coordinator keeps gathered parameters and gradients (see EngineDevice).
  EngineDevice device = {};
  // Step each sub-group's optimizer during the last micro-batch's backward, as soon as its
  // gradients are final, and keep it unless the step clips or overflows (then it is rolled back
  // and taken at the end): the same bits as the step at the end. Needs the optimizer state and the
  // parameters in memory (offload none or cpu); otherwise a notice, and the step at the end.
  bool overlap_optimizer = false;
  // Disk: before anything is created, the swap files' size (and save_copies checkpoints in
  // save_dir, the most this run's saves keep there at once) is checked against the free space
  // of each file system (disk_space.h); a run that cannot fit is refused, naming both. A swap
  // file is removed when its tier closes, whether the run failed or not (they are scratch).
  std::string save_dir = {};
  std::uint64_t save_copies = 0;
  FreeSpaceProbe free_space = {};  // test-only: null asks statvfs
  // Host memory this process may hold, in bytes (0: ds.zinf.host_memory_budget, 0 there too: no
  // budget). Before any work the engine adds up what the run holds whatever its knobs (the RSS
  // now, activations for a micro-batch of ds's train_micro_batch_size_per_gpu x budget_seq,
  // in-memory state) and splits the rest between the NVMe tiers' pinned pools, the gathered
  // parameters (stage3_max_live_parameters, prefetch) and the gradient buckets, lowering what
  // ds_config asks where it does not fit (one notice per key); offload_param.max_in_cpu gets what
  // is left. A budget below the least the run needs is refused, naming that least and its largest
  // terms. Results do not change, only memory (docs/zero3.md, "The host-memory budget").
  std::uint64_t host_memory_budget = 0;
  int budget_seq = 0;  // the window T the activations are sized for (0: the model's max_seq()); a
                       // train_step with a larger B or T is refused
};

// What a host-memory budget sized (Engine::host_budget()); all zero without one.
struct HostBudgetReport {
  std::uint64_t budget = 0;        // bytes
  std::uint64_t planned = 0;       // bytes the run's terms add up to (margin included), <= budget
  std::uint64_t pinned_bound = 0;  // the NVMe pools' bytes at most (StepReport::pinned_high_water)
  std::uint64_t live_bound = 0;    // gathered elements at most (StepReport::live_high_water)
  std::string summary;             // one line: the budget and its terms
};

// One micro-batch: (B, T) input and target token ids of this rank.
struct MicroBatch {
  std::span<const std::int32_t> inputs;
  std::span<const std::int32_t> targets;
  int B = 0;
  int T = 0;
};

struct StepReport {
  std::int64_t step = 0;  // optimizer steps taken, skipped ones included
  double loss = 0;        // mean over the micro-batches (and ranks)
  double lr = 0;          // the learning rate this step used
  double loss_scale = 1;  // the scale this step's gradients carried
  double grad_norm = 0;   // unscaled global norm (before clipping)
  bool skipped = false;   // overflow: no update
  double seconds = 0, forward_s = 0, backward_s = 0, optimizer_s = 0, io_wait_s = 0;
  // Of `seconds`: before the first pass (starting the gradient store's step, the optimizer's
  // read-ahead), and after the last pass until the optimizer phase (optimizer_s) begins.
  double setup_s = 0, after_passes_s = 0;
  // Of the passes (forward_s + backward_s): seconds in gathers (an NVMe tier's reads and their
  // conversion, the all-gather; with an asynchronous device target only the starts) and in the
  // gradient store's accumulations (with the optimizer on NVMe, its synchronous reads and writes).
  double gather_s = 0, grad_store_s = 0;
  std::uint64_t gathered_elements = 0;  // parameter elements gathered (each gather counted; reuse not)
  std::uint64_t tokens = 0;        // tokens this rank processed
  std::uint64_t live_high_water = 0;  // gathered elements at most, this step
  // The step's data movement through the device (EngineDevice kHostDevice; zero otherwise):
  // bytes uploaded (parameters) and downloaded (gradients), the seconds the passes waited for
  // uploads to land (device_wait_s: the compute stream's wait), for gradient downloads and for
  // staging buffers, and the most device memory held at once (the caching allocator's peak).
  std::uint64_t h2d_bytes = 0, d2h_bytes = 0;
  double device_wait_s = 0, download_wait_s = 0, staging_wait_s = 0;
  // Seconds the H2D and D2H copy streams spent copying this step (their GB/s: bytes / these);
  // NaN where the device does not measure them.
  double h2d_copy_s = 0, d2h_copy_s = 0;
  // EngineOptions::overlap_optimizer: sub-groups stepped during backward and kept, or rolled back
  // (the step clipped or overflowed), and the seconds of optimizer work that ran under the passes.
  std::uint64_t early_subgroups = 0, early_rolled_back = 0;
  double optimizer_hidden_s = 0;
  std::uint64_t device_peak_bytes = 0;
  // The NVMe tiers' pinned staging pools (both together): bytes that are memory now (a pool whose
  // budget is more than the model can use grows on demand, docs/swap.md) and the most ever leased.
  std::uint64_t pinned_bytes = 0;
  std::uint64_t pinned_high_water = 0;
};

// Everything a checkpoint restores besides weights and optimizer state.
struct EngineCounters {
  std::int64_t steps = 0;          // optimizer steps taken (skipped included)
  std::int64_t updates = 0;        // successful optimizer steps (the optimizer's t)
  std::int64_t schedule_k = 0;     // LR schedule position
  double loss_scale = 1;
  std::int64_t scaler_iteration = 0;
  std::int64_t scaler_last_overflow = -1;
  int scaler_hysteresis_left = 1;
};

class Engine {
 public:
  // Trains `model` (checked with model::validate_layout; errors name the parameter or module)
  // on the ranks of `comm`, which must outlive the engine.
  static Result<std::unique_ptr<Engine>> create(std::unique_ptr<model::Model> model, const EngineOptions& options,
                                                Communicator& comm);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const model::Model& model() const;
  // One line per tier and the precision, for start-up output.
  std::string describe() const;

  Result<StepReport> train_step(std::span<const MicroBatch> micro_batches);
  Result<double> eval_loss(const MicroBatch& batch);

  // The full fp32 master value of parameter `index` (gathered across ranks).
  Status read_full_param(std::size_t index, std::span<float> out);

  // Checkpoint I/O (see checkpoint.h for the layout). `client_state` is an opaque JSON text
  // stored beside (data loader position and such) and returned by load.
  Status save_checkpoint(const std::string& dir, const std::string& tag, const std::string& client_state);
  Result<std::string> load_checkpoint(const std::string& dir, const std::string& tag);

  // Bytes one checkpoint of this rank takes (its rank file; engine.json aside).
  std::uint64_t checkpoint_bytes() const;

  const EngineCounters& counters() const;
  const HostBudgetReport& host_budget() const;
  std::uint64_t bytes_moved() const;  // NVMe bytes read + written so far by the optimizer tier and the gradient store

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::zero3
