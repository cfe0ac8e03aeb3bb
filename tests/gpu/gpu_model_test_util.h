// Helpers shared by the whole-model GPU tests (GptGpu, LlamaGpu): parameters already bf16, every
// parameter in device memory behind a recording GpuParamAccess, and the CPU model's run at the
// same parameters.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/gpu_pass.h"
#include "kernel_test_util.h"
#include "model_test_util.h"
#include "zinf/model/local_params.h"
#include "zinf/model/model.h"

namespace zinf::gpu::testing {

// Parameters away from init so every gradient path carries signal, already bf16 values: norm
// weights around 1, every other parameter 0.1 * N(0, 1).
inline void set_params(model::LocalParams& lp, std::span<const model::ParamSpec> specs) {
  uint64_t k = 0;
  for (const model::ParamSpec& s : specs) {
    for (float& x : lp.param(s.index)) {
      const double z = model::detail::normal_from_key(model::detail::hash3(77, k++, 5));
      const double v = s.init == model::ParamInit::kOnes ? 1.0 + 0.2 * z : 0.1 * z;  // weights and biases
      x = round_bf16(static_cast<float>(v));
    }
  }
}

// A GpuParamAccess over per-parameter value and gradient pointers that records the protocol calls
// in RecordingAccess's words (model_test_util.h), so a GPU net's calls compare with the CPU's.
class RecordingGpuAccess : public GpuParamAccess {
 public:
  explicit RecordingGpuAccess(std::span<const model::ModuleSpec> modules) : modules_(modules.begin(), modules.end()) {}
  Status acquire(int m, model::Phase ph, std::span<const bf16*> v) override {
    log.push_back(fmt::format("acquire {} {}", m, model::phase_name(ph)));
    const auto& ids = modules_[static_cast<size_t>(m)].params;
    for (size_t k = 0; k < ids.size(); k++) v[k] = value(ids[k]);
    return Status::ok();
  }
  Status release(int m, model::Phase ph) override {
    log.push_back(fmt::format("release {} {}", m, model::phase_name(ph)));
    return Status::ok();
  }
  Status grad_buffers(int m, std::span<float*> g) override {
    log.push_back(fmt::format("grads {}", m));
    const auto& ids = modules_[static_cast<size_t>(m)].params;
    for (size_t k = 0; k < ids.size(); k++) g[k] = grad_buffer(ids[k]);
    return Status::ok();
  }
  Status grads_ready(int m) override {
    log.push_back(fmt::format("ready {}", m));
    return Status::ok();
  }

  std::vector<std::string> log;

 protected:
  virtual const bf16* value(int param) = 0;
  virtual float* grad_buffer(int param) = 0;

 private:
  std::vector<model::ModuleSpec> modules_;
};

// Every parameter on the device as bf16, every gradient fp32 (zeroed at the start).
class DeviceParams final : public RecordingGpuAccess {
 public:
  DeviceParams(std::span<const model::ParamSpec> specs, std::span<const model::ModuleSpec> modules,
               const model::LocalParams& values)
      : RecordingGpuAccess(modules) {
    size_t total = 0;
    for (const model::ParamSpec& s : specs) {
      offsets_.push_back(total);
      total += (s.numel + 127) / 128 * 128;  // 256-byte aligned bf16 views, 512-byte fp32
    }
    std::vector<float> host(total, 0.0f);
    for (const model::ParamSpec& s : specs) {
      std::span<const float> p = values.param(s.index);
      std::copy(p.begin(), p.end(), host.begin() + static_cast<std::ptrdiff_t>(offsets_[static_cast<size_t>(s.index)]));
    }
    values_ = std::make_unique<TestBuffer<uint16_t>>(to_bits(host));
    grads_ = std::make_unique<TestBuffer<float>>(std::vector<float>(total, 0.0f));
    numel_.reserve(specs.size());
    for (const model::ParamSpec& s : specs) numel_.push_back(s.numel);
  }

  std::vector<float> grad(int i) const {
    const std::vector<float> all = grads_->download();
    const auto b = all.begin() + static_cast<std::ptrdiff_t>(offsets_[static_cast<size_t>(i)]);
    return std::vector<float>(b, b + static_cast<std::ptrdiff_t>(numel_[static_cast<size_t>(i)]));
  }
  std::vector<float> all_grads() const { return grads_->download(); }
  void zero_grads() { grads_->upload(std::vector<float>(grads_->size(), 0.0f)); }

