// The ZeRO-3 engine: builds the tiers from ds_config, runs micro-batches through the
// coordinator, and takes the optimizer step (norm, overflow, clipping, scaler, schedule).
#include "zinf/zero3/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>

#include <fmt/format.h>

#include "device/host_device.h"
#include "zero3/coordinator.h"
#include "zero3/device_gather_target.h"
#include "zero3/engine_impl.h"
#include "zero3/host_budget.h"
#include "zero3/tier_factory.h"
#include "zinf/log.h"
#include "zinf/optim/clipping.h"
#include "zinf/optim/grad_stats.h"
#include "zinf/zero3/safetensors.h"

namespace zinf::zero3 {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

optim::ParamMap to_param_map(const config::ParamList& list) {
  optim::ParamMap map;
  for (const config::Param& p : list.items) {
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::int64_t>) {
            map[p.name] = static_cast<double>(v);
          } else {
            map[p.name] = v;
          }
        },
        p.value);
  }
  return map;
}

swap::DType compute_dtype(const config::DsConfig& ds) {
  if (ds.bf16.enabled) return swap::DType::kBF16;
  if (ds.fp16.enabled) return swap::DType::kF16;
  return swap::DType::kF32;
}

Result<optim::LossScaler> make_scaler(const config::DsConfig& ds) {
  optim::LossScalerConfig c;
  if (ds.fp16.enabled) {
    c.loss_scale = ds.fp16.loss_scale;
    c.initial_scale_power = static_cast<int>(ds.fp16.initial_scale_power);
    c.loss_scale_window = ds.fp16.loss_scale_window;
    c.hysteresis = static_cast<int>(ds.fp16.hysteresis);
    c.consecutive_hysteresis = ds.fp16.consecutive_hysteresis;
    c.min_loss_scale = ds.fp16.min_loss_scale;
  } else {
    c.loss_scale = 1.0;  // bf16 and fp32 need no scaling; an overflow still skips the step
  }
  return optim::LossScaler::create(c);
}

}  // namespace

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

const model::Model& Engine::model() const { return *impl_->model; }
const EngineCounters& Engine::counters() const { return impl_->counters; }
const HostBudgetReport& Engine::host_budget() const { return impl_->budget; }
std::uint64_t Engine::bytes_moved() const { return impl_->optimizer->bytes_moved() + impl_->grads->bytes_moved(); }
std::uint64_t Engine::checkpoint_bytes() const {
  return impl_->rank_file_bytes(impl_->optimizer->optimizer().state_count());
}

std::uint64_t Engine::Impl::rank_file_bytes(std::size_t optimizer_states) const {
  // checkpoint.cpp: per sub-group, the master weights and each state, fp32, back to back.
  std::uint64_t bytes = 0;
  for (const swap::SubGroup& sg : layout.subgroups) bytes += sg.numel * sizeof(float) * (1 + optimizer_states);
  return bytes;
}

std::string Engine::describe() const {
  const Impl& m = *impl_;
  return fmt::format(
      "model {} params ({}) | rank {} of {} ({}) | precision {} | "
      "parameters: {} | optimizer: {} | {} sub-group{} | shard {} elements",
      m.model->num_params(), m.model->describe(), m.comm.rank(), m.comm.world_size(), m.comm.name(),
      swap::dtype_name(m.dtype), m.params->describe(), m.optimizer->describe(), m.layout.subgroups.size(),
      m.layout.subgroups.size() == 1 ? "" : "s", m.plan.shard_numel());
}

Result<std::unique_ptr<Engine>> Engine::create(std::unique_ptr<model::Model> model, const EngineOptions& options,
                                               Communicator& comm) {
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, Impl::build(std::move(model), options, comm));
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Result<std::unique_ptr<Engine::Impl>> Engine::Impl::build(std::unique_ptr<model::Model> model,
                                                          const EngineOptions& options, Communicator& comm) {
  const config::DsConfig& ds = options.ds;
  if (model == nullptr) return Status::invalid_argument("Engine::create: no model");
  ZINF_RETURN_IF_ERROR(model::validate_layout(*model).with_context(fmt::format("{} model", model->type())));
  if (ds.world_size != comm.world_size()) {
    return Status::invalid_argument(fmt::format("{}: batch sizes were resolved for world size {}, but {} ranks run",
                                                ds.source, ds.world_size, comm.world_size()));
  }
  auto impl = std::unique_ptr<Impl>(new Impl(std::move(model), options, comm));
  ZINF_RETURN_IF_ERROR(impl->init());
  return impl;
}

