// Matrix products of a GPT layer: fp32 OpenBLAS sgemm against oneDNN bf16 (fp32 accumulation),
// interleaved in one run.
//
// Shapes: GPT `small` (n_embd 384) at micro-batch 8 x seq 256, so N = 2048 rows: the four linear
// layers (qkv C->3C, attention proj C->C, fc C->4C, mlp proj 4C->C), each as forward (one product)
// and backward (dinp and dweight products, plus dbias). For each, R rounds run the fp32 and
// the bf16 Matmul in alternating order, each timed over several repetitions after a warm-up;
// medians give GFLOP/s (2*N*C*OC per product) and the speedup bf16 over fp32 measured here.
// The second line is what a 16-bit run's `auto` takes on this CPU (auto_matmul_choice); the last
// line sums the medians over the layer:
//   matmul_auto kind=fp32|bf16 row="..." known=yes|no
//   matmul_layer fp32_ms=X bf16_ms=Y speedup=X/Y isa=...
// On a CPU where oneDNN has no fast bf16 kernel (no bf16 units: AVX2 CPUs such as Zen 3) only the
// fp32 products are timed: a line `matmul_bf16 unavailable: <why>` follows the second, and every
// bf16 figure reads n/a, so the fp32 rates and the choice are still measured there.
//
// It first takes the zinf command's start-up step (tools/zinf/runtime_env.h: OMP_WAIT_POLICY,
// OPENBLAS_CORETYPE, OPENBLAS_THREAD_TIMEOUT where unset, then runs itself again), so the ratio is
// the one `zinf train` sees; set the variables to measure the libraries' defaults instead.
//
// Flags: --rows=N (2048), --embd=C (384), --rounds=R (7). Not Google Benchmark: one interleaved
// comparison with its own summary line (like swap_bench).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "runtime_env.h"
#include "zinf/model/matmul.h"

namespace {

using zinf::model::Matmul;
using zinf::model::MatmulKind;

struct Layer {
  const char* name;
  int C, OC;
};

std::vector<float> filled(size_t n, float scale) {
  std::vector<float> v(n);  // written here, so every page is faulted in before timing
  for (size_t i = 0; i < n; i++) v[i] = scale * static_cast<float>(static_cast<int>((i * 2654435761u) % 2001) - 1000) / 1000.0f;
  return v;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per call of fn, over enough repetitions to take ~50 ms, after one warm-up call.
template <typename Fn>
double seconds_per_call(Fn&& fn) {
  fn();
  using clock = std::chrono::steady_clock;
  int reps = 0;
  const auto start = clock::now();
  double elapsed = 0;
  do {
    fn();
    reps++;
    elapsed = std::chrono::duration<double>(clock::now() - start).count();
  } while (elapsed < 0.05);
  return elapsed / reps;
}

int flag(int argc, char** argv, std::string_view name, int fallback) {
  for (int i = 1; i < argc; i++) {
    std::string_view a = argv[i];
    if (a.substr(0, name.size()) == name && a.size() > name.size() && a[name.size()] == '=') {
      return std::atoi(argv[i] + name.size() + 1);
    }
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  zinf::cli::tune_runtime_environment(argv);
  const int N = flag(argc, argv, "--rows", 2048);
  const int C = flag(argc, argv, "--embd", 384);
  const int rounds = flag(argc, argv, "--rounds", 7);
  const zinf::model::MatmulSupport support = zinf::model::matmul_support();
  Matmul fp32, bf16;
  std::string bf16_missing;  // why bf16 products can't run here; empty when they can
  if (zinf::Status st = bf16.use(MatmulKind::kBf16); !st.is_ok()) bf16_missing = st.to_string();
  const bool have_bf16 = bf16_missing.empty();
  const zinf::model::MatmulChoice choice = zinf::model::auto_matmul_choice(support);
  std::printf("matmul_bench: N=%d C=%d, oneDNN ISA %s (bf16 units: %s), CPU %s family %d model %d\n", N, C,
              support.isa.c_str(), support.bf16_units ? "yes" : "no", support.cpu.vendor.c_str(), support.cpu.family,
              support.cpu.model);
  std::printf("matmul_auto kind=%s row=\"%s\" known=%s\n", std::string(zinf::model::matmul_kind_name(choice.kind)).c_str(),
              choice.row.c_str(), choice.known ? "yes" : "no");
  if (!have_bf16) std::printf("matmul_bf16 unavailable: %s\n", bf16_missing.c_str());
  const Layer layers[] = {{"qkv", C, 3 * C}, {"attn_proj", C, C}, {"fc", C, 4 * C}, {"mlp_proj", 4 * C, C}};
  double total32 = 0, total16 = 0;
  std::printf("%-10s %-8s %10s %10s %10s %10s %8s\n", "layer", "pass", "fp32_ms", "bf16_ms", "fp32_GF/s",
              "bf16_GF/s", "speedup");
  for (const Layer& l : layers) {
    const std::vector<float> inp = filled(static_cast<size_t>(N) * l.C, 1.0f);
    const std::vector<float> weight = filled(static_cast<size_t>(l.OC) * l.C, 0.05f);
    const std::vector<float> bias = filled(l.OC, 0.1f), dout = filled(static_cast<size_t>(N) * l.OC, 0.01f);
    std::vector<float> out(static_cast<size_t>(N) * l.OC), dinp(static_cast<size_t>(N) * l.C);
    std::vector<float> dweight(static_cast<size_t>(l.OC) * l.C), dbias(l.OC);
    for (int pass = 0; pass < 2; pass++) {
      auto run = [&](Matmul& m) {
        if (pass == 0) {
          m.forward(out.data(), inp.data(), weight.data(), bias.data(), N, l.C, l.OC);
        } else {
          m.backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), N, l.C, l.OC);
        }
      };
      std::vector<double> t32, t16;
      for (int r = 0; r < rounds; r++) {
        if (!have_bf16) {
          t32.push_back(seconds_per_call([&] { run(fp32); }));
        } else if (r % 2 == 0) {
          t32.push_back(seconds_per_call([&] { run(fp32); }));
          t16.push_back(seconds_per_call([&] { run(bf16); }));
        } else {
          t16.push_back(seconds_per_call([&] { run(bf16); }));
          t32.push_back(seconds_per_call([&] { run(fp32); }));
        }
      }
      const double a = median(t32);
      const double flops = 2.0 * N * l.C * l.OC * (pass == 0 ? 1 : 2);
      const char* pass_name = pass == 0 ? "forward" : "backward";
      if (have_bf16) {
        const double b = median(t16);
        std::printf("%-10s %-8s %10.3f %10.3f %10.1f %10.1f %8.2f\n", l.name, pass_name, a * 1e3, b * 1e3,
                    flops / a * 1e-9, flops / b * 1e-9, a / b);
        total16 += b;
      } else {
        std::printf("%-10s %-8s %10.3f %10s %10.1f %10s %8s\n", l.name, pass_name, a * 1e3, "n/a", flops / a * 1e-9,
                    "n/a", "n/a");
      }
      total32 += a;
    }
  }
  if (have_bf16) {
    std::printf("matmul_layer fp32_ms=%.3f bf16_ms=%.3f speedup=%.2f isa=%s\n", total32 * 1e3, total16 * 1e3,
                total32 / total16, support.isa.c_str());
  } else {
    std::printf("matmul_layer fp32_ms=%.3f bf16_ms=n/a speedup=n/a isa=%s\n", total32 * 1e3, support.isa.c_str());
  }
  return 0;
}