 private:
  const bf16* value(int p) override { return bf(*values_) + offsets_[static_cast<size_t>(p)]; }
  float* grad_buffer(int p) override { return grads_->get() + offsets_[static_cast<size_t>(p)]; }

  std::vector<size_t> offsets_;
  std::vector<size_t> numel_;
  std::unique_ptr<TestBuffer<uint16_t>> values_;
  std::unique_ptr<TestBuffer<float>> grads_;
};

// The device parameters of `m` at set_params' values.
inline std::unique_ptr<DeviceParams> device_params(const model::Model& m) {
  model::LocalParams lp = model::testing::must(model::LocalParams::create(m.params(), m.modules()));
  set_params(lp, m.params());
  return std::make_unique<DeviceParams>(m.params(), m.modules(), lp);
}

struct CpuRun {
  float loss = 0.0f;
  float eval_loss = 0.0f;
  std::vector<std::vector<float>> grads;
  std::vector<std::string> log;
};

// One training pass and one evaluation of the CPU model at set_params' values: the losses, every
// parameter's gradient, and the training pass's protocol calls.
inline CpuRun run_cpu(model::Model& cpu, const std::vector<int32_t>& in, const std::vector<int32_t>& tg, int B, int T,
                      float loss_scale) {
  model::LocalParams lp = model::testing::must(model::LocalParams::create(cpu.params(), cpu.modules()));
  set_params(lp, cpu.params());
  model::testing::RecordingAccess rec(&lp);
  CpuRun r;
  r.loss = model::testing::must(cpu.forward_backward(in, tg, B, T, rec, loss_scale));
  r.log = rec.log;
  for (const model::ParamSpec& s : cpu.params()) {
    std::span<const float> g = lp.grad(s.index);
    r.grads.emplace_back(g.begin(), g.end());
  }
  r.eval_loss = model::testing::must(cpu.forward_loss(in, tg, B, T, lp));
  return r;
}

// A net (GptGpu, LlamaGpu) bound to a workspace of max_bt positions, with set_params' values of
// `cpu`'s parameters on the device.
template <typename Net>
struct NetSetup {
  std::unique_ptr<Net> net;
  std::unique_ptr<TestBuffer<char>> workspace;
  std::unique_ptr<DeviceParams> params;
};
template <typename Net>
NetSetup<Net> bind_net(Result<std::unique_ptr<Net>> created, const model::Model& cpu, int max_bt) {
  NetSetup<Net> s;
  EXPECT_TRUE(created.is_ok()) << created.status().to_string();
  if (!created.is_ok()) return s;
  s.net = std::move(created).value();
  const uint64_t bytes = s.net->workspace_bytes_for(max_bt);
  s.workspace = std::make_unique<TestBuffer<char>>(bytes);
  const Status bound = s.net->bind_workspace(s.workspace->get(), bytes, max_bt);
  EXPECT_TRUE(bound.is_ok()) << bound.to_string();
  s.params = device_params(cpu);
  return s;
}

// The net's training pass and evaluation against the CPU model's at the same parameters (run_cpu):
// the losses within 2e-2 relative, every parameter's gradient within 5e-2 relative L2 error, and
// the same module calls in the same order.
template <typename Net>
void expect_matches_cpu(NetSetup<Net>& g, const CpuRun& cpu, const std::vector<int32_t>& in,
                        const std::vector<int32_t>& tg, int B, int T, float loss_scale) {
  ASSERT_TRUE(g.net);
  Result<float> loss = g.net->forward_backward(in, tg, B, T, *g.params, loss_scale);
  ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
  EXPECT_NEAR(*loss, cpu.loss, 2e-2 * std::fabs(cpu.loss));
  EXPECT_EQ(g.params->log, cpu.log) << "the module calls differ from the CPU model's";
  for (const model::ParamSpec& s : g.net->params()) {
    const std::vector<float> got = g.params->grad(s.index);
    EXPECT_LT(rel_l2(got, cpu.grads[static_cast<size_t>(s.index)]), 5e-2) << s.name;
  }
  Result<float> eval = g.net->forward_loss(in, tg, B, T, *g.params);
  ASSERT_TRUE(eval.is_ok()) << eval.status().to_string();
  EXPECT_NEAR(*eval, cpu.eval_loss, 2e-2 * std::fabs(cpu.eval_loss));
}

// Without and with activation checkpointing: the same loss and gradients bit for bit, and the
// recomputing net's calls are the CPU model's with checkpointing (cpu_ckpt).
template <typename Net>
void expect_checkpointing_changes_no_bit(NetSetup<Net>& plain, NetSetup<Net>& ckpt, const CpuRun& cpu_ckpt,
                                         const std::vector<int32_t>& in, const std::vector<int32_t>& tg, int B,
                                         int T) {
  ASSERT_TRUE(plain.net && ckpt.net);
  Result<float> a = plain.net->forward_backward(in, tg, B, T, *plain.params, 1.0f);
  Result<float> b = ckpt.net->forward_backward(in, tg, B, T, *ckpt.params, 1.0f);
  ASSERT_TRUE(a.is_ok() && b.is_ok()) << a.status().to_string() << b.status().to_string();
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(plain.params->all_grads(), ckpt.params->all_grads());
  EXPECT_EQ(ckpt.params->log, cpu_ckpt.log) << "recompute calls differ from the CPU model's";
}

// Two passes give the same loss bits and add their gradients; a smaller batch (the first row) in
// the same workspace, then the full one again, gives the first pass's gradients bit for bit.
// Accumulation is within a tolerance: a tied embedding gets two adds per pass (the head's product
// with beta = 1, then the embedding backward's +=), so after two passes it holds ((h+e)+h)+e, which
// differs from 2(h+e) by a few fp32 roundings of |h| + |e|. Every element within 1e-5 of the
// gradients' largest magnitude plus 1e-5 relative; a pass that overwrote instead of adding would be
// off by the whole gradient.
template <typename Net>
void expect_deterministic_and_accumulating(NetSetup<Net>& g, const std::vector<int32_t>& in,
                                           const std::vector<int32_t>& tg, int B, int T) {
  ASSERT_TRUE(g.net);
  Result<float> first = g.net->forward_backward(in, tg, B, T, *g.params, 1.0f);
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  const std::vector<float> once = g.params->all_grads();
  Result<float> second = g.net->forward_backward(in, tg, B, T, *g.params, 1.0f);  // adds to the same buffers
  ASSERT_TRUE(second.is_ok());
  EXPECT_EQ(*first, *second);
  const std::vector<float> twice = g.params->all_grads();
  ASSERT_EQ(twice.size(), once.size());
  float largest = 0.0f;
  for (float x : once) largest = std::max(largest, std::fabs(x));
  ASSERT_GT(largest, 0.0f);
  std::size_t off = 0;
  for (std::size_t i = 0; i < once.size(); ++i) {
    const float want = 2.0f * once[i];
    if (std::fabs(twice[i] - want) > 1e-5f * largest + 1e-5f * std::fabs(want) && off++ < 5) {
      ADD_FAILURE() << "gradient element " << i << ": after two passes " << twice[i] << ", twice one pass is " << want;
    }
  }
  EXPECT_EQ(off, 0u) << "elements outside the accumulation tolerance";
  g.params->zero_grads();
  const std::span<const int32_t> row_in(in.data(), static_cast<size_t>(T)), row_tg(tg.data(), static_cast<size_t>(T));
  Result<float> small = g.net->forward_backward(row_in, row_tg, 1, T, *g.params, 1.0f);
  ASSERT_TRUE(small.is_ok()) << small.status().to_string();
  g.params->zero_grads();
  ASSERT_TRUE(g.net->forward_backward(in, tg, B, T, *g.params, 1.0f).is_ok());
  EXPECT_EQ(g.params->all_grads(), once);
}

// Engine runs: every GPU loss within 2e-2 relative of the CPU's (issue #13's figure for bf16).
inline void expect_close(const std::vector<double>& gpu, const std::vector<double>& cpu, std::string_view what) {
  ASSERT_EQ(gpu.size(), cpu.size());
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    EXPECT_NEAR(gpu[i], cpu[i], 2e-2 * std::fabs(cpu[i])) << what << ", step " << i + 1;
  }
}

}  // namespace zinf::gpu::testing
