// Matmul: the oneDNN bf16 products against fp32/double references with tolerances derived from
// bf16's 8-bit significand, determinism, the run-time choice, and a GPT loss and gradients in bf16
// against fp32.
#include "zinf/model/matmul.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdio>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "model/bf16.h"
#include "model/bf16_matmul.h"
#include "model/kernels.h"
#include "model_test_util.h"

namespace zinf::model {
namespace {

// Plain scalar fp32 -> bf16 -> fp32, round to nearest even (finite inputs).
float round_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::bit_cast<float>(u & 0xffff0000u);
}
std::vector<float> rounded(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); i++) r[i] = round_bf16(v[i]);
  return r;
}

std::vector<float> random_vector(uint64_t seed, size_t n, double scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = static_cast<float>(scale * testing::test_normal(seed, i));
  return v;
}

// Tolerances for one dot product of length K with S = sum |a_i||b_i| (over the fp32 inputs):
// - rounding each input to bf16 (unit roundoff u = 2^-9) changes a product by at most 2u + u^2
//   relative, so at most ~2^-8 * S in all;
// - accumulating K fp32 terms in any order errs by at most about K * 2^-24 * S; we allow 2^-23.
double bf16_tolerance(double S, int K) { return (std::ldexp(1.0, -8) + K * std::ldexp(1.0, -23)) * S; }
double accumulation_tolerance(double S, int K) { return K * std::ldexp(1.0, -23) * S + 1e-30; }

// A Matmul of kind kBf16, or nullopt when this build or CPU cannot run one (the reason in *why).
std::optional<Matmul> bf16_matmul(std::string* why) {
  const MatmulSupport s = matmul_support();
  if (!s.dnnl_built) {
    *why = "built without oneDNN";
    return std::nullopt;
  }
  if (!s.bf16_units) {
    *why = "the CPU has no bf16 units (oneDNN ISA " + s.isa + ")";
    return std::nullopt;
  }
  Matmul m;
  Status st = m.use(MatmulKind::kBf16);
  EXPECT_TRUE(st.is_ok()) << st.to_string();  // bf16 units and oneDNN: it must work
  if (!st.is_ok()) return std::nullopt;
  return m;
}

