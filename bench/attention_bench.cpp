// Causal attention forward+backward: the blocked kernels (block products on block_gemm, on
// OpenBLAS sgemm as before, and with bf16 operands on block_gemm_bf16) against the full (T,T)
// path they replaced, on GPT `small`'s heads (6 x 64), with the ratios measured interleaved in
// one run.
//
//   build/bench/attention_bench [--attn_rounds=7 (0: none)] [--attn_batch=1] [google benchmark flags]
//
// Google Benchmark times each path on its own; then, per T, rounds rotate which path goes
// first (A B C, B C A, ...), each sample the best of 3 calls, and the medians and their ratio are
// printed. Flop rates count the causal half only (7 T^2 hs per head for forward + backward), so
// the full path's rate is what it achieves on the work that matters.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench_timing.h"
#include "model/attention_core.h"
#include "model/kernels.h"
#include "zinf/thread_pool.h"
#include "zinf/topology.h"

namespace {

namespace k = zinf::model::kernels;

constexpr int kHeads = 6, kHeadSize = 64, kC = kHeads * kHeadSize;  // GPT small
constexpr int kTs[] = {256, 1024, 2048};

// Inputs, outputs and both paths' scratch for one (B, T), filled before any timing (first-touch
// page faults would otherwise land in the first timed call; see docs measuring.md).
struct Problem {
  int B, T;
  std::vector<float> qkv, dout, out, lse, dqkv, scratch, full_scratch;

  Problem(int b, int t)
      : B(b), T(t), qkv(static_cast<size_t>(b) * t * 3 * kC), dout(static_cast<size_t>(b) * t * kC),
        out(dout.size()), lse(static_cast<size_t>(b) * kHeads * t), dqkv(qkv.size()),
        scratch(k::attention_scratch_floats()), full_scratch(k::attention_full_scratch_floats(t)) {
    for (size_t i = 0; i < qkv.size(); i++) qkv[i] = std::sin(0.37f * static_cast<float>(i % 10007));
    for (size_t i = 0; i < dout.size(); i++) dout[i] = std::cos(0.11f * static_cast<float>(i % 10009));
    std::fill(full_scratch.begin(), full_scratch.end(), 0.0f);
    std::fill(scratch.begin(), scratch.end(), 0.0f);
  }

  // The blocked path with its block products on OpenBLAS (blas), block_gemm, or block_gemm_bf16
  // (products kBf16; on a CPU without AVX512-BF16 that is the slow scalar reference).
  void blocked(bool blas = false, k::AttentionProducts products = k::AttentionProducts::kFp32) {
    k::detail::set_attention_blas(blas);
    k::attention_forward(out.data(), lse.data(), qkv.data(), scratch.data(), B, T, kC, kHeads, nullptr, products);
    k::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), scratch.data(), B, T, kC,
                          kHeads, nullptr, products);
    benchmark::ClobberMemory();
  }

  void full() {
    k::attention_forward_full(out.data(), lse.data(), qkv.data(), full_scratch.data(), B, T, kC, kHeads);
    k::attention_backward_full(dqkv.data(), dout.data(), qkv.data(), lse.data(), full_scratch.data(), B, T, kC,
                               kHeads);
    benchmark::ClobberMemory();
  }

  double causal_flops() const { return 7.0 * T * T * kHeadSize * B * kHeads; }
};

enum class Path { kFull, kBlockedBlas, kBlocked, kBlockedBf16 };

void run_path(Problem& p, Path path) {
  if (path == Path::kFull) {
    p.full();
  } else {
    p.blocked(path == Path::kBlockedBlas,
              path == Path::kBlockedBf16 ? k::AttentionProducts::kBf16 : k::AttentionProducts::kFp32);
  }
}

void BM_Attention(benchmark::State& state, int batch, Path path) {
  Problem p(batch, static_cast<int>(state.range(0)));
  for (auto _ : state) run_path(p, path);
  state.counters["causal_GFLOP/s"] =
      benchmark::Counter(p.causal_flops() * static_cast<double>(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

using zinf::bench::best_of_3;
using zinf::bench::median;

// Takes --attn_* flags out of argv.
void parse_own_flags(int* argc, char** argv, int* rounds, int* batch) {
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string_view a = argv[i];
    if (a.starts_with("--attn_rounds=")) {
      *rounds = std::atoi(argv[i] + 14);
    } else if (a.starts_with("--attn_batch=")) {
      *batch = std::atoi(argv[i] + 13);
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7, batch = 1;
  parse_own_flags(&argc, argv, &rounds, &batch);
  if (rounds < 0 || batch < 1) {
    std::fprintf(stderr, "attention_bench: --attn_rounds must be >= 0 (0: no interleaved run), --attn_batch >= 1\n");
    return 2;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;

  const char* isa = __builtin_cpu_supports("avx512f") ? "avx512f" : __builtin_cpu_supports("avx2") ? "avx2" : "sse2";
  std::printf("attention_bench: B=%d, %d heads x %d, block %d; %s; CPU %s, OpenBLAS core %s; %zu threads in the pool\n",
              batch, kHeads, kHeadSize, zinf::model::kernels::detail::attention_block(kHeadSize), zinf::topology().summary().c_str(),
              isa, openblas_get_corename(), zinf::default_thread_pool().threads());
  const std::pair<const char*, Path> paths[] = {{"attention_fwd_bwd/full", Path::kFull},
                                                {"attention_fwd_bwd/blocked_openblas", Path::kBlockedBlas},
                                                {"attention_fwd_bwd/blocked", Path::kBlocked},
                                                {"attention_fwd_bwd/blocked_bf16", Path::kBlockedBf16}};
  for (const auto& [name, path] : paths) {
    auto* b = benchmark::RegisterBenchmark(name, BM_Attention, batch, path);
    for (int T : kTs) b->Arg(T);
    b->UseRealTime()->Unit(benchmark::kMillisecond);
  }
  benchmark::RunSpecifiedBenchmarks();

  for (int T : rounds > 0 ? std::vector<int>(std::begin(kTs), std::end(kTs)) : std::vector<int>{}) {
    Problem p(batch, T);
    constexpr Path kOrder[4] = {Path::kFull, Path::kBlockedBlas, Path::kBlocked, Path::kBlockedBf16};
    for (Path path : kOrder) run_path(p, path);  // warm-up, every path
    std::vector<double> times[4];  // in kOrder's order
    for (int r = 0; r < rounds; r++) {
      for (int i = 0; i < 4; i++) {
        const int which = (r + i) % 4;
        times[which].push_back(best_of_3([&] { run_path(p, kOrder[which]); }));
      }
    }
    const double f = median(times[0]), o = median(times[1]), b = median(times[2]), h = median(times[3]);
    const auto rate = [&](double s) { return p.causal_flops() / s / 1e9; };
    std::printf("T=%d interleaved medians, %d rounds: full %.2f ms (%.1f causal GFLOP/s) | blocked on OpenBLAS %.2f ms "
                "(%.1f) | blocked on block_gemm %.2f ms (%.1f) | bf16 products %.2f ms (%.1f) | block_gemm vs "
                "OpenBLAS %.2fx, vs full %.2fx; bf16 vs block_gemm %.2fx\n",
                T, rounds, f * 1e3, rate(f), o * 1e3, rate(o), b * 1e3, rate(b), h * 1e3, rate(h), o / b, f / b,
                b / h);
  }
  k::detail::set_attention_blas(false);
  benchmark::Shutdown();
  return 0;
}
