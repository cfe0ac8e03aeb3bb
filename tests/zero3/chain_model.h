// Test helpers for the coordinator: a model of many small modules whose values and gradients
// are known in closed form, and a parameter tier that records every read and prefetch.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "device/device.h"
#include "zero3/coordinator.h"
#include "zinf/zero3/engine.h"
#include "zinf/aio/pinned.h"
#include "zinf/optim/half.h"
#include "zero3/tiers.h"
#include "zinf/model/model.h"
#include "zinf/model/module_calls.h"
#include "zinf/swap/param_sink.h"

namespace zinf::zero3::testing {

constexpr std::size_t kSize = 100;  // elements per parameter

// The access a GPU model makes of the engine: acquire_bf16 first (values in place, as bf16 bits
// in device memory), acquire where that is unsupported. The bits are widened on the device's
// compute stream into buffers that live as long as this access, so the model's work items (on the
// same stream, after) read fp32. in_place counts the acquires served in place.
class Bf16FirstAccess final : public model::ParamAccess {
 public:
  Bf16FirstAccess(model::ParamAccess& inner, device::Device& device, std::uint64_t& in_place)
      : inner_(inner), device_(device), in_place_(in_place) {}
  Status acquire(int module, model::Phase phase, std::span<const float*> values) override {
    std::vector<const std::uint16_t*> bits(values.size());
    Status s = inner_.acquire_bf16(module, phase, bits);
    if (s.code() == ErrorCode::kUnsupported) return inner_.acquire(module, phase, values);
    ZINF_RETURN_IF_ERROR(s);
    ++in_place_;
    for (std::size_t k = 0; k < values.size(); ++k) {
      auto& wide = widened_.emplace_back(std::make_unique<float[]>(kSize));
      ZINF_RETURN_IF_ERROR(device_.enqueue(device::StreamRole::kCompute, [src = bits[k], dst = wide.get()](const device::StreamContext&) {
        for (std::size_t i = 0; i < kSize; ++i) dst[i] = optim::bf16_bits_to_f32(src[i]);
        return Status::ok();
      }, "widen bf16 values"));
      values[k] = wide.get();
    }
    return Status::ok();
  }
  Status release(int module, model::Phase phase) override { return inner_.release(module, phase); }
  Status grad_buffers(int module, std::span<float*> grads) override { return inner_.grad_buffers(module, grads); }
  Status grads_ready(int module) override { return inner_.grads_ready(module); }