Engine::Impl::Impl(std::unique_ptr<model::Model> m, const EngineOptions& opts, Communicator& c)
    : options(opts), comm(c), model(std::move(m)), dtype(compute_dtype(opts.ds)) {}

Status Engine::Impl::init() {
  const config::DsConfig& ds = options.ds;
  // The model computes in 16 bits where it can when the run does (its matrix products, matmul.h).
  ZINF_RETURN_IF_ERROR(model->set_compute_precision(
      ds.bf16.enabled ? model::ComputePrecision::kBf16
                      : (ds.fp16.enabled ? model::ComputePrecision::kFp16 : model::ComputePrecision::kFp32)));
  ZINF_ASSIGN_OR_RETURN(plan, model_partition_plan(model->params(), model->modules().size(), comm.world_size()));
  layout = swap::PartitionLayout::build(layout_partitions(model->params(), model->modules(), plan),
                                        static_cast<std::uint64_t>(ds.zero.sub_group_size));

  // Optimizer, schedule, loss scaler.
  optim::OptimizerConfig opt_config;
  if (ds.optimizer) {
    auto parsed = optim::OptimizerConfig::parse(ds.optimizer->type, to_param_map(ds.optimizer->params));
    if (!parsed.is_ok()) return parsed.status().with_context(ds.source + ": optimizer");
    opt_config = parsed.value();
  } else {
    ZINF_ASSIGN_OR_RETURN(opt_config, optim::OptimizerConfig::parse("AdamW", {}));
    log(LogLevel::kInfo, fmt::format("{}: no optimizer block; using AdamW with lr {}", ds.source, opt_config.lr()));
  }
  base_lr = opt_config.lr();
  if (ds.scheduler) {
    auto made = optim::make_schedule(ds.scheduler->type, to_param_map(ds.scheduler->params), base_lr);
    if (!made.is_ok()) return made.status().with_context(ds.source + ": scheduler");
    schedule = std::move(made).value();
  }
  ZINF_ASSIGN_OR_RETURN(scaler, make_scaler(ds));
  counters.loss_scale = scaler->scale();

  // Memory and disk before anything is written: the swap stores take their space as they are made.
  TierContext tier_context{ds, layout, comm.rank(), dtype, options.aio_faults};
  tier_context.world_size = comm.world_size();
  const optim::Optimizer opt(opt_config);
  ZINF_RETURN_IF_ERROR(fit_budget(opt.state_count(), tier_context));
  std::vector<DiskUse> disk = swap_disk_uses(tier_context, opt.state_count(), comm.local_size());
  if (!options.save_dir.empty() && options.save_copies > 0) {
    // Each rank of the node writes its own rank file; engine.json and `latest` are small.
    constexpr std::uint64_t kCheckpointOverhead = std::uint64_t{1} << 20;
    const std::uint64_t one = (rank_file_bytes(opt.state_count()) + kCheckpointOverhead) *
                              static_cast<std::uint64_t>(std::max(1, comm.local_size()));
    disk.push_back(DiskUse{options.save_dir, fmt::format("--save: {} checkpoint{} of {}", options.save_copies,
                                                         options.save_copies == 1 ? "" : "s", format_bytes(one)),
                           one * options.save_copies, 0});
  }
  ZINF_RETURN_IF_ERROR(check_disk_space(disk, options.free_space));

  // Tiers, and where the coordinator gathers.
  if (options.device.kind == EngineDevice::Kind::kHostDevice) {
    device::HostDeviceOptions d;
    d.seed = options.device.seed;
    d.max_delay = std::chrono::microseconds(options.device.max_delay_us);
    d.poison_new_blocks = options.device.poison_new_blocks;
    d.memory_cap = static_cast<std::size_t>(options.device.memory_cap_bytes);
    device = device::HostDevice::create(d);
    device_view = device.get();
  }
  TierContext with_device = tier_context;
  if (options.device.kind == EngineDevice::Kind::kModelDevice) {
    device_view = model->compute_device();
    if (device_view == nullptr) {
      return Status::invalid_argument(fmt::format(
          "the {} model computes on the host: it has no device of its own to gather into (EngineDevice kModelDevice "
          "is for GPU models)",
          model->type()));
    }
    if (comm.world_size() > 1) {
      // The model's kernels read device memory, which the host collectives cannot.
      ZINF_ASSIGN_OR_RETURN(std::unique_ptr<DeviceCollectives> collectives, make_device_collectives(*device_view, comm));
      with_device.collectives = std::move(collectives);
      if (comm.rank() == 0) {
        log(LogLevel::kInfo, fmt::format("{} ranks: parameters all-gathered and gradients reduce-scattered in device "
                                         "memory ({})",
                                         comm.world_size(), with_device.collectives->describe()));
      }
    }
    ZINF_RETURN_IF_ERROR(model->use_device_memory());
    with_device.consumer = DeviceGatherOptions::Consumer::kComputeStream;
  }
  with_device.device = device_view;
  // A GPU model's bf16 values are gathered in its compute dtype (with the whole state on the
  // device it reads the state's bf16 copy in place and nothing is gathered).
  if (with_device.consumer == DeviceGatherOptions::Consumer::kComputeStream && dtype == swap::DType::kBF16 &&
      !state_on_device(with_device, opt)) {
    with_device.gather_values = swap::DType::kBF16;
  }
  ZINF_ASSIGN_OR_RETURN(Tiers tiers, make_tiers(with_device, opt));
  handle = std::move(tiers.handle);
  param_handle = std::move(tiers.param_handle);
  optimizer = std::move(tiers.optimizer);
  params = std::move(tiers.params);
  gather = std::move(tiers.gather);
  grads = std::move(tiers.grads);

  ZINF_RETURN_IF_ERROR(init_master_weights());
  ZINF_RETURN_IF_ERROR(publish_params());

  CoordinatorOptions coordinator_options;
  coordinator_options.prefetch_bucket_size = static_cast<std::uint64_t>(ds.zero.prefetch_bucket_size);
  coordinator_options.param_persistence_threshold = static_cast<std::uint64_t>(ds.zero.param_persistence_threshold);
  coordinator_options.model_persistence_threshold = static_cast<std::uint64_t>(ds.zero.model_persistence_threshold);
  coordinator_options.max_live_parameters = static_cast<std::uint64_t>(ds.zero.max_live_parameters);
  if (coordinator_options.max_live_parameters == 0) {
    log(LogLevel::kNotice, fmt::format("{}: stage3_max_live_parameters 0: no prefetch and nothing kept; only the "
                                       "modules in use are gathered (as the reference, which reads 0 as no prefetch)",
                                       ds.source));
  }
  coordinator_options.max_reuse_distance = static_cast<std::uint64_t>(ds.zero.max_reuse_distance);
  coordinator_options.reduce_bucket_size = static_cast<std::uint64_t>(std::max<std::int64_t>(1, ds.zero.reduce_bucket_size));
  if (device_view != nullptr && gather->asynchronous() && comm.world_size() == 1 && !grads->on_device()) {
    std::uint64_t bytes = options.device.hold_gradient_bytes;
    if (bytes == EngineDevice::kAutoHold) {
      ZINF_ASSIGN_OR_RETURN(const std::uint64_t room, device_view->memory_room());
      bytes = room == UINT64_MAX ? UINT64_MAX : room / 10 * 4;
    }
    coordinator_options.hold_gradient_elements = bytes / sizeof(float);
  }
  coordinator = std::make_unique<Coordinator>(*model, plan, layout, *params, *gather, comm, coordinator_options, *grads);
  if (options.overlap_optimizer) {
    if (early_steps_possible(*optimizer, *params, *grads, layout)) {
      early = std::make_unique<EarlyStepper>(layout, *optimizer, grads->step_views());
    } else {
      log(LogLevel::kNotice, fmt::format("{}: the optimizer step cannot overlap backward with parameters on {} and "
                                         "optimizer state on {} (it needs both in memory); it runs after backward",
                                         ds.source, params->describe(), optimizer->describe()));
    }
  }
  return Status::ok();
}

