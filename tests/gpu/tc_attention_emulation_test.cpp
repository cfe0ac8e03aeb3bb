// The tensor-core attention's kernels (src/gpu/tc_attention_kernels.cuh, the source nvcc compiles)
// run on the host emulation of tests/gpu/cuda_emulation.h (a thread per CUDA thread, a WMMA
// stand-in with a scrambled fragment layout and WMMA's alignment checks, shared memory full of
// NaNs), launched as tc_attention.cu launches them, against the CPU references with the GPU tests'
// tolerances (tc_attention_test.cpp). Runs everywhere; what it cannot see is the hardware's
// own behaviour (the real fragment layouts, memory ordering, timing).
#include "cuda_emulation.h"  // first: the CUDA keywords and WMMA the kernels' source uses
#include "gpu/tc_attention_kernels.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "attention_tolerances.h"
#include "kernel_test_util.h"
#include "model/kernels.h"
#include "model/llama_kernels.h"

namespace zinf::gpu {
namespace {

using testing::expect_close_grad;
using testing::expect_close_out;
using testing::near_all;
using testing::randn;
using testing::rounded;

std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> out(x.size());
  for (std::size_t i = 0; i < x.size(); i++) out[i] = __float2bfloat16_rn(x[i]);
  return out;
}
std::vector<float> to_f32(const std::vector<bf16>& x) {
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); i++) out[i] = __bfloat162float(x[i]);
  return out;
}

float scale_of(int hs) { return 1.0f / std::sqrt(static_cast<float>(hs)); }

// As tc_attention.cu's forward_hs.
template <int HS>
void forward(bf16* out, float* lse, const TcAttentionTensors& a) {
  const unsigned t = static_cast<unsigned>(tc::tiles(a.T));
  cuda_emulation::launch(t, static_cast<unsigned>(a.B * a.NH), tc::kThreads,
                         tc::smem_layout(tc::Kernel::kForward, HS).bytes,
                         [&] { tc_forward_kernel<HS>(out, lse, a, scale_of(HS)); });
}

// As tc_attention_backward and backward_hs: row sums, dK/dV, dQ.
template <int HS>
void backward(const TcAttentionGrads& g, const bf16* dout, const bf16* out, const float* lse,
              const TcAttentionTensors& a) {
  const long long rows = static_cast<long long>(a.B) * a.NH * a.T;
  std::vector<float> dsum(static_cast<std::size_t>(rows));
  cuda_emulation::launch(static_cast<unsigned>((rows + tc::kWarps - 1) / tc::kWarps), 1, tc::kThreads, 0,
                         [&] { tc_row_dot_kernel(dsum.data(), dout, out, a, rows); });
  const unsigned t = static_cast<unsigned>(tc::tiles(a.T));
  cuda_emulation::launch(t, static_cast<unsigned>(a.B * a.NKV), tc::kThreads, tc::smem_layout(tc::Kernel::kDkv, HS).bytes,
                         [&] { tc_dkv_kernel<HS>(g, dout, lse, dsum.data(), a, scale_of(HS)); });
  cuda_emulation::launch(t, static_cast<unsigned>(a.B * a.NH), tc::kThreads, tc::smem_layout(tc::Kernel::kDq, HS).bytes,
                         [&] { tc_dq_kernel<HS>(g.dq, dout, lse, dsum.data(), a, scale_of(HS)); });
}