 private:
  model::ParamAccess& inner_;
  device::Device& device_;
  std::uint64_t& in_place_;
  std::vector<std::unique_ptr<float[]>> widened_;
};

// "embed" owns p0; "m1".."mN" own p1..pN; "head" uses p0 again (tied, like GPT's lm_head).
// Forward visits embed, m1..mN, head; backward head, mN..m1, embed.
// With `stream_device`, every module body runs as a work item on that device's compute stream,
// as a GPU model's kernels do (the host only enqueues; the loss is read once the stream is done):
// what a device gather target owes a kComputeStream consumer is then exercised on the host device.
class ChainModel final : public model::Model {
 public:
  // bf16_first (with a stream device): the model asks for its values as a GPU model does
  // (Bf16FirstAccess); in_place_acquires() counts those served in place.
  // sizes: the elements of p1, p2, ... in turn, repeated (modules of a few sizes cycle, as a
  // transformer's attention and MLP do); p0 has kSize.
  explicit ChainModel(int n, device::Device* stream_device = nullptr, bool bf16_first = false,
                      std::vector<std::size_t> sizes = {kSize})
      : stream_(stream_device), bf16_first_(bf16_first && stream_device != nullptr) {
    auto add = [&](const std::string& module, int param) {
      modules_.push_back({module, {param}, true});
      if (param == static_cast<int>(params_.size())) {
        const std::size_t numel = param == 0 ? kSize : sizes[static_cast<std::size_t>(param - 1) % sizes.size()];
        model::ParamSpec p;
        p.name = fmt::format("p{}", param);
        p.shape = {static_cast<std::int64_t>(numel)};
        p.numel = numel;
        p.init_std = 0.5f;  // distinct values per parameter, so a wrong pointer shows in an engine's results
        p.index = param;
        p.module = static_cast<int>(modules_.size()) - 1;
        params_.push_back(p);
      }
    };
    add("embed", 0);
    for (int i = 1; i <= n; ++i) add(fmt::format("m{}", i), i);
    add("head", 0);
  }
  std::string_view type() const override { return "chain"; }
  std::string describe() const override { return "chain"; }
  std::string config_json() const override { return R"({"type":"chain"})"; }
  std::span<const model::ParamSpec> params() const override { return params_; }
  std::span<const model::ModuleSpec> modules() const override { return modules_; }
  int vocab_size() const override { return 2; }
  int max_seq() const override { return 1; }
  std::uint64_t in_place_acquires() const { return in_place_; }
  Result<float> forward_backward(std::span<const int32_t> in, std::span<const int32_t> tg, int B, int T,
                                 model::ParamAccess& outer, float scale) override {
    if (bf16_first_ && dynamic_cast<Bf16FirstAccess*>(&outer) == nullptr) {
      Bf16FirstAccess first(outer, *stream_, in_place_);
      return forward_backward(in, tg, B, T, first, scale);  // finish() below: read before `first` goes
    }
    model::ParamAccess& access = outer;
    ZINF_ASSIGN_OR_RETURN(float loss, forward_loss(in, tg, B, T, access));
    Status enqueued;
    for (int m = static_cast<int>(modules_.size()) - 1; m >= 0; --m) {
      const std::size_t numel = params_[static_cast<std::size_t>(modules_[static_cast<std::size_t>(m)].params[0])].numel;
      ZINF_RETURN_IF_ERROR(model::run_module_backward(access, modules_, m, [&](const float* const* v, float* const* g) {
        run([v0 = v[0], g0 = g[0], numel] {
          for (std::size_t i = 0; i < numel; ++i) g0[i] += v0[i];
        }, enqueued);
      }));
      ZINF_RETURN_IF_ERROR(enqueued);
    }
    ZINF_RETURN_IF_ERROR(finish());
    return loss;
  }
  Result<float> forward_loss(std::span<const int32_t>, std::span<const int32_t>, int, int,
                             model::ParamAccess& outer) override {
    if (bf16_first_ && dynamic_cast<Bf16FirstAccess*>(&outer) == nullptr) {
      Bf16FirstAccess first(outer, *stream_, in_place_);
      return forward_loss({}, {}, 1, 1, first);
    }
    model::ParamAccess& access = outer;
    auto loss = std::make_shared<float>(0.0f);
    Status enqueued;
    for (int m = 0; m < static_cast<int>(modules_.size()); ++m) {
      ZINF_RETURN_IF_ERROR(model::run_module_forward(access, modules_, m, model::Phase::kForward, [&](const float* const* v) {
        run([v0 = v[0], loss] { *loss += v0[0]; }, enqueued);
      }));
      ZINF_RETURN_IF_ERROR(enqueued);
    }
    ZINF_RETURN_IF_ERROR(finish());
    return *loss;
  }
  device::Device* compute_device() override { return stream_; }
  Status use_device_memory() override { return Status::ok(); }
  Status reserve(int, int) override { return Status::ok(); }
  uint64_t activation_bytes(int, int) const override { return 0; }

 private:
  // Runs `body` now, or enqueues it on the compute stream (the first failure stays in `status`).
  template <typename Body>
  void run(Body body, Status& status) {
    if (stream_ == nullptr) {
      body();
      return;
    }
    if (!status.is_ok()) return;
    status = stream_->enqueue(device::StreamRole::kCompute, [body](const device::StreamContext&) {
      body();
      return Status::ok();
    }, "chain module");
  }
  // Waits for the compute stream's work (nothing to wait for without a stream).
  Status finish() {
    if (stream_ == nullptr) return Status::ok();
    ZINF_ASSIGN_OR_RETURN(device::Event done, stream_->record(device::StreamRole::kCompute));
    return stream_->synchronize(done);
  }