Status Engine::Impl::fit_budget(std::size_t optimizer_states, TierContext& tiers) {
  const std::uint64_t bytes =
      options.host_memory_budget != 0 ? options.host_memory_budget : options.ds.zinf.host_memory_budget;
  if (bytes == 0) return Status::ok();
  budget_B = static_cast<int>(options.ds.batch.train_micro_batch_size_per_gpu);
  budget_T = options.budget_seq > 0 ? options.budget_seq : model->max_seq();
  // Every rank sizes from the largest RSS of any rank, so that all choose the same knobs (the live
  // limit and the buckets decide which collectives run, and in which order).
  const std::uint64_t rss = process_rss_bytes();
  std::vector<std::uint64_t> all(static_cast<std::size_t>(comm.world_size()), rss);
  if (comm.world_size() > 1) ZINF_RETURN_IF_ERROR(comm.all_gather_u64(std::span<const std::uint64_t>(&rss, 1), all));
  const HostBudgetRequest request{*model, options.ds, plan, layout, optimizer_states, budget_B, budget_T, bytes,
                                  *std::max_element(all.begin(), all.end()), options.overlap_optimizer};
  Result<HostBudgetFit> fit = fit_host_budget(request);
  if (!fit.is_ok()) return fit.status().with_context(options.ds.source);
  for (const std::string& n : fit->notices) log(LogLevel::kNotice, fmt::format("{}: {}", options.ds.source, n));
  options.ds = fit->ds;  // the lowered knobs (the reference `ds` of init() reads them)
  tiers.optimizer_buffer_size = fit->optimizer_buffer_size;
  if (fit->weight_copy_bytes != UINT64_MAX) model->limit_weight_copies(fit->weight_copy_bytes);
  std::string terms;
  for (const MemoryTerm& t : fit->terms) terms += fmt::format("{}{} {}", terms.empty() ? "" : ", ", format_bytes(t.bytes), t.name);
  budget = HostBudgetReport{bytes, fit->total(), fit->pinned_bound, fit->live_bound,
                            fmt::format("host memory budget {}: {} planned ({})", format_bytes(bytes),
                                        format_bytes(fit->total()), terms)};
  log(LogLevel::kInfo, budget.summary);
  return Status::ok();
}

