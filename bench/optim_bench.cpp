// Adam step throughput against a STREAM triad and the scalar reference, in one binary.
//
// Counting: an Adam step moves 28 bytes per parameter (fp32 param, exp_avg, exp_avg_sq read
// and written, fp32 grad read), 30 with the bf16 copy written; the triad a = b + s*c is
// counted as 12 bytes per element (the STREAM convention, although it really moves 16).
// Google Benchmark prints the table (1 thread and all threads); then the same kernels run
// interleaved (triad, Adam, scalar Adam, order alternating) for several rounds, and the
// medians give the last line:
//   adam_gbps=X triad_gbps=Y ratio=X/Y scalar_speedup=S
// (all threads, fp32 Adam with a bf16 copy on active_isa(): the best ISA unless
// ZINF_OPTIM_ISA says otherwise; S = its GB/s over the scalar path's on the same threads).
//
// Flags besides Google Benchmark's: --optim_params=N (default 33554432), --optim_rounds=R (7).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/optim/optimizer.h"
#include "zinf/thread_pool.h"
#include "zinf/topology.h"

namespace {

using zinf::ThreadPool;
using namespace zinf::optim;

constexpr double kAdamBytes = 28.0, kAdamCopyBytes = 30.0, kTriadBytes = 12.0;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

template <typename T>
std::unique_ptr<T[], FreeDeleter> alloc_array(std::size_t n) {
  const std::size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
  return std::unique_ptr<T[], FreeDeleter>(static_cast<T*>(std::aligned_alloc(64, bytes)));
}

// Every array the benchmark touches, allocated once and written (pre-faulted) before timing.
struct Arrays {
  std::size_t n = 0;
  std::unique_ptr<float[], FreeDeleter> p, m, v, g, a, b, c;
  std::unique_ptr<std::uint16_t[], FreeDeleter> copy;
  std::int64_t step = 0;
};

Arrays* g_arrays = nullptr;
ThreadPool* g_one = nullptr;
ThreadPool* g_all = nullptr;

// The triad over the pool, cut into the same kind of pieces as the optimizer's.
void triad(Arrays& x, ThreadPool& pool) {
  const std::size_t pieces = pool.threads();
  const std::size_t piece = (x.n + pieces - 1) / pieces / 16 * 16 + 16;
  float* a = x.a.get();
  const float* b = x.b.get();
  const float* c = x.c.get();
  pool.run(pieces, [&](std::size_t t) {
    const std::size_t begin = std::min(x.n, t * piece), end = std::min(x.n, begin + piece);
    const float s = 0.5f;
    for (std::size_t i = begin; i < end; ++i) a[i] = b[i] + s * c[i];
  });
  benchmark::ClobberMemory();
}

void adam(Arrays& x, ThreadPool& pool, KernelIsa isa, bool with_copy) {
  const AdamParams hp{.lr = 1e-6, .weight_decay = 0.01};
  const std::span<float> p(x.p.get(), x.n), m(x.m.get(), x.n), v(x.v.get(), x.n);
  const HalfCopy copy{with_copy ? x.copy.get() : nullptr, DType::kBF16};
  const zinf::Status st = adam_step(hp, ++x.step, p, m, v, GradView{x.g.get(), DType::kF32, x.n}, copy,
                                    ExecOptions{.pool = &pool, .isa = isa});
  if (!st.is_ok()) {
    std::fprintf(stderr, "adam_step: %s\n", st.to_string().c_str());
    std::exit(1);
  }
}

void prefault(Arrays& x, ThreadPool& pool) {
  const std::size_t pieces = pool.threads(), piece = (x.n + pieces - 1) / pieces;
  pool.run(pieces, [&](std::size_t t) {
    for (std::size_t i = t * piece; i < std::min(x.n, (t + 1) * piece); ++i) {
      x.p[i] = 1.0f + 1e-7f * static_cast<float>(i % 1000);
      x.m[i] = 0.0f;
      x.v[i] = 0.0f;
      x.g[i] = (i % 7 == 0 ? -1e-3f : 2e-3f);
      x.a[i] = 0.0f;
      x.b[i] = 1.0f;
      x.c[i] = 2.0f;
      x.copy[i] = 0;
    }
  });
}

void BM_Triad(benchmark::State& state, ThreadPool* pool) {
  for (auto _ : state) triad(*g_arrays, *pool);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * g_arrays->n * kTriadBytes));
  state.counters["params/s"] = benchmark::Counter(static_cast<double>(state.iterations() * g_arrays->n),
                                                  benchmark::Counter::kIsRate);
}

void BM_Adam(benchmark::State& state, ThreadPool* pool, KernelIsa isa, bool with_copy) {
  for (auto _ : state) adam(*g_arrays, *pool, isa, with_copy);
  const double per = with_copy ? kAdamCopyBytes : kAdamBytes;
  state.SetBytesProcessed(static_cast<std::int64_t>(static_cast<double>(state.iterations() * g_arrays->n) * per));
  state.counters["params/s"] = benchmark::Counter(static_cast<double>(state.iterations() * g_arrays->n),
                                                  benchmark::Counter::kIsRate);
}