  device::Device* stream_ = nullptr;
  bool bf16_first_ = false;
  std::uint64_t in_place_ = 0;
  std::vector<model::ParamSpec> params_;
  std::vector<model::ModuleSpec> modules_;
};

// The device coordinator tests' options: nothing persistent, two modules' values gathered ahead
// at most, nothing kept past its release, each gradient reduced alone.
inline CoordinatorOptions chain_coordinator_options() {
  CoordinatorOptions o;
  o.param_persistence_threshold = 0;
  o.prefetch_bucket_size = 2 * kSize + 50;
  o.max_live_parameters = 1000000000;
  o.max_reuse_distance = 0;
  o.reduce_bucket_size = 1;
  return o;
}

// One training pass of `model` through `coordinator`; its loss.
inline Result<float> chain_pass(ChainModel& model, Coordinator& coordinator) {
  const std::vector<int32_t> tokens = {0};
  coordinator.begin_pass(true);
  ZINF_ASSIGN_OR_RETURN(float loss, model.forward_backward(tokens, tokens, 1, 1, coordinator, 1.0f));
  ZINF_RETURN_IF_ERROR(coordinator.end_pass());
  return loss;
}

// The loss of a chain of `modules` modules over values p + 1 for partition p: a forward reads
// element 0 of each module's value (embed and head read p0).
inline float chain_expected_loss(int modules) {
  float loss = 1;  // embed
  for (int m = 1; m <= modules; ++m) loss += static_cast<float>(m + 1);
  return loss + 1;  // head
}

// An engine's run of a chain model: each step's report and loss, and the final weights.
struct ChainRun {
  std::vector<StepReport> reports;
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;
  std::uint64_t in_place = 0;  // the model's acquires served in place (ChainModel::in_place_acquires)
};

// Trains a ChainModel(modules, stream, bf16_first) with `o` on `comm` for `steps` steps of
// `micro`; the run, or the first error.
inline Result<ChainRun> train_chain(int modules, device::Device* stream, bool bf16_first, const EngineOptions& o,
                                    Communicator& comm, std::span<const MicroBatch> micro, int steps) {
  ZINF_ASSIGN_OR_RETURN(auto engine, Engine::create(std::make_unique<ChainModel>(modules, stream, bf16_first), o, comm));
  ChainRun run;
  for (int step = 0; step < steps; ++step) {
    ZINF_ASSIGN_OR_RETURN(StepReport r, engine->train_step(micro));
    run.losses.push_back(r.loss);
    run.reports.push_back(r);
  }
  for (std::size_t p = 0; p < engine->model().params().size(); ++p) {
    std::vector<float> w(engine->model().params()[p].numel);
    ZINF_RETURN_IF_ERROR(engine->read_full_param(p, w));
    run.weights.push_back(std::move(w));
  }
  run.in_place = dynamic_cast<const ChainModel&>(engine->model()).in_place_acquires();
  return run;
}

// A parameter tier that serves every element of partition p as the value p + 1 and logs reads
// and prefetches. With `pinned_bf16` it also offers each partition as bf16 in page-locked memory
// of `size` elements (pinned_values: what a memory tier of its own offers), which a device gather
// uploads as it is and widens on the device.
class RecordingTier final : public ParamTier {
 public:
  explicit RecordingTier(std::size_t partitions, bool pinned_bf16 = false, std::size_t size = kSize)
      : pending_(partitions, false) {
    if (!pinned_bf16) return;
    for (std::size_t p = 0; p < partitions; ++p) {
      auto b = aio::PinnedBuffer::allocate(size * sizeof(std::uint16_t));
      EXPECT_TRUE(b.is_ok());
      auto* bits = static_cast<std::uint16_t*>(b.value().data());
      for (std::size_t i = 0; i < size; ++i) bits[i] = optim::f32_to_bf16_bits(static_cast<float>(p + 1));
      pinned_.push_back(std::move(b).value());
    }
  }
  HostValues pinned_values(std::size_t p) override {
    if (p >= pinned_.size()) return {};
    ++pinned_reads;
    return {pinned_[p].data(), swap::DType::kBF16};
  }
  swap::DType dtype() const override { return swap::DType::kF32; }
  std::string describe() const override { return "recording"; }
  void prefetch(std::size_t p) override {
    pending_[p] = true;
    ++prefetches;
  }
  void drop_prefetch(std::size_t p) override { pending_[p] = false; }
  Status read_f32(std::size_t p, std::span<float> dst) override {
    reads.push_back(p);
    if (!pending_[p]) ++unprefetched_reads;
    pending_[p] = false;
    std::fill(dst.begin(), dst.end(), static_cast<float>(p + 1) + value_offset);
    return Status::ok();
  }
  swap::ParamSink& sink() override { return sink_; }
  Status flush() override { return Status::ok(); }
  double io_wait_seconds() const override { return 0; }

  void new_pass() {
    reads.clear();
    unprefetched_reads = 0;
    prefetches = 0;
  }
  std::vector<std::size_t> reads;  // partitions read this pass, in order (read_f32)
  int pinned_reads = 0;            // partitions offered as pinned bf16 (pinned_values)
  int unprefetched_reads = 0;      // reads with no prefetch before them
  int prefetches = 0;
  float value_offset = 0;  // read_f32 serves p + 1 + value_offset (a rank's own values, across ranks)

 private:
  std::vector<bool> pending_;
  std::vector<aio::PinnedBuffer> pinned_;
  swap::HostParamSink sink_{{}, swap::DType::kF32};  // never written: no optimizer here
};

}  // namespace zinf::zero3::testing