Status Engine::Impl::init_master_weights() {
  const int rank = comm.rank();
  std::function<Status(std::size_t p, std::size_t first, std::span<float> out)> values;
  std::optional<SafetensorsReader> reader;
  std::vector<float> full;
  std::size_t loaded_param = SIZE_MAX;
  // A whole parameter at a time from a file source (kept while its pieces are copied out).
  std::function<Status(std::size_t p, std::span<float> out)> full_source = options.initial_weights;
  if (!full_source && !options.init_from.empty()) {
    ZINF_ASSIGN_OR_RETURN(reader, SafetensorsReader::open(options.init_from));
    full_source = [&](std::size_t p, std::span<float> out) {
      return reader->read_f32(model->params()[p].name, out).with_context("--init-from");
    };
  }
  if (!full_source) {
    values = [&](std::size_t p, std::size_t first, std::span<float> out) {
      model::init_param(model->params()[p], options.seed, out, first);
      return Status::ok();
    };
  } else {
    values = [&](std::size_t p, std::size_t first, std::span<float> out) -> Status {
      const model::ParamSpec& spec = model->params()[p];
      if (loaded_param != p) {
        full.assign(spec.numel, 0.0f);
        ZINF_RETURN_IF_ERROR(full_source(p, full));
        loaded_param = p;
      }
      std::copy_n(full.begin() + static_cast<std::ptrdiff_t>(first), out.size(), out.begin());
      return Status::ok();
    };
  }
  // Elements of the rank's slice that no parameter covers are partition padding: zero.
  return optimizer->init_master([&](std::size_t g, std::uint64_t offset, std::span<float> out) {
    std::fill(out.begin(), out.end(), 0.0f);
    return for_each_param_piece(plan, g, rank, offset, out.size(),
                                [&](std::size_t p, std::size_t first, std::size_t n, std::size_t at) {
                                  return values(p, first, out.subspan(at, n));
                                });
  });
}

