// Shared helpers for the optimizer swapper tests: partitions, initial weights, gradients, and
// an in-memory reference step to compare the swapper's state with, bit for bit.
#pragma once

#include <cstring>
#include <random>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "swap_test_util.h"
#include "zinf/optim/half.h"
#include "zinf/swap/optimizer_swapper.h"
#include "zinf/swap/param_sink.h"

namespace zinf::swap::testing {

inline const std::vector<ParamPartition> kParams = {{"wte", 5000},  {"h.0.attn", 3000}, {"h.0.mlp", 10000}, {"h.0.ln", 1},
                                             {"h.1.attn", 7000}, {"h.1.mlp", 12000}, {"lm_head", 2500}};

inline float initial_value(std::size_t p, std::uint64_t i) {
  std::uint64_t x = (p + 1) * 0x9E3779B97F4A7C15ull ^ (i * 0xBF58476D1CE4E5B9ull);
  x ^= x >> 29;
  return static_cast<float>(static_cast<std::int64_t>(x % 2000001) - 1000000) * 1e-6f;
}

inline MasterSource initial_source() {
  return [](std::size_t p, std::uint64_t offset, std::span<float> out) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = initial_value(p, offset + i);
    return Status::ok();
  };
}

struct InMemory {
  PartitionLayout layout;
  optim::Optimizer opt;
  std::vector<std::vector<float>> master;
  std::vector<std::vector<std::vector<float>>> states;  // (sub-group, state)
  std::vector<std::vector<std::uint16_t>> copies;  // 16-bit copies of copy_dtype (fp32: none)
  DType copy_dtype = DType::kBF16;

  InMemory(const PartitionLayout& l, const optim::Optimizer& o) : layout(l), opt(o) {
    for (const SubGroup& g : layout.subgroups) {
      master.emplace_back(g.numel, 0.0f);
      states.emplace_back(opt.state_count(), std::vector<float>(g.numel, 0.0f));
      copies.emplace_back(g.numel, 0);
    }
    for (std::size_t p = 0; p < layout.params.size(); ++p) {
      for (std::uint64_t i = 0; i < layout.params[p].numel; ++i) {
        master[layout.subgroup_of[p]][layout.offset_in_subgroup[p] + i] = initial_value(p, i);
      }
    }
  }
  void step(const StepArgs& in) {
    for (std::size_t g = 0; g < master.size(); ++g) {
      std::vector<std::span<float>> st(states[g].begin(), states[g].end());
      optim::GradView grad = in.grads[g];
      grad.scale = in.grad_scale;
      const optim::HalfCopy copy = copy_dtype == DType::kF32 ? optim::HalfCopy{} : optim::HalfCopy{copies[g].data(), copy_dtype};
      ASSERT_TRUE(opt.step(in.ctx, master[g], st, grad, copy).is_ok());
    }
  }
};

// A sink over per-sub-group host copies (padded layout) of dtype.
template <typename T>
HostParamSink host_sink(std::vector<std::vector<T>>& copies, DType dtype = DType::kBF16) {
  std::vector<void*> at;
  for (auto& v : copies) at.push_back(v.data());
  return HostParamSink(std::move(at), dtype);
}

// Gradients for one step: (sub-group,) buffers of dtype in the padded layout, zero in the padding.
inline std::vector<std::vector<std::byte>> make_grads(const PartitionLayout& l, DType dtype, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.01f);
  std::vector<std::vector<std::byte>> out;
  for (const SubGroup& g : l.subgroups) out.emplace_back(g.numel * dtype_size(dtype));
  for (std::size_t p = 0; p < l.params.size(); ++p) {
    std::byte* base = out[l.subgroup_of[p]].data() + l.offset_in_subgroup[p] * dtype_size(dtype);
    for (std::uint64_t i = 0; i < l.params[p].numel; ++i) {
      const float v = normal(rng);
      if (dtype == DType::kF32) {
        std::memcpy(base + i * 4, &v, 4);
      } else {
        const std::uint16_t h = dtype == DType::kBF16 ? optim::f32_to_bf16_bits(v) : optim::f32_to_f16_bits(v);
        std::memcpy(base + i * 2, &h, 2);
      }
    }
  }
  return out;
}

inline std::vector<optim::GradView> views(const std::vector<std::vector<std::byte>>& grads, DType dtype) {
  std::vector<optim::GradView> v;
  for (const auto& g : grads) v.push_back(optim::GradView{g.data(), dtype, g.size() / dtype_size(dtype), 1.0});
  return v;
}

inline optim::OptimizerConfig adamw() {
  optim::AdamParams p;
  p.lr = 1e-2;
  p.weight_decay = 0.01;
  return optim::OptimizerConfig{p};
}

// Compares every committed state tensor with the reference, bit for bit.
inline void expect_state_equal(OptimizerSwapper& sw, const InMemory& ref) {
  for (std::size_t g = 0; g < ref.master.size(); ++g) {
    std::vector<float> got(ref.master[g].size());
    for (std::size_t which = 0; which <= ref.opt.state_count(); ++which) {
      ASSERT_TRUE(sw.read_state(g, which, got).is_ok());
      const std::vector<float>& want = which == 0 ? ref.master[g] : ref.states[g][which - 1];
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << "sub-group " << g << " tensor " << which;
    }
  }
}

inline OptimizerSwapConfig base_config(const TempDir& dir) {
  OptimizerSwapConfig c;
  c.store.nvme_paths = {dir.sub("nvme0"), dir.sub("nvme1")};
  c.buffer_count = 4;
  c.buffer_size = 8192;  // 128 KiB: tiles of 2048 elements with three stages, smaller than sub-groups
  c.sub_group_size = 8000;
  c.pin_memory = false;
  c.store.stripe_unit = 8192;
  return c;
}

// One step's worth of write chunks of the optimizer store: tiles x tensors (each tile's tensor
// is one chunk of at most 64 KiB here).
inline std::uint64_t writes_per_step(const OptimizerSwapper& sw) {
  std::uint64_t tiles = 0;
  for (const SubGroup& g : sw.layout().subgroups) tiles += (g.numel + sw.tile_elements() - 1) / sw.tile_elements();
  return tiles * (1 + sw.optimizer().state_count());
}

}  // namespace zinf::swap::testing
