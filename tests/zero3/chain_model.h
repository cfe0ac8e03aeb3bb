// Test helpers for the coordinator: a model of many small modules whose values and gradients
// are known in closed form, and a parameter tier that records every read and prefetch.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "zero3/tiers.h"
#include "zinf/model/model.h"
#include "zinf/model/module_calls.h"
#include "zinf/swap/param_sink.h"

namespace zinf::zero3::testing {

constexpr std::size_t kSize = 100;  // elements per parameter

// "embed" owns p0; "m1".."mN" own p1..pN; "head" uses p0 again (tied, like GPT's lm_head).
// Forward visits embed, m1..mN, head; backward head, mN..m1, embed.
class ChainModel final : public model::Model {
 public:
  explicit ChainModel(int n) {
    auto add = [&](const std::string& module, int param) {
      modules_.push_back({module, {param}, true});
      if (param == static_cast<int>(params_.size())) {
        model::ParamSpec p;
        p.name = fmt::format("p{}", param);
        p.shape = {static_cast<std::int64_t>(kSize)};
        p.numel = kSize;
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
  Result<float> forward_backward(std::span<const int32_t> in, std::span<const int32_t> tg, int B, int T,
                                 model::ParamAccess& access, float) override {
    ZINF_ASSIGN_OR_RETURN(float loss, forward_loss(in, tg, B, T, access));
    for (int m = static_cast<int>(modules_.size()) - 1; m >= 0; --m) {
      ZINF_RETURN_IF_ERROR(model::run_module_backward(access, modules_, m, [](const float* const* v, float* const* g) {
        for (std::size_t i = 0; i < kSize; ++i) g[0][i] += v[0][i];
      }));
    }
    return loss;
  }
  Result<float> forward_loss(std::span<const int32_t>, std::span<const int32_t>, int, int,
                             model::ParamAccess& access) override {
    float loss = 0;
    for (int m = 0; m < static_cast<int>(modules_.size()); ++m) {
      ZINF_RETURN_IF_ERROR(model::run_module_forward(access, modules_, m, model::Phase::kForward,
                                                     [&](const float* const* v) { loss += v[0][0]; }));
    }
    return loss;
  }
  Status reserve(int, int) override { return Status::ok(); }
  uint64_t activation_bytes(int, int) const override { return 0; }

 private:
  std::vector<model::ParamSpec> params_;
  std::vector<model::ModuleSpec> modules_;
};

// A parameter tier that serves every element of partition p as the value p + 1 and logs reads
// and prefetches.
class RecordingTier final : public ParamTier {
 public:
  explicit RecordingTier(std::size_t partitions) : pending_(partitions, false) {}
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
    std::fill(dst.begin(), dst.end(), static_cast<float>(p + 1));
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
  std::vector<std::size_t> reads;  // partitions read this pass, in order
  int unprefetched_reads = 0;      // reads with no prefetch before them
  int prefetches = 0;

 private:
  std::vector<bool> pending_;
  swap::HostParamSink sink_{{}, swap::DType::kF32};  // never written: no optimizer here
};

}  // namespace zinf::zero3::testing