// Writes the compute copies of the current master weights into the parameter tier.
Status Engine::Impl::publish_params() {
  ZINF_RETURN_IF_ERROR(optimizer->write_param_copies(params->sink()));
  return params->flush();
}

Result<StepReport> Engine::train_step(std::span<const MicroBatch> micro_batches) {
  return impl_->train_step(micro_batches);
}

Result<StepReport> Engine::Impl::train_step(std::span<const MicroBatch> micro_batches) {
  const auto t0 = Clock::now();
  StepReport r;
  const double io_before = params->io_wait_seconds() + optimizer->io_wait_seconds();
  const auto* device_target = dynamic_cast<const DeviceGatherTarget*>(gather.get());
  const DeviceGatherStats device_before = device_target != nullptr ? device_target->device_stats() : DeviceGatherStats{};
  // Copy-stream seconds so far (NaN: not measured by this device).
  auto copy_seconds = [&](device::StreamRole role) {
    auto s = device_target->device().copy_seconds(role);
    return s.is_ok() ? s.value() : std::numeric_limits<double>::quiet_NaN();
  };
  const double h2d_before = device_target != nullptr ? copy_seconds(device::StreamRole::kH2D) : 0.0;
  const double d2h_before = device_target != nullptr ? copy_seconds(device::StreamRole::kD2H) : 0.0;
  const auto gas = static_cast<double>(micro_batches.size());
  if (micro_batches.empty()) return Status::invalid_argument("train_step needs at least one micro-batch");
  for (const MicroBatch& mb : micro_batches) {
    if (budget.budget != 0 && (mb.B > budget_B || mb.T > budget_T)) {
      return Status::invalid_argument(fmt::format(
          "a micro-batch of {} x {} is larger than the {} x {} the host memory budget sized activations for "
          "(train_micro_batch_size_per_gpu x EngineOptions::budget_seq)",
          mb.B, mb.T, budget_B, budget_T));
    }
  }
  ZINF_RETURN_IF_ERROR(grads->begin_step());
  // Gradients of loss * scale / (gas * W), summed over micro-batches and (by the reduce-scatter)
  // over ranks: scale x the mean gradient of the global batch.
  const double scale = scaler->scale();
  const auto grad_loss_scale = static_cast<float>(scale / (gas * comm.world_size()));
  // The optimizer state the step reads first does not depend on the gradients: its reads run
  // under the passes (into the swapper's own slots; kept for the next step if this one fails).
  ZINF_RETURN_IF_ERROR(optimizer->read_ahead());
  const std::int64_t k = counters.schedule_k;
  // The step's inputs for a gradient scale (the step count, LR and momentum are known now).
  auto step_inputs = [&](double grad_scale) {
    swap::StepArgs in;
    in.ctx.step = counters.updates + 1;
    in.ctx.lr = schedule ? schedule->lr(k) : base_lr;
    if (schedule) in.ctx.beta1 = schedule->momentum(k);
    in.grad_scale = grad_scale;
    in.grads = grads->step_views();
    in.sink = &params->sink();
    return in;
  };
  double loss_sum = 0;
  // Gradients held on the device across the micro-batches come back with the last one's.
  coordinator->drop_held_gradients();
  const double gather_before = coordinator->stats().gather_s;
  const double grad_store_before = coordinator->stats().grad_store_s;
  const std::uint64_t gathered_before = coordinator->stats().gathered_elements;
  r.setup_s = since(t0);
  for (const MicroBatch& mb : micro_batches) {
    const auto p0 = Clock::now();
    coordinator->set_hold_gradients(&mb != &micro_batches.back());
    coordinator->set_next_pass_reuses_values(&mb != &micro_batches.back());
    grads->set_last_micro_batch(&mb == &micro_batches.back());
    if (early && &mb == &micro_batches.back()) {
      // The last micro-batch's additions are final: each sub-group may step as soon as its are.
      early->begin(step_inputs(1.0 / scale));
      coordinator->set_on_gradient_added([this](std::size_t p) { early->partition_final(p); });
    }
    coordinator->begin_pass(true);
    auto loss = model->forward_backward(mb.inputs, mb.targets, mb.B, mb.T, *coordinator, grad_loss_scale);
    Status ended = loss.is_ok() ? coordinator->end_pass() : loss.status();
    coordinator->set_on_gradient_added(nullptr);
    if (!ended.is_ok()) {
      coordinator->set_hold_gradients(false);
      coordinator->set_next_pass_reuses_values(false);
      coordinator->drop_held_gradients();
      // Early steps taken under this pass are rolled back: the step did not happen.
      if (early) {
        (void)early->stats();  // waits for the worker
        (void)early->finish(nullptr);
      }
      return ended;
    }
    const double pass = since(p0);
    r.forward_s += coordinator->stats().backward_start_s;
    r.backward_s += pass - coordinator->stats().backward_start_s;
    loss_sum += loss.value();
    r.tokens += static_cast<std::uint64_t>(mb.B) * static_cast<std::uint64_t>(mb.T);
  }
  const auto passes_end = Clock::now();
  // The early stepper's stats and remaining steps read the sums through step_views().
  ZINF_RETURN_IF_ERROR(grads->end_accumulation());
  r.live_high_water = coordinator->stats().live_high_water;
  r.gather_s = coordinator->stats().gather_s - gather_before;
  r.grad_store_s = coordinator->stats().grad_store_s - grad_store_before;
  r.gathered_elements = coordinator->stats().gathered_elements - gathered_before;
  if (device_target != nullptr) {
    const DeviceGatherStats& d = device_target->device_stats();
    r.h2d_bytes = d.h2d_bytes - device_before.h2d_bytes;
    r.d2h_bytes = d.d2h_bytes - device_before.d2h_bytes;
    r.device_wait_s = d.ready_wait_s - device_before.ready_wait_s;
    r.download_wait_s = d.download_wait_s - device_before.download_wait_s;
    r.staging_wait_s = d.staging_wait_s - device_before.staging_wait_s;
    r.device_peak_bytes = device_target->device().allocator_stats().peak_reserved;
    r.h2d_copy_s = copy_seconds(device::StreamRole::kH2D) - h2d_before;
    r.d2h_copy_s = copy_seconds(device::StreamRole::kD2H) - d2h_before;
  }
  std::vector<double> reduced = {loss_sum / gas, 0.0, 0.0};
  // Global squared norm and overflow over the rank's partitions, in sub-group order.
  const auto o0 = Clock::now();
  r.after_passes_s = std::chrono::duration<double>(o0 - passes_end).count();
  optim::GradStats all;
  if (early) {
    // The early steps' per-sub-group stats, folded in sub-group order as the store folds them.
    ZINF_ASSIGN_OR_RETURN(const std::vector<optim::GradStats> sg_stats, early->stats());
    for (const optim::GradStats& s : sg_stats) all += s;
  } else {
    ZINF_ASSIGN_OR_RETURN(all, grads->stats());
  }
  {
    const optim::GradStats& s = all;
    reduced[1] += s.sq_norm;
    if (!s.finite()) reduced[2] += 1.0;
  }
  ZINF_RETURN_IF_ERROR(comm.all_reduce_sum(reduced));
  r.loss = reduced[0] / comm.world_size();
  r.loss_scale = scale;
  const bool overflow = reduced[2] > 0.0 || !std::isfinite(reduced[1]);
  ++counters.steps;
  r.step = counters.steps;
  r.lr = schedule ? schedule->lr(k) : base_lr;
  // Keeps or rolls back the early steps and takes the rest of the step (in: null when skipped).
  auto finish_early = [&](const swap::StepArgs* in) -> Status {
    ZINF_ASSIGN_OR_RETURN(EarlyStepReport e, early->finish(in));
    r.early_subgroups = e.stepped_early;
    r.early_rolled_back = e.rolled_back;
    r.optimizer_hidden_s = e.hidden_s;
    return Status::ok();
  };
  if (overflow) {
    r.skipped = true;
    r.grad_norm = std::numeric_limits<double>::infinity();
    if (early) ZINF_RETURN_IF_ERROR(finish_early(nullptr));
    ZINF_RETURN_IF_ERROR(scaler->update(true));
  } else {
    const double norm = std::sqrt(reduced[1]);
    double grad_scale = 1.0 / scale;
    r.grad_norm = norm / scale;
    if (options.ds.gradient_clipping > 0.0) {
      grad_scale = optim::clip_gradients(norm, scale, options.ds.gradient_clipping).grad_scale;
    }
    const swap::StepArgs in = step_inputs(grad_scale);
    if (early) {
      ZINF_RETURN_IF_ERROR(finish_early(&in));
    } else {
      ZINF_RETURN_IF_ERROR(optimizer->step(in));
    }
    ZINF_RETURN_IF_ERROR(params->flush());
    coordinator->invalidate_gathered();
    ZINF_RETURN_IF_ERROR(scaler->update(false));
    ++counters.updates;
    ++counters.schedule_k;
  }
  sync_scaler_counters();
  r.optimizer_s = since(o0);
  r.io_wait_s = params->io_wait_seconds() + optimizer->io_wait_seconds() - io_before;
  PinnedUse pinned = params->pinned_use();
  pinned += optimizer->pinned_use();
  r.pinned_bytes = pinned.allocated;
  r.pinned_high_water = pinned.high_water;
  r.seconds = since(t0);
  return r;
}

