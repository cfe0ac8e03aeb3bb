// Prints one hash of every fused kernel's output on fixed inputs. tests/model/meson.build builds it
// three times, with fused_kernels.cpp compiled for baseline x86-64, AVX2 and AVX-512 (no
// target_clones), and fused_isa_test.sh checks that the three print the same: the claim that the
// kernels give the same bits whichever clone the loader picks (docs/model.md, "Fused passes").
#include <bit>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "model/fused_kernels.h"

namespace {

namespace k = zinf::model::kernels;

uint64_t hash = 1469598103934665603ull;  // FNV-1a over the bits

void mix(const std::vector<float>& v) {
  for (float x : v) {
    hash ^= std::bit_cast<uint32_t>(x);
    hash *= 1099511628211ull;
  }
}

void mix(const std::vector<uint16_t>& v) {
  for (uint16_t x : v) {
    hash ^= x;
    hash *= 1099511628211ull;
  }
}

std::vector<float> filled(size_t n, float scale, unsigned seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) {
    v[i] = scale * static_cast<float>(static_cast<int>(((i + seed) * 2654435761u) % 2001) - 1000) / 1000.0f;
  }
  return v;
}

}  // namespace

int main() {
  const int N = 333, C = 203, OC = 811, V = 50257, NV = 7;  // odd sizes: every loop's tail runs
  std::vector<float> pre = filled(static_cast<size_t>(N) * OC, 6, 1), out(pre.size()), b = filled(OC, 1, 2);
  std::vector<uint16_t> out_bf16(out.size());
  k::bias_gelu_forward(pre.data(), out.data(), b.data(), N, OC, out_bf16.data());
  mix(pre);
  mix(out);
  mix(out_bf16);
  std::vector<float> d = filled(static_cast<size_t>(N) * OC, 1, 3), db = filled(OC, 1, 4);
  k::gelu_backward_bias_grad(d.data(), db.data(), pre.data(), N, OC, out_bf16.data());
  mix(d);
  mix(db);
  mix(out_bf16);
  std::vector<float> x = filled(static_cast<size_t>(N) * C, 3, 5), r = filled(x.size(), 1, 6), w = filled(C, 1, 7),
                     bias = filled(C, 1, 8), o(x.size()), mean(N), rstd(N);
  std::vector<uint16_t> o_bf16(o.size());
  k::residual_layernorm_forward(o.data(), mean.data(), rstd.data(), x.data(), r.data(), w.data(), bias.data(), N, C,
                                o_bf16.data());
  mix(o);
  mix(o_bf16);
  mix(mean);
  mix(rstd);
  mix(x);
  k::residual_rmsnorm_forward(o.data(), rstd.data(), x.data(), r.data(), w.data(), 1e-6f, N, C, o_bf16.data());
  mix(o);
  mix(o_bf16);
  k::round_to_bf16(o_bf16.data(), x.data(), N, C);
  mix(o_bf16);
  mix(rstd);
  // RMSNorm's backward of a gradient in two parts (o and r stand in for them), then three.
  std::vector<float> dinp = filled(x.size(), 1, 10), dw = filled(C, 1, 11), part3 = filled(x.size(), 2, 12);
  k::summed_rmsnorm_backward(dinp.data(), dw.data(), o.data(), r.data(), nullptr, x.data(), w.data(), rstd.data(), N, C);
  mix(dinp);
  mix(dw);
  k::summed_rmsnorm_backward(dinp.data(), dw.data(), o.data(), r.data(), part3.data(), x.data(), w.data(), rstd.data(),
                             N, C);
  mix(dinp);
  mix(dw);
  std::vector<float> logits = filled(static_cast<size_t>(NV) * V, 8, 9), losses(NV);
  const std::vector<int32_t> targets = {0, 5, 77, V - 1, 1000, 3, 9};
  k::softmax_xent_loss(logits.data(), losses.data(), targets.data(), NV, V);
  mix(losses);
  k::softmax_xent_fused(logits.data(), losses.data(), targets.data(), 0.25f, NV, V);
  mix(logits);
  mix(losses);
  std::printf("%016llx\n", static_cast<unsigned long long>(hash));
  return 0;
}
