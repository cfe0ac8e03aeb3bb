// Fused passes over activations (src/model/fused_kernels.h) against the unfused kernels the models
// ran before, at GPT `small`'s shapes (micro-batch 8 x seq 256: N = 2048 rows, C = 384), with the
// ratio measured interleaved in one run.
//
//   build/bench/fused_bench [--fused_rounds=7 (0: none)] [google benchmark flags]
//
// Google Benchmark times each path on its own; then, per case, rounds alternate which path goes
// first (A B, B A, ...), each sample the best of 3 calls, and the medians and their ratio are
// printed. The cases are the sequences the models run, old against new:
//   mlp_up_fwd/K    c_fc product with its bias inside, then GELU  |  product, then bias + GELU
//                   (K: the Matmul kind, fp32 OpenBLAS, and oneDNN bf16 where the CPU has it)
//   gelu_bwd_dbias  GELU' in place, then the serial dbias loop   |  one pass, columns over threads
//   residual_ln     residual_add, then layernorm_forward          |  residual_layernorm_forward
//   residual_rms    residual_add, then rmsnorm_forward            |  residual_rmsnorm_forward
//   rms_bwd_sum/P   P-1 residual_adds of the parts of d(out),     |  summed_rmsnorm_backward: one
//                   then rmsnorm_backward (rows, then dweight's   |  pass over the rows reading the
//                   columns); Llama: P 2 after gate and up, P 3   |  parts, dweight in row chunks
//                   after q, k and v
//   xent/V          softmax_xent_forward, then _backward          |  softmax_xent_fused (V 256, 50257)
//   xent_eval/V     softmax_xent_forward (writes probabilities)   |  softmax_xent_loss (reads only)
//   bias_grad       the serial dbias loop                         |  bias_grad, columns over threads
// In-place backward inputs are restored by a memcpy before every call of both paths (the product
// that writes them in the model), so both times include that copy.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bench_timing.h"
#include "model/fused_kernels.h"
#include "model/kernels.h"
#include "model/llama_kernels.h"
#include "zinf/model/matmul.h"
#include "zinf/thread_pool.h"
#include "zinf/topology.h"

namespace {

namespace k = zinf::model::kernels;
using zinf::model::Matmul;
using zinf::model::MatmulKind;

constexpr int kN = 2048, kC = 384;

// Written here, so every page is faulted in before timing (docs: measuring.md).
std::vector<float> filled(size_t n, float scale, uint32_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) {
    v[i] = scale * static_cast<float>(static_cast<int>(((i + seed) * 2654435761u) % 2001) - 1000) / 1000.0f;
  }
  return v;
}

std::vector<int32_t> targets(int N, int V) {
  std::vector<int32_t> t(N);
  for (int n = 0; n < N; n++) t[n] = static_cast<int32_t>((n * 7919u + 13u) % V);
  return t;
}

void serial_bias_grad(float* dbias, const float* dout, int N, int OC) {  // matmul_backward's old loop
  for (int n = 0; n < N; n++) {
    for (int o = 0; o < OC; o++) dbias[o] += dout[static_cast<size_t>(n) * OC + o];
  }
}

struct Case {
  std::string name;
  std::function<void()> unfused, fused;
};