void Engine::Impl::sync_scaler_counters() {
  const optim::LossScaler::State& s = scaler->state();
  counters.loss_scale = s.scale;
  counters.scaler_iteration = s.iteration;
  counters.scaler_last_overflow = s.last_overflow_iteration;
  counters.scaler_hysteresis_left = s.hysteresis_left;
}

Result<double> Engine::eval_loss(const MicroBatch& batch) {
  Impl& m = *impl_;
  m.coordinator->begin_pass(false);
  auto loss = m.model->forward_loss(batch.inputs, batch.targets, batch.B, batch.T, *m.coordinator);
  if (!loss.is_ok()) return loss.status();
  ZINF_RETURN_IF_ERROR(m.coordinator->end_pass());
  std::vector<double> v = {loss.value()};
  ZINF_RETURN_IF_ERROR(m.comm.all_reduce_sum(v));
  return v[0] / m.comm.world_size();
}

Status Engine::read_full_param(std::size_t index, std::span<float> out) {
  Impl& m = *impl_;
  if (index >= m.model->params().size() || out.size() != m.model->params()[index].numel) {
    return Status::invalid_argument(fmt::format("read_full_param({}) with {} elements", index, out.size()));
  }
  const ParamPlace& place = m.plan.place(index);
  const std::size_t sg = m.layout.subgroup_of[place.group];
  std::vector<float> master(m.layout.subgroups[sg].numel);
  ZINF_RETURN_IF_ERROR(m.optimizer->read_state(sg, StateArray::master(), master));
  const std::size_t per_rank = m.plan.group(place.group).per_rank;
  const float* mine = master.data() + m.layout.offset_in_subgroup[place.group];
  std::vector<float> all(per_rank * static_cast<std::size_t>(m.comm.world_size()));
  ZINF_RETURN_IF_ERROR(m.comm.all_gather(std::span<const float>(mine, per_rank), all));
  std::memcpy(out.data(), all.data() + place.offset, out.size_bytes());
  return Status::ok();
}

}  // namespace zinf::zero3
