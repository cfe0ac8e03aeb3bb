// LlamaGpu on the host kernels (host_kernels.cpp: the GPU kernel API per its contracts, in plain
// loops on host memory) against the CPU LlamaModel, on every machine: every shape and family of
// llama_variants.h, with and without activation checkpointing. Tolerances as gpu_llama_test's
// (the loss within 2e-2 relative, every gradient within 5e-2 relative L2; the margins measured
// are in docs/gpu-kernels.md); the module calls are the CPU model's, and checkpointing changes no
// bit. What it cannot catch: a kernel that breaks its contract, or a stream-ordering bug
// (everything here is synchronous); those need gpu_llama_test on a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "gpu/llama_gpu.h"
#include "gpu_model_test_util.h"
#include "llama_variants.h"

namespace zinf::gpu {
namespace {

// Every parameter as bf16 host memory, every gradient fp32 (zeroed).
class HostParams final : public testing::RecordingGpuAccess {
 public:
  HostParams(const model::LlamaModel& m, const model::LocalParams& lp) : RecordingGpuAccess(m.modules()) {
    for (const model::ParamSpec& s : m.params()) {
      std::span<const float> p = lp.param(s.index);
      std::vector<bf16> v(p.size());
      for (size_t i = 0; i < p.size(); i++) {
        const uint16_t b = testing::bf16_bits(p[i]);
        std::memcpy(static_cast<void*>(&v[i]), &b, sizeof b);
      }
      values_.push_back(std::move(v));
      grads.emplace_back(p.size(), 0.0f);
    }
  }
  std::vector<std::vector<float>> grads;

 private:
  const bf16* value(int p) override { return values_[static_cast<size_t>(p)].data(); }
  float* grad_buffer(int p) override { return grads[static_cast<size_t>(p)].data(); }
  std::vector<std::vector<bf16>> values_;
};

struct HostRun {
  float loss = 0, eval_loss = 0;
  std::vector<std::vector<float>> grads;
  std::vector<std::string> log;
};

// The host kernels ignore the cuBLASLt handle; LlamaGpu::create only checks that it is there.
Blas* unused_blas() { return reinterpret_cast<Blas*>(alignof(std::max_align_t)); }

HostRun run_host(const model::LlamaConfig& c, const std::vector<int32_t>& in, const std::vector<int32_t>& tg, int B,
                 int T, float loss_scale) {
  HostRun r;
  model::LlamaModel cpu = model::testing::make_llama(c);
  model::LocalParams lp = model::testing::must(model::LocalParams::create(cpu.params(), cpu.modules()));
  testing::set_params(lp, cpu.params());
  HostParams params(cpu, lp);
  auto net = LlamaGpu::create(c, unused_blas(), nullptr);
  EXPECT_TRUE(net.is_ok()) << net.status().to_string();
  if (!net.is_ok()) return r;
  const uint64_t bytes = LlamaGpu::workspace_bytes(c, B * T);
  std::unique_ptr<void, decltype(&std::free)> ws(std::aligned_alloc(256, (bytes + 255) / 256 * 256), &std::free);
  std::memset(ws.get(), 0xff, bytes);  // NaN in every bf16 and fp32 view: a read before a write shows
  const Status bound = (*net)->bind_workspace(ws.get(), bytes, B * T);
  EXPECT_TRUE(bound.is_ok()) << bound.to_string();
  r.loss = model::testing::must((*net)->forward_backward(in, tg, B, T, params, loss_scale));
  r.grads = params.grads;
  r.log = params.log;
  r.eval_loss = model::testing::must((*net)->forward_loss(in, tg, B, T, params));
  return r;
}

TEST(LlamaGpuOnHostKernels, MatchesCpuModel) {
  constexpr int B = 2, T = 37;
  for (const testing::Variant& v : testing::variants()) {
    SCOPED_TRACE(v.name);
    model::LlamaConfig c = v.config;
    const std::vector<int32_t> in = model::testing::random_tokens(1, B * T, c.vocab_size);
    const std::vector<int32_t> tg = model::testing::random_tokens(2, B * T, c.vocab_size);
    model::LlamaModel cpu_model = model::testing::make_llama(c);
    const testing::CpuRun cpu = testing::run_cpu(cpu_model, in, tg, B, T, 4.0f);
    const HostRun got = run_host(c, in, tg, B, T, 4.0f);
    ASSERT_EQ(got.grads.size(), cpu.grads.size());
    EXPECT_NEAR(got.loss, cpu.loss, 2e-2 * std::fabs(cpu.loss));
    EXPECT_NEAR(got.eval_loss, cpu.eval_loss, 2e-2 * std::fabs(cpu.eval_loss));
    EXPECT_EQ(got.log, cpu.log) << "the module calls differ from the CPU model's";
    for (const model::ParamSpec& s : cpu_model.params()) {
      EXPECT_LT(testing::rel_l2(got.grads[static_cast<size_t>(s.index)], cpu.grads[static_cast<size_t>(s.index)]),
                5e-2)
          << s.name;
    }
    c.activation_checkpointing = true;
    const HostRun ckpt = run_host(c, in, tg, B, T, 4.0f);
    EXPECT_EQ(ckpt.loss, got.loss);
    EXPECT_EQ(ckpt.grads, got.grads) << "checkpointing changed a gradient bit";
    model::LlamaModel cpu_ckpt = model::testing::make_llama(c);
    EXPECT_EQ(ckpt.log, testing::run_cpu(cpu_ckpt, in, tg, B, T, 4.0f).log) << "recompute calls differ";
  }
}

}  // namespace
}  // namespace zinf::gpu