// Every case's buffers live as long as the cases; shared_ptr keeps them alive in the lambdas.
std::vector<Case> make_cases() {
  std::vector<Case> cases;
  const size_t NC = static_cast<size_t>(kN) * kC, N4C = 4 * NC;

  struct MlpUp {
    Matmul mm;
    std::vector<float> inp = filled(NC, 1.0f, 1), w = filled(4 * kC * kC, 0.05f, 2), b = filled(4 * kC, 0.1f, 3);
    std::vector<float> pre = filled(N4C, 1.0f, 4), out = filled(N4C, 1.0f, 5);
  };
  for (MatmulKind kind : {MatmulKind::kFp32, MatmulKind::kBf16}) {
    auto p = std::make_shared<MlpUp>();
    if (!p->mm.use(kind).is_ok()) continue;  // no bf16 products here: fp32 only
    cases.push_back({std::string("mlp_up_fwd/") + std::string(zinf::model::matmul_kind_name(kind)),
                     [p] {
                       p->mm.forward(p->pre.data(), p->inp.data(), p->w.data(), p->b.data(), kN, kC, 4 * kC);
                       k::gelu_forward(p->out.data(), p->pre.data(), p->pre.size());
                     },
                     [p] {
                       p->mm.forward(p->pre.data(), p->inp.data(), p->w.data(), nullptr, kN, kC, 4 * kC);
                       k::bias_gelu_forward(p->pre.data(), p->out.data(), p->b.data(), kN, 4 * kC);
                     }});
  }

  struct GeluBwd {
    std::vector<float> pre = filled(N4C, 2.0f, 6), dout = filled(N4C, 1.0f, 7), d = dout, db = filled(4 * kC, 1.0f, 8);
  };
  auto g = std::make_shared<GeluBwd>();
  cases.push_back({"gelu_bwd_dbias",
                   [g] {
                     std::memcpy(g->d.data(), g->dout.data(), g->d.size() * sizeof(float));
                     k::gelu_backward(g->d.data(), g->pre.data(), g->d.data(), g->d.size());
                     serial_bias_grad(g->db.data(), g->d.data(), kN, 4 * kC);
                   },
                   [g] {
                     std::memcpy(g->d.data(), g->dout.data(), g->d.size() * sizeof(float));
                     k::gelu_backward_bias_grad(g->d.data(), g->db.data(), g->pre.data(), kN, 4 * kC);
                   }});

  struct Norm {
    std::vector<float> x = filled(NC, 1.0f, 9), r = filled(NC, 0.01f, 10), out = filled(NC, 1.0f, 11);
    std::vector<float> w = filled(kC, 1.0f, 12), b = filled(kC, 0.1f, 13), mean = filled(kN, 1.0f, 14),
                       rstd = filled(kN, 1.0f, 15);
  };
  auto ln = std::make_shared<Norm>();
  cases.push_back({"residual_ln",
                   [ln] {
                     k::residual_add(ln->x.data(), ln->r.data(), ln->x.size());
                     k::layernorm_forward(ln->out.data(), ln->mean.data(), ln->rstd.data(), ln->x.data(),
                                          ln->w.data(), ln->b.data(), kN, kC);
                   },
                   [ln] {
                     k::residual_layernorm_forward(ln->out.data(), ln->mean.data(), ln->rstd.data(), ln->x.data(),
                                                   ln->r.data(), ln->w.data(), ln->b.data(), kN, kC);
                   }});
  auto rms = std::make_shared<Norm>();
  cases.push_back({"residual_rms",
                   [rms] {
                     k::residual_add(rms->x.data(), rms->r.data(), rms->x.size());
                     k::rmsnorm_forward(rms->out.data(), rms->rstd.data(), rms->x.data(), rms->w.data(), 1e-5f, kN,
                                        kC);
                   },
                   [rms] {
                     k::residual_rmsnorm_forward(rms->out.data(), rms->rstd.data(), rms->x.data(), rms->r.data(),
                                                 rms->w.data(), 1e-5f, kN, kC);
                   }});

  struct RmsBwd {
    std::vector<float> x = filled(NC, 1.0f, 19), w = filled(kC, 1.0f, 20), rstd = filled(kN, 0.5f, 21);
    std::vector<float> part0 = filled(NC, 1.0f, 22), d0 = part0, d1 = filled(NC, 1.0f, 23), d2 = filled(NC, 1.0f, 24);
    std::vector<float> dres = filled(NC, 1.0f, 25), dw = filled(kC, 1.0f, 26);
  };
  for (int parts : {2, 3}) {
    auto rb = std::make_shared<RmsBwd>();
    // The unfused path sums into the first part in place: both paths restore it first (the
    // product that writes it in the model).
    cases.push_back({"rms_bwd_sum/" + std::to_string(parts),
                     [rb, parts] {
                       std::memcpy(rb->d0.data(), rb->part0.data(), rb->d0.size() * sizeof(float));
                       k::residual_add(rb->d0.data(), rb->d1.data(), rb->d0.size());
                       if (parts == 3) k::residual_add(rb->d0.data(), rb->d2.data(), rb->d0.size());
                       k::rmsnorm_backward(rb->dres.data(), rb->dw.data(), rb->d0.data(), rb->x.data(), rb->w.data(),
                                           rb->rstd.data(), kN, kC);
                     },
                     [rb, parts] {
                       std::memcpy(rb->d0.data(), rb->part0.data(), rb->d0.size() * sizeof(float));
                       k::summed_rmsnorm_backward(rb->dres.data(), rb->dw.data(), rb->d0.data(), rb->d1.data(),
                                                  parts == 3 ? rb->d2.data() : nullptr, rb->x.data(), rb->w.data(),
                                                  rb->rstd.data(), kN, kC);
                     }});
  }

  struct Xent {
    int N, V;
    std::vector<float> logits, work, losses;
    std::vector<int32_t> tgt;
    Xent(int n, int v)
        : N(n), V(v), logits(filled(static_cast<size_t>(n) * v, 4.0f, 16)), work(logits), losses(n), tgt(targets(n, v)) {}
  };
  for (auto [N, V] : {std::pair{kN, 256}, std::pair{256, 50257}}) {
    auto x = std::make_shared<Xent>(N, V);
    const float dloss = 1.0f / static_cast<float>(N);
    // Training: both paths start from the logits the product wrote (the memcpy stands for it).
    cases.push_back({"xent/V" + std::to_string(V),
                     [x, dloss] {
                       std::memcpy(x->work.data(), x->logits.data(), x->work.size() * sizeof(float));
                       k::softmax_xent_forward(x->work.data(), x->losses.data(), x->tgt.data(), x->N, x->V);
                       k::softmax_xent_backward(x->work.data(), x->tgt.data(), dloss, x->N, x->V);
                     },
                     [x, dloss] {
                       std::memcpy(x->work.data(), x->logits.data(), x->work.size() * sizeof(float));
                       k::softmax_xent_fused(x->work.data(), x->losses.data(), x->tgt.data(), dloss, x->N, x->V);
                     }});
    cases.push_back({"xent_eval/V" + std::to_string(V),
                     [x] {
                       std::memcpy(x->work.data(), x->logits.data(), x->work.size() * sizeof(float));
                       k::softmax_xent_forward(x->work.data(), x->losses.data(), x->tgt.data(), x->N, x->V);
                     },
                     [x] { k::softmax_xent_loss(x->logits.data(), x->losses.data(), x->tgt.data(), x->N, x->V); }});
  }

  struct BiasGrad {
    std::vector<float> dout = filled(N4C, 1.0f, 17), db = filled(4 * kC, 1.0f, 18);
  };
  auto bg = std::make_shared<BiasGrad>();
  cases.push_back({"bias_grad", [bg] { serial_bias_grad(bg->db.data(), bg->dout.data(), kN, 4 * kC); },
                   [bg] { k::bias_grad(bg->db.data(), bg->dout.data(), kN, 4 * kC); }});
  return cases;
}

