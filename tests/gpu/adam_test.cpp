// The fused GPU Adam/AdamW against the CPU optimizer (optim::adam_step, scalar ISA): bit for
// bit in params, both moments and the 16-bit copy, for every gradient dtype, copy dtype and
// decay mode (the kernel's per-element code avoids fused multiply-adds and uses IEEE sqrt and
// division, as the CPU reference does). NaN gradients compare as NaN, whatever the payload.
// Skipped without a GPU.
#include "gpu/adam.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "gpu/launch_geometry.h"
#include "gpu_test_util.h"
#include "kernel_test_util.h"

namespace zinf::gpu {
namespace {

using optim::DType;
using testing::randn;
using testing::TestBuffer;

// Equal bits, or both NaN.
::testing::AssertionResult same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < a.size(); i++) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<uint16_t> half_bits(const std::vector<float>& x, DType t) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); i++) h[i] = t == DType::kBF16 ? optim::f32_to_bf16_bits(x[i]) : optim::f32_to_f16_bits(x[i]);
  return h;
}

void run_case(size_t n, DType grad_dtype, DType copy_dtype, double wd, bool adam_w) {
  SCOPED_TRACE(::testing::Message() << "n " << n << " grad " << optim::dtype_name(grad_dtype) << " copy "
                                    << optim::dtype_name(copy_dtype) << " wd " << wd << (adam_w ? " adamw" : " l2"));
  optim::AdamParams hp;
  hp.lr = 2e-3;
  hp.weight_decay = wd;
  hp.adam_w_mode = adam_w;
  std::vector<float> p = randn(1, n), m = randn(2, n, 0.1), v = randn(3, n, 0.01), g = randn(4, n, 30.0);
  for (float& x : v) x = std::fabs(x);
  g[1] = NAN;  // an overflowed gradient: NaN through the step, as on the CPU
  g[2] = 0.0f;
  const std::vector<uint16_t> g16 = grad_dtype == DType::kF32 ? std::vector<uint16_t>{} : half_bits(g, grad_dtype);
  const bool with_copy = copy_dtype != DType::kF32;
  TestBuffer<float> d_p(p), d_m(m), d_v(v), d_g32(grad_dtype == DType::kF32 ? g : std::vector<float>{});
  TestBuffer<uint16_t> d_g16(g16), d_copy(with_copy ? n : 0);
  const void* d_grad = grad_dtype == DType::kF32 ? static_cast<const void*>(d_g32.get()) : d_g16.get();
  const void* h_grad = grad_dtype == DType::kF32 ? static_cast<const void*>(g.data()) : g16.data();
  std::vector<uint16_t> copy(with_copy ? n : 0);
  const double scale = 1.0 / 4096.0;
  for (int64_t step = 1; step <= 3; step++) {
    optim::ExecOptions exec;
    exec.isa = optim::KernelIsa::kScalar;
    optim::HalfCopy hc;
    if (with_copy) hc = optim::HalfCopy{copy.data(), copy_dtype};
    ASSERT_TRUE(optim::adam_step(hp, step, p, m, v, optim::GradView{h_grad, grad_dtype, n, scale}, hc, exec).is_ok());
    const AdamArrays a{d_p.get(), d_m.get(), d_v.get(), d_grad, grad_dtype, with_copy ? d_copy.get() : nullptr,
                       copy_dtype, n};
    const Status st = adam_step(hp, step, scale, a, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
  }
  EXPECT_TRUE(same_floats(d_p.download(), p)) << "params";
  EXPECT_TRUE(same_floats(d_m.download(), m)) << "exp_avg";
  EXPECT_TRUE(same_floats(d_v.download(), v)) << "exp_avg_sq";
  if (with_copy) {
    const std::vector<uint16_t> got = d_copy.download();
    for (size_t i = 0; i < n; i++) {
      if (std::isnan(p[i])) continue;  // the NaN copy's bits are checked by the host test
      ASSERT_EQ(got[i], copy[i]) << i;
    }
  }
}

TEST(GpuAdam, MatchesCpuOptimizerBitForBit) {
  ZINF_REQUIRE_GPU();
  for (DType g : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (DType c : {DType::kF32, DType::kBF16, DType::kF16}) {
      run_case(100003, g, c, 0.0, true);
      run_case(100003, g, c, 0.05, true);
      run_case(100003, g, c, 0.05, false);
    }
  }
}

TEST(GpuAdam, GridStrideCoversMoreElementsThanOneGrid) {
  ZINF_REQUIRE_GPU();
  run_case(static_cast<size_t>(kMaxBlocks) * kThreads + 1001, DType::kF32, DType::kBF16, 0.01, true);
}

TEST(GpuAdam, BadArgumentsFailBeforeLaunch) {
  // No device needed: the checks run on the host.
  AdamArrays a{nullptr, nullptr, nullptr, nullptr, DType::kF32, nullptr, DType::kBF16, 16};
  const Status st = adam_step(optim::AdamParams{}, 1, 1.0, a, nullptr);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("null"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace zinf::gpu