// got (R, Ccols) against base + sum_k a(r, k) * b(k, c) computed in double: for every (r, c),
// |got - want| <= tol(S, K) with S = |base| + sum_k |a(r, k) * b(k, c)|.
template <typename A, typename B>
void expect_product(const char* what, const std::vector<float>& got, const std::vector<float>& base, int R,
                    int Ccols, int K, A a, B b, bool bf16_inputs_tolerance) {
  int bad = 0;
  for (int r = 0; r < R; r++) {
    for (int c = 0; c < Ccols; c++) {
      double want = base.empty() ? 0.0 : base[static_cast<size_t>(r) * Ccols + c];
      double S = std::fabs(want);
      for (int k = 0; k < K; k++) {
        want += static_cast<double>(a(r, k)) * b(k, c);
        S += std::fabs(static_cast<double>(a(r, k)) * b(k, c));
      }
      const double tol = bf16_inputs_tolerance ? bf16_tolerance(S, K) : accumulation_tolerance(S, K);
      const double err = std::fabs(got[static_cast<size_t>(r) * Ccols + c] - want);
      if (err > tol && bad++ < 5) {
        ADD_FAILURE() << what << " (" << r << "," << c << "): got " << got[static_cast<size_t>(r) * Ccols + c]
                      << " want " << want << " err " << err << " > tol " << tol;
      }
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

struct Shape {
  int N, C, OC;
};

class Bf16MatmulTest : public ::testing::TestWithParam<Shape> {};

TEST_P(Bf16MatmulTest, ForwardAndBackwardWithinBf16Tolerance) {
  std::string why;
  std::optional<Matmul> mm = bf16_matmul(&why);
  if (!mm) GTEST_SKIP() << "no bf16 matmul: " << why;
  const auto [N, C, OC] = GetParam();
  const std::vector<float> inp = random_vector(1, static_cast<size_t>(N) * C, 1.0);
  const std::vector<float> weight = random_vector(2, static_cast<size_t>(OC) * C, 0.2);
  const std::vector<float> bias = random_vector(3, OC, 0.5);
  const std::vector<float> dout = random_vector(4, static_cast<size_t>(N) * OC, 0.01);
  const std::vector<float> dweight0 = random_vector(5, static_cast<size_t>(OC) * C, 0.1);
  const std::vector<float> dbias0 = random_vector(6, OC, 0.1);
  const std::vector<float> inp_r = rounded(inp), weight_r = rounded(weight), dout_r = rounded(dout);

  std::vector<float> out(static_cast<size_t>(N) * OC);
  mm->forward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  std::vector<float> bias_rows(out.size());  // the bias as a base for every row
  for (int n = 0; n < N; n++) std::memcpy(&bias_rows[static_cast<size_t>(n) * OC], bias.data(), OC * sizeof(float));
  auto x = [&](const std::vector<float>& v) { return [&v, C](int r, int k) { return v[static_cast<size_t>(r) * C + k]; }; };
  auto wT = [&](const std::vector<float>& v) { return [&v, C](int k, int o) { return v[static_cast<size_t>(o) * C + k]; }; };
  // Against the exact product of the fp32 inputs: the bf16 tolerance.
  expect_product("forward vs fp32 inputs", out, bias_rows, N, OC, C, x(inp), wT(weight), true);
  // Against the exact product of the bf16-rounded inputs: only fp32 accumulation error remains.
  expect_product("forward vs bf16 inputs", out, bias_rows, N, OC, C, x(inp_r), wT(weight_r), false);
  // And it really is bf16: the fp32 OpenBLAS product differs somewhere.
  std::vector<float> out32(out.size());
  kernels::matmul_forward(out32.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  EXPECT_NE(std::memcmp(out.data(), out32.data(), out.size() * sizeof(float)), 0);

  std::vector<float> dinp(static_cast<size_t>(N) * C, 7.0f), dweight = dweight0, dbias = dbias0;
  mm->backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), N, C, OC);
  // dinp (N,C) = dout (N,OC) @ weight (OC,C), overwritten
  auto d = [&](const std::vector<float>& v) { return [&v, OC](int r, int o) { return v[static_cast<size_t>(r) * OC + o]; }; };
  auto w = [&](const std::vector<float>& v) { return [&v, C](int o, int c) { return v[static_cast<size_t>(o) * C + c]; }; };
  expect_product("dinp vs fp32 inputs", dinp, {}, N, C, OC, d(dout), w(weight), true);
  expect_product("dinp vs bf16 inputs", dinp, {}, N, C, OC, d(dout_r), w(weight_r), false);
  // dweight (OC,C) += dout^T (OC,N) @ inp (N,C)
  auto dT = [&](const std::vector<float>& v) { return [&v, OC](int o, int n) { return v[static_cast<size_t>(n) * OC + o]; }; };
  expect_product("dweight vs fp32 inputs", dweight, dweight0, OC, C, N, dT(dout), x(inp), true);
  expect_product("dweight vs bf16 inputs", dweight, dweight0, OC, C, N, dT(dout_r), x(inp_r), false);
  // dbias += column sums of the fp32 dout, in the fp32 reference's order: bit-identical.
  std::vector<float> dbias32 = dbias0, dw32 = dweight0, dinp32(dinp.size());
  kernels::matmul_backward(dinp32.data(), dw32.data(), dbias32.data(), dout.data(), inp.data(), weight.data(), N, C,
                           OC);
  EXPECT_EQ(std::memcmp(dbias.data(), dbias32.data(), OC * sizeof(float)), 0);

  // Deterministic: the same call again gives the same bits.
  std::vector<float> out2(out.size()), dinp2(dinp.size()), dweight2 = dweight0, dbias2 = dbias0;
  mm->forward(out2.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  mm->backward(dinp2.data(), dweight2.data(), dbias2.data(), dout.data(), inp.data(), weight.data(), N, C, OC);
  EXPECT_EQ(std::memcmp(out.data(), out2.data(), out.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(dinp.data(), dinp2.data(), dinp.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(dweight.data(), dweight2.data(), dweight.size() * sizeof(float)), 0);
}

// Inputs rounded by their producer (MatmulInput's bf16 copy) give the products the backend's own
// rounding gives, bit for bit, and the backend reads the copy: inp's fp32 values are replaced by
// zeros in the pre-rounded calls, dout's half zeroed in the last; the weight's copy (a model's
// per-pass weight copy, bf16_weights.h) likewise, its fp32 values zeroed.
TEST_P(Bf16MatmulTest, PreRoundedInputsGiveTheSameBits) {
  std::string why;
  std::optional<Matmul> mm = bf16_matmul(&why);
  if (!mm) GTEST_SKIP() << "no bf16 matmul: " << why;
  ASSERT_TRUE(mm->reads_bf16_inputs());
  const auto [N, C, OC] = GetParam();
  const std::vector<float> inp = random_vector(1, static_cast<size_t>(N) * C, 1.0);
  const std::vector<float> weight = random_vector(2, static_cast<size_t>(OC) * C, 0.2);
  const std::vector<float> bias = random_vector(3, OC, 0.5);
  const std::vector<float> dout = random_vector(4, static_cast<size_t>(N) * OC, 0.01);
  const std::vector<float> dweight0 = random_vector(5, static_cast<size_t>(OC) * C, 0.1);
  const std::vector<float> zeros(inp.size(), 0.0f);
  std::vector<uint16_t> inp_bf16(inp.size());
  for (size_t i = 0; i < inp.size(); i++) inp_bf16[i] = detail::to_bf16(inp[i]);
  const std::vector<float> weight_zeros(weight.size(), 0.0f);
  std::vector<uint16_t> weight_bf16(weight.size());
  for (size_t i = 0; i < weight.size(); i++) weight_bf16[i] = detail::to_bf16(weight[i]);
  const MatmulInput weight_pre{weight_zeros.data(), weight_bf16.data()};

  std::vector<float> out(static_cast<size_t>(N) * OC), out_pre(out.size());
  mm->forward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  mm->forward(out_pre.data(), {zeros.data(), inp_bf16.data()}, weight_pre, bias.data(), N, C, OC);
  EXPECT_EQ(std::memcmp(out.data(), out_pre.data(), out.size() * sizeof(float)), 0);

  std::vector<float> dinp(inp.size()), dinp_pre(inp.size()), dweight = dweight0, dweight_pre = dweight0;
  std::vector<float> dbias(OC, 0.0f), dbias_pre(OC, 0.0f);
  mm->backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), N, C, OC);
  // dout's copy too; dbias sums dout's fp32 values, which stay.
  std::vector<uint16_t> dout_bf16(dout.size());
  for (size_t i = 0; i < dout.size(); i++) dout_bf16[i] = detail::to_bf16(dout[i]);
  const std::vector<float> dout_half_zero = [&] {  // the fp32 values products must not read
    std::vector<float> v = dout;
    for (size_t i = 0; i < v.size(); i += 2) v[i] = 0.0f;
    return v;
  }();
  mm->backward(dinp_pre.data(), dweight_pre.data(), dbias_pre.data(), {dout.data(), dout_bf16.data()},
               {zeros.data(), inp_bf16.data()}, weight_pre, N, C, OC);
  EXPECT_EQ(std::memcmp(dinp.data(), dinp_pre.data(), dinp.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(dweight.data(), dweight_pre.data(), dweight.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(dbias.data(), dbias_pre.data(), dbias.size() * sizeof(float)), 0);
  // The products read dout's copy, not its fp32 values (half of them zeroed here; no dbias).
  std::vector<float> dinp_copy(inp.size()), dweight_copy = dweight0;
  mm->backward(dinp_copy.data(), dweight_copy.data(), nullptr, {dout_half_zero.data(), dout_bf16.data()},
               {zeros.data(), inp_bf16.data()}, weight.data(), N, C, OC);
  EXPECT_EQ(std::memcmp(dinp.data(), dinp_copy.data(), dinp.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(dweight.data(), dweight_copy.data(), dweight.size() * sizeof(float)), 0);

  // The fp32 kind reads inp and weight and ignores the copies.
  Matmul fp32;
  ASSERT_FALSE(fp32.reads_bf16_inputs());
  std::vector<float> out32(out.size()), out32_ref(out.size());
  fp32.forward(out32.data(), {inp.data(), inp_bf16.data()}, {weight.data(), weight_bf16.data()}, bias.data(), N, C,
               OC);
  kernels::matmul_forward(out32_ref.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  EXPECT_EQ(std::memcmp(out32.data(), out32_ref.data(), out32.size() * sizeof(float)), 0);
}

// Odd sizes (no multiple of the kernels' blocking), GPT shapes (C=64, 3C, 4C) and a vocab head.
INSTANTIATE_TEST_SUITE_P(Shapes, Bf16MatmulTest,
                         ::testing::Values(Shape{37, 53, 29}, Shape{1, 7, 5}, Shape{128, 64, 192},
                                           Shape{96, 256, 64}, Shape{64, 64, 300}));

TEST(MatmulTest, Fp32KindIsTheOpenBlasKernelBitForBit) {
  const int N = 33, C = 40, OC = 24;
  const std::vector<float> inp = random_vector(1, static_cast<size_t>(N) * C, 1.0);
  const std::vector<float> weight = random_vector(2, static_cast<size_t>(OC) * C, 0.2);
  const std::vector<float> bias = random_vector(3, OC, 0.5);
  Matmul mm;
  ASSERT_EQ(mm.kind(), MatmulKind::kFp32);
  std::vector<float> a(static_cast<size_t>(N) * OC), b(a.size());
  mm.forward(a.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  kernels::matmul_forward(b.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

// Sets ZINF_MATMUL for one scope and restores what was there.
class ScopedMatmulEnv {
 public:
  explicit ScopedMatmulEnv(const char* value) {
    if (const char* old = std::getenv("ZINF_MATMUL")) old_ = old;
    if (value != nullptr) {
      setenv("ZINF_MATMUL", value, 1);
    } else {
      unsetenv("ZINF_MATMUL");
    }
  }
  ~ScopedMatmulEnv() {
    if (old_) {
      setenv("ZINF_MATMUL", old_->c_str(), 1);
    } else {
      unsetenv("ZINF_MATMUL");
    }
  }

 private:
  std::optional<std::string> old_;
};

MatmulSupport support_of(bool dnnl, const char* isa, const char* vendor, int family, int model) {
  const std::string i = isa;
  return {dnnl, i == "avx512_core_bf16" || i == "avx512_core_amx", i == "avx512_core_amx", i, {vendor, family, model}};
}

// auto's table of CPU families, row by row (docs/model.md, "Matrix products").
TEST(MatmulTest, AutoFollowsTheTableOfCpuFamilies) {
  const auto kind = [](const MatmulSupport& s) { return auto_matmul_choice(s).kind; };
  // AMX tiles (Sapphire Rapids and later): bf16.
  EXPECT_EQ(kind(support_of(true, "avx512_core_amx", "GenuineIntel", 6, 143)), MatmulKind::kBf16);
  // Intel AVX512-BF16 without AMX (the measured Xeon, family 6 model 207; Cooper Lake): fp32.
  EXPECT_EQ(kind(support_of(true, "avx512_core_bf16", "GenuineIntel", 6, 207)), MatmulKind::kFp32);
  EXPECT_EQ(kind(support_of(true, "avx512_core_bf16", "GenuineIntel", 6, 85)), MatmulKind::kFp32);
  // AMD Zen 4 (family 25 with AVX512-BF16: EPYC 9004 model 17, Ryzen 7000 model 97): bf16.
  EXPECT_EQ(kind(support_of(true, "avx512_core_bf16", "AuthenticAMD", 25, 17)), MatmulKind::kBf16);
  EXPECT_EQ(kind(support_of(true, "avx512_core_bf16", "AuthenticAMD", 25, 97)), MatmulKind::kBf16);
  // Zen 3 is family 25 too, but has no bf16 units: fp32, as every CPU without them.
  EXPECT_EQ(kind(support_of(true, "avx2", "AuthenticAMD", 25, 1)), MatmulKind::kFp32);
  EXPECT_EQ(kind(support_of(true, "avx512_core", "GenuineIntel", 6, 85)), MatmulKind::kFp32);
  // No oneDNN: fp32 whatever the CPU.
  EXPECT_EQ(kind(support_of(false, "", "AuthenticAMD", 25, 17)), MatmulKind::kFp32);
  EXPECT_EQ(kind(support_of(false, "", "GenuineIntel", 6, 143)), MatmulKind::kFp32);
  for (const MatmulSupport& s : {support_of(true, "avx512_core_amx", "GenuineIntel", 6, 143),
                                 support_of(true, "avx512_core_bf16", "AuthenticAMD", 25, 17),
                                 support_of(true, "avx2", "AuthenticAMD", 25, 1)}) {
    EXPECT_TRUE(auto_matmul_choice(s).known) << s.isa;
  }
  // The start-up line names the row and the CPU.
  const MatmulChoice zen4 = auto_matmul_choice(support_of(true, "avx512_core_bf16", "AuthenticAMD", 25, 17));
  EXPECT_EQ(zen4.row, "AMD Zen 4");
  EXPECT_NE(zen4.why.find("AuthenticAMD family 25 model 17"), std::string::npos) << zen4.why;
}

// A CPU with bf16 units and no row (a later AMD family, another vendor, an Intel family after 6)
// gets fp32, the safe choice, and a line saying how to measure and pin the kind.
TEST(MatmulTest, AutoGivesAnUnknownCpuFp32AndSaysHowToMeasure) {
  for (const MatmulSupport& s : {support_of(true, "avx512_core_bf16", "AuthenticAMD", 26, 2),
                                 support_of(true, "avx512_core_bf16", "HygonGenuine", 24, 0),
                                 support_of(true, "avx512_core_bf16", "GenuineIntel", 19, 1),
                                 support_of(true, "avx512_core_bf16", "", 0, 0)}) {
    const MatmulChoice c = auto_matmul_choice(s);
    EXPECT_EQ(c.kind, MatmulKind::kFp32) << c.why;
    EXPECT_FALSE(c.known) << c.why;
    EXPECT_NE(c.why.find("build/bench/matmul_bench"), std::string::npos) << c.why;
    EXPECT_NE(c.why.find("ZINF_MATMUL"), std::string::npos) << c.why;
  }
  // detail::auto_matmul_kind is the choice's kind.
  const MatmulSupport zen5 = support_of(true, "avx512_core_bf16", "AuthenticAMD", 26, 2);
  EXPECT_EQ(detail::auto_matmul_kind(zen5), MatmulKind::kFp32);
}

TEST(MatmulTest, SupportDescribesThisMachine) {
  const MatmulSupport s = matmul_support();
  EXPECT_EQ(s.amx, s.isa == "avx512_core_amx");
  if (s.amx) {
    EXPECT_TRUE(s.bf16_units);
  }
#if defined(__x86_64__)
  EXPECT_EQ(s.cpu.vendor.size(), 12u);
  EXPECT_GE(s.cpu.family, 6);
#endif
  std::printf("this machine: %s family %d model %d, %s: auto %s (%s)\n", s.cpu.vendor.c_str(), s.cpu.family,
              s.cpu.model, s.isa.c_str(), std::string(matmul_kind_name(auto_matmul_choice(s).kind)).c_str(),
              auto_matmul_choice(s).row.c_str());
}

TEST(MatmulTest, ResolveFollowsPrecisionHardwareAndOverride) {
  const MatmulSupport s = matmul_support();
  std::optional<MatmulKind> auto_kind;
  {
    ScopedMatmulEnv env(nullptr);
    EXPECT_EQ(testing::must(resolve_matmul(ComputePrecision::kFp32)), MatmulKind::kFp32);
    auto_kind = testing::must(resolve_matmul(ComputePrecision::kBf16));
    EXPECT_EQ(*auto_kind, detail::auto_matmul_kind(s));
    EXPECT_EQ(testing::must(resolve_matmul(ComputePrecision::kFp16)), *auto_kind);
  }
  {
    ScopedMatmulEnv env("auto");
    EXPECT_EQ(testing::must(resolve_matmul(ComputePrecision::kBf16)), *auto_kind);
  }
  {
    ScopedMatmulEnv env("fp32");
    EXPECT_EQ(testing::must(resolve_matmul(ComputePrecision::kBf16)), MatmulKind::kFp32);
  }
  {
    ScopedMatmulEnv env("bf16");  // fp32 runs stay fp32 whatever the override
    EXPECT_EQ(testing::must(resolve_matmul(ComputePrecision::kFp32)), MatmulKind::kFp32);
    Result<MatmulKind> r = resolve_matmul(ComputePrecision::kBf16);
    if (s.dnnl_built) {
      EXPECT_EQ(testing::must(std::move(r)), MatmulKind::kBf16);
    } else {
      EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    }
  }
  {
    ScopedMatmulEnv env("bf17");
    Result<MatmulKind> r = resolve_matmul(ComputePrecision::kBf16);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("ZINF_MATMUL=bf17"), std::string::npos) << r.status().to_string();
  }
}


// A GPT pass with bf16 products against the fp32 one, parameters already bf16 (as the engine's
// compute copies are in a bf16 run). Every product rounds its activation / gradient inputs to
// bf16 (relative error up to 2^-9 each), and the layers compound it. Stated tolerances, a factor
// 2 to 10 above what was measured (docs/model.md, "Matrix products"):
// - GPT-2 initialisation: loss within 2^-12 relative, gradients within 2^-6 relative L2;
// - large random weights (sharp softmaxes amplify rounding): loss 2^-8, gradients 2^-4.
void expect_gpt_bf16_close(bool large_weights, double loss_tol, double grad_tol) {
  GptConfig c;
  c.vocab_size = 96;
  c.max_seq = 32;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 64;
  const int B = 4, T = 32;
  GptModel fp32 = testing::make_gpt(c), bf16 = testing::make_gpt(c);
  ASSERT_TRUE(bf16.use_matmul(MatmulKind::kBf16).is_ok());
  EXPECT_EQ(bf16.matmul_kind(), MatmulKind::kBf16);
  Result<LocalParams> lp = LocalParams::create(fp32.params(), fp32.modules());
  ASSERT_TRUE(lp.is_ok());
  if (large_weights) {
    testing::randomize(*lp, fp32.params(), 11);
  } else {
    lp->init(11);
  }
  for (const ParamSpec& p : fp32.params()) {
    for (float& x : lp->param(p.index)) x = round_bf16(x);
  }
  const std::vector<int32_t> in = testing::random_tokens(1, B * T, c.vocab_size);
  const std::vector<int32_t> tgt = testing::random_tokens(2, B * T, c.vocab_size);

  lp->zero_grads();
  const float loss32 = testing::must(fp32.forward_backward(in, tgt, B, T, *lp));
  const std::vector<float> g32(lp->flat_grads().begin(), lp->flat_grads().end());
  lp->zero_grads();
  const float loss16 = testing::must(bf16.forward_backward(in, tgt, B, T, *lp));
  const std::vector<float> g16(lp->flat_grads().begin(), lp->flat_grads().end());
  lp->zero_grads();
  const float again = testing::must(bf16.forward_backward(in, tgt, B, T, *lp));
  EXPECT_EQ(std::memcmp(&loss16, &again, sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(g16.data(), lp->flat_grads().data(), g16.size() * sizeof(float)), 0);

  const double loss_rel = std::fabs(static_cast<double>(loss16) - loss32) / std::fabs(loss32);
  double diff2 = 0, norm2 = 0;
  for (size_t i = 0; i < g32.size(); i++) {
    diff2 += (static_cast<double>(g16[i]) - g32[i]) * (static_cast<double>(g16[i]) - g32[i]);
    norm2 += static_cast<double>(g32[i]) * g32[i];
  }
  const double grad_rel = std::sqrt(diff2 / norm2);
  std::printf("gpt bf16 vs fp32 (%s): loss %.6f vs %.6f (rel %.2e), gradient rel L2 %.2e\n",
              large_weights ? "large weights" : "init", loss16, loss32,
              loss_rel, grad_rel);
  EXPECT_GT(loss_rel + grad_rel, 0.0);  // the bf16 path really ran
  EXPECT_LE(loss_rel, loss_tol);
  EXPECT_LE(grad_rel, grad_tol);
}

TEST(MatmulTest, GptLossAndGradientsInBf16CloseToFp32) {
  std::string why;
  if (!bf16_matmul(&why)) GTEST_SKIP() << "no bf16 matmul: " << why;
  expect_gpt_bf16_close(false, std::ldexp(1.0, -12), std::ldexp(1.0, -6));
  expect_gpt_bf16_close(true, std::ldexp(1.0, -8), std::ldexp(1.0, -4));
}

}  // namespace
}  // namespace zinf::model