using zinf::bench::best_of_3;
using zinf::bench::median;

// Takes --fused_rounds out of argv.
void parse_own_flags(int* argc, char** argv, int* rounds) {
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    if (std::string_view(argv[i]).starts_with("--fused_rounds=")) {
      *rounds = std::atoi(argv[i] + 15);
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7;
  parse_own_flags(&argc, argv, &rounds);
  if (rounds < 0) {
    std::fprintf(stderr, "fused_bench: --fused_rounds must be >= 0 (0: no interleaved run)\n");
    return 2;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;

  const zinf::model::MatmulSupport mm = zinf::model::matmul_support();
  const char* isa = __builtin_cpu_supports("avx512f") ? "avx512f" : __builtin_cpu_supports("avx2") ? "avx2" : "sse2";
  std::printf("fused_bench: N=%d C=%d; %s; CPU %s; oneDNN %s (bf16 units: %s); %zu threads in the pool\n", kN, kC,
              zinf::topology().summary().c_str(), isa, mm.dnnl_built ? mm.isa.c_str() : "not built",
              mm.bf16_units ? "yes" : "no", zinf::default_thread_pool().threads());
  std::vector<Case> cases = make_cases();
  for (Case& c : cases) {
    for (bool fused : {false, true}) {
      std::function<void()>* fn = fused ? &c.fused : &c.unfused;
      benchmark::RegisterBenchmark((c.name + (fused ? "/fused" : "/unfused")).c_str(),
                                   [fn](benchmark::State& state) {
                                     for (auto _ : state) {
                                       (*fn)();
                                       benchmark::ClobberMemory();
                                     }
                                   })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::RunSpecifiedBenchmarks();

  if (rounds > 0) std::printf("interleaved medians, %d rounds, each sample the best of 3 calls:\n", rounds);
  for (Case& c : rounds > 0 ? cases : std::vector<Case>{}) {
    c.unfused();  // warm-up, both paths
    c.fused();
    std::vector<double> a, b;
    for (int r = 0; r < rounds; r++) {
      if (r % 2 == 0) {
        a.push_back(best_of_3(c.unfused));
        b.push_back(best_of_3(c.fused));
      } else {
        b.push_back(best_of_3(c.fused));
        a.push_back(best_of_3(c.unfused));
      }
    }
    const double u = median(a), f = median(b);
    std::printf("  %-18s unfused %8.3f ms | fused %8.3f ms | speedup %5.2fx\n", c.name.c_str(), u * 1e3, f * 1e3,
                u / f);
  }
  benchmark::Shutdown();
  return 0;
}