void register_benchmarks() {
  for (ThreadPool* pool : {g_one, g_all}) {
    const std::string t = "/threads:" + std::to_string(pool->threads());
    benchmark::RegisterBenchmark(("triad" + t).c_str(), BM_Triad, pool)->UseRealTime()->Unit(benchmark::kMillisecond);
    for (KernelIsa isa : {KernelIsa::kScalar, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
      if (!isa_supported(isa)) continue;
      for (bool copy : {false, true}) {
        const std::string name = std::string("adam/") + std::string(isa_name(isa)) + (copy ? "/bf16_copy" : "/fp32") + t;
        benchmark::RegisterBenchmark(name.c_str(), BM_Adam, pool, isa, copy)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
}

template <typename Fn>
double seconds_for(Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct Medians {
  double triad = 0, adam = 0, scalar = 0;  // GB/s
};

// Rounds of triad, Adam (best ISA, bf16 copy) and scalar Adam on `pool`, the order rotating
// every round; each sample is the best of 3 calls. Returns the medians.
Medians interleaved(Arrays& x, ThreadPool& pool, int rounds) {
  std::vector<double> tri, ad, sc;
  const double n = static_cast<double>(x.n);
  auto sample = [&](auto&& fn) {
    double best = 1e30;
    for (int r = 0; r < 3; ++r) best = std::min(best, seconds_for(fn));
    return best;
  };
  for (int round = 0; round < rounds; ++round) {
    for (int k = 0; k < 3; ++k) {
      switch ((round + k) % 3) {
        case 0: tri.push_back(n * kTriadBytes / sample([&] { triad(x, pool); }) / 1e9); break;
        case 1: ad.push_back(n * kAdamCopyBytes / sample([&] { adam(x, pool, active_isa(), true); }) / 1e9); break;
        default: sc.push_back(n * kAdamCopyBytes / sample([&] { adam(x, pool, KernelIsa::kScalar, true); }) / 1e9);
      }
    }
  }
  return {median(tri), median(ad), median(sc)};
}

// Takes --optim_* flags out of argv.
void parse_own_flags(int* argc, char** argv, std::size_t* params, int* rounds) {
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string_view a = argv[i];
    if (a.starts_with("--optim_params=")) {
      *params = std::strtoull(argv[i] + 15, nullptr, 10);
    } else if (a.starts_with("--optim_rounds=")) {
      *rounds = std::atoi(argv[i] + 15);
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t params = std::size_t{32} << 20;
  int rounds = 7;
  parse_own_flags(&argc, argv, &params, &rounds);
  if (params < 1024 || rounds < 1) {
    std::fprintf(stderr, "optim_bench: --optim_params must be >= 1024 and --optim_rounds >= 1\n");
    return 2;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;

  ThreadPool one(1), all(static_cast<std::size_t>(std::max(1, zinf::topology().cores)));
  g_one = &one;
  g_all = &all;
  Arrays x;
  x.n = params;
  x.p = alloc_array<float>(params), x.m = alloc_array<float>(params), x.v = alloc_array<float>(params);
  x.g = alloc_array<float>(params), x.a = alloc_array<float>(params), x.b = alloc_array<float>(params);
  x.c = alloc_array<float>(params), x.copy = alloc_array<std::uint16_t>(params);
  prefault(x, all);
  g_arrays = &x;

  std::printf("optim_bench: %zu parameters (%.0f MiB of Adam state), %s; ISA %s (best %s)\n", params,
              static_cast<double>(params) * kAdamCopyBytes / 1048576.0, zinf::topology().summary().c_str(),
              std::string(isa_name(active_isa())).c_str(), std::string(isa_name(best_isa())).c_str());
  register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();

  for (ThreadPool* pool : {g_one, g_all}) {
    const Medians md = interleaved(x, *pool, rounds);
    std::printf("interleaved medians, %zu thread%s, %d rounds: triad %.2f GB/s | adam %s+bf16 %.2f GB/s (%.1f Mparams/s, "
                "%.2fx triad) | scalar adam+bf16 %.2f GB/s (%.1f Mparams/s)\n",
                pool->threads(), pool->threads() == 1 ? "" : "s", rounds, md.triad,
                std::string(isa_name(active_isa())).c_str(), md.adam, md.adam * 1e3 / kAdamCopyBytes, md.adam / md.triad,
                md.scalar, md.scalar * 1e3 / kAdamCopyBytes);
    if (pool == g_all) {
      std::printf("adam_gbps=%.2f triad_gbps=%.2f ratio=%.2f scalar_speedup=%.2f\n", md.adam, md.triad,
                  md.adam / md.triad, md.adam / md.scalar);
    }
  }
  benchmark::Shutdown();
  return 0;
}