template <int HS>
void check_gqa(int B, int T, int NH, int NKV) {
  namespace cpu = model::kernels;
  SCOPED_TRACE("B " + std::to_string(B) + " T " + std::to_string(T) + " NH " + std::to_string(NH) + " NKV " +
               std::to_string(NKV) + " hs " + std::to_string(HS));
  const GqaShape s{B, T, NH, NKV, HS};
  const std::size_t nq = static_cast<std::size_t>(B) * T * NH * HS, nkv = static_cast<std::size_t>(B) * T * NKV * HS;
  const std::size_t nlse = static_cast<std::size_t>(B) * NH * T;
  const std::vector<float> q = rounded(randn(1, nq)), k = rounded(randn(2, nkv)), v = rounded(randn(3, nkv));
  const std::vector<float> dout = rounded(randn(4, nq));
  const cpu::GqaShape cs{B, T, NH, NKV, HS};
  std::vector<float> want(nq), cpu_out(nq), want_lse(nlse), want_dq(nq), want_dk(nkv), want_dv(nkv);
  cpu::gqa_attention_forward_reference(want.data(), q.data(), k.data(), v.data(), cs);
  std::vector<float> cpu_scratch(cpu::gqa_attention_scratch_floats());
  cpu::gqa_attention_forward(cpu_out.data(), want_lse.data(), q.data(), k.data(), v.data(), cpu_scratch.data(), cs);
  cpu::gqa_attention_backward_reference(want_dq.data(), want_dk.data(), want_dv.data(), dout.data(), q.data(), k.data(),
                                        v.data(), cs);
  const std::vector<bf16> qb = to_bf16(q), kb = to_bf16(k), vb = to_bf16(v), dob = to_bf16(dout);
  const TcAttentionTensors a = tc_separate_qkv(qb.data(), kb.data(), vb.data(), s);
  std::vector<bf16> out(nq), dq(nq), dk(nkv), dv(nkv);
  std::vector<float> lse(nlse);
  forward<HS>(out.data(), lse.data(), a);
  expect_close_out(to_f32(out), want);
  EXPECT_TRUE(near_all(lse, want_lse, 1e-5, 1e-6));
  backward<HS>(TcAttentionGrads{dq.data(), dk.data(), dv.data()}, dob.data(), out.data(), lse.data(), a);
  const double floor =
      1e-2 * std::max({testing::max_abs(want_dq), testing::max_abs(want_dk), testing::max_abs(want_dv)});
  {
    SCOPED_TRACE("dq");
    expect_close_grad(to_f32(dq), want_dq, floor);
  }
  {
    SCOPED_TRACE("dk");
    expect_close_grad(to_f32(dk), want_dk, floor);
  }
  {
    SCOPED_TRACE("dv");
    expect_close_grad(to_f32(dv), want_dv, floor);
  }
}

template <int HS>
void check_gpt(int B, int T, int NH) {
  const int C = NH * HS;
  SCOPED_TRACE("B " + std::to_string(B) + " T " + std::to_string(T) + " C " + std::to_string(C) + " NH " +
               std::to_string(NH));
  const std::size_t n_qkv = static_cast<std::size_t>(B) * T * 3 * C, n_out = static_cast<std::size_t>(B) * T * C;
  const std::vector<float> qkv = rounded(randn(1, n_qkv)), dout = rounded(randn(2, n_out));
  std::vector<float> want(n_out), want_lse(static_cast<std::size_t>(B) * NH * T), want_grad(n_qkv);
  model::kernels::attention_forward_reference(want.data(), qkv.data(), B, T, C, NH);
  std::vector<float> cpu_out(n_out), cpu_scratch(model::kernels::attention_scratch_floats());
  model::kernels::attention_forward(cpu_out.data(), want_lse.data(), qkv.data(), cpu_scratch.data(), B, T, C, NH);
  model::kernels::attention_backward_reference(want_grad.data(), dout.data(), qkv.data(), B, T, C, NH);
  const std::vector<bf16> qkvb = to_bf16(qkv), dob = to_bf16(dout);
  const TcAttentionTensors a = tc_packed_qkv(qkvb.data(), B, T, C, NH);
  std::vector<bf16> out(n_out), dqkv(n_qkv, __float2bfloat16_rn(NAN));
  std::vector<float> lse(want_lse.size());
  forward<HS>(out.data(), lse.data(), a);
  expect_close_out(to_f32(out), want);
  EXPECT_TRUE(near_all(lse, want_lse, 1e-5, 1e-6));
  const std::size_t c = static_cast<std::size_t>(C);
  backward<HS>(TcAttentionGrads{dqkv.data(), dqkv.data() + c, dqkv.data() + 2 * c}, dob.data(), out.data(), lse.data(),
               a);
  // Every element of dqkv is written (NaN otherwise).
  expect_close_grad(to_f32(dqkv), want_grad, 1e-2 * testing::max_abs(want_grad));
}

// T off the fragment and tile sizes, one to three tiles; hs 64, 128 and two others.
TEST(TcAttentionEmulated, GptMatchesCpuReference) {
  check_gpt<64>(2, 1, 2);
  check_gpt<64>(1, 130, 2);
  check_gpt<128>(1, 70, 2);
}

TEST(TcAttentionEmulated, GqaMatchesCpuReference) {
  check_gqa<64>(2, 17, 4, 2);
  check_gqa<64>(1, 100, 4, 2);
  check_gqa<128>(1, 1, 4, 2);
  check_gqa<128>(1, 70, 4, 2);
  check_gqa<16>(1, 33, 2, 1);
  check_gqa<80>(1, 40, 3, 3);
}

}  // namespace
}  // namespace zinf::gpu
