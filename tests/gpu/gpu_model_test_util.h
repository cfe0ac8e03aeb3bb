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

// Every parameter on the device as bf16, every gradient fp32 (zeroed at the start); records
// the protocol calls in RecordingAccess's words.
class DeviceParams final : public GpuParamAccess {
 public:
  DeviceParams(std::span<const model::ParamSpec> specs, std::span<const model::ModuleSpec> modules,
               const model::LocalParams& values)
      : modules_(modules.begin(), modules.end()) {
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

  Status acquire(int m, model::Phase ph, std::span<const bf16*> v) override {
    log.push_back(fmt::format("acquire {} {}", m, model::phase_name(ph)));
    const auto& ids = modules_[static_cast<size_t>(m)].params;
    for (size_t k = 0; k < ids.size(); k++) v[k] = bf(*values_) + offsets_[static_cast<size_t>(ids[k])];
    return Status::ok();
  }
  Status release(int m, model::Phase ph) override {
    log.push_back(fmt::format("release {} {}", m, model::phase_name(ph)));
    return Status::ok();
  }
  Status grad_buffers(int m, std::span<float*> g) override {
    log.push_back(fmt::format("grads {}", m));
    const auto& ids = modules_[static_cast<size_t>(m)].params;
    for (size_t k = 0; k < ids.size(); k++) g[k] = grads_->get() + offsets_[static_cast<size_t>(ids[k])];
    return Status::ok();
  }
  Status grads_ready(int m) override {
    log.push_back(fmt::format("ready {}", m));
    return Status::ok();
  }

  std::vector<float> grad(int i) const {
    const std::vector<float> all = grads_->download();
    const auto b = all.begin() + static_cast<std::ptrdiff_t>(offsets_[static_cast<size_t>(i)]);
    return std::vector<float>(b, b + static_cast<std::ptrdiff_t>(numel_[static_cast<size_t>(i)]));
  }
  std::vector<float> all_grads() const { return grads_->download(); }
  void zero_grads() { grads_->upload(std::vector<float>(grads_->size(), 0.0f)); }

  std::vector<std::string> log;

 private:
  std::vector<model::ModuleSpec> modules_;
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

// Engine runs: every GPU loss within 2e-2 relative of the CPU's (issue #13's figure for bf16).
inline void expect_close(const std::vector<double>& gpu, const std::vector<double>& cpu, std::string_view what) {
  ASSERT_EQ(gpu.size(), cpu.size());
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    EXPECT_NEAR(gpu[i], cpu[i], 2e-2 * std::fabs(cpu[i])) << what << ", step " << i + 1;
  }
}

}  // namespace zinf::gpu::testing
