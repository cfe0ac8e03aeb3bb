// Helpers for the GPU kernel tests: random data, bf16 rounding on the host, stated-tolerance
// comparisons, and a tiny RAII owner of cudaMalloc'd test buffers.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gpu/blas.h"
#include "gpu/numerics.h"
#include "gpu_test_util.h"
#include "model/rng.h"
#include "zinf/optim/half.h"

namespace zinf::gpu::testing {

inline std::vector<float> randn(uint64_t seed, size_t n, double scale = 1.0) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) {
    v[i] = static_cast<float>(scale * model::detail::normal_from_key(model::detail::hash3(seed, i, 0x677075)));
  }
  return v;
}

inline uint16_t bf16_bits(float f) { return optim::f32_to_bf16_bits(f); }
inline float bf16_value(uint16_t h) { return optim::bf16_bits_to_f32(h); }
inline float round_bf16(float f) { return bf16_value(bf16_bits(f)); }

// The values rounded to bf16 (nearest even), as fp32: what the GPU sees of them.
inline std::vector<float> rounded(std::vector<float> x) {
  for (float& v : x) v = round_bf16(v);
  return x;
}
inline std::vector<uint16_t> to_bits(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); i++) out[i] = bf16_bits(x[i]);
  return out;
}
inline std::vector<float> from_bits(const std::vector<uint16_t>& h) {
  std::vector<float> out(h.size());
  for (size_t i = 0; i < h.size(); i++) out[i] = bf16_value(h[i]);
  return out;
}

inline double max_abs(const std::vector<float>& x) {
  double m = 0.0;
  for (float v : x) m = std::max(m, static_cast<double>(std::fabs(v)));
  return m;
}

// Every |got - want| <= rel * |want| + floor (an absolute floor); reports the first few misses.
inline ::testing::AssertionResult near_all_floor(const std::vector<float>& got, const std::vector<float>& want,
                                                 double rel, double floor) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "sizes " << got.size() << " and " << want.size();
  }
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); i++) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= rel * std::fabs(want[i]) + floor)) {
      if (bad < 5) first += " [" + std::to_string(i) + "] got " + std::to_string(got[i]) + " want " + std::to_string(want[i]);
      bad++;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " outside " << rel << " rel + " << floor
                                       << " abs:" << first;
}

// Every element within rel * |want| + abs_frac * max|want|.
inline ::testing::AssertionResult near_all(const std::vector<float>& got, const std::vector<float>& want, double rel,
                                           double abs_frac) {
  return near_all_floor(got, want, rel, abs_frac * max_abs(want));
}

// ||got - want|| / ||want|| (L2).
inline double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0.0;
  double den = 0.0;
  for (size_t i = 0; i < got.size() && i < want.size(); i++) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return den == 0.0 ? std::sqrt(num) : std::sqrt(num / den);
}

// A cudaMalloc'd array of n T, freed at scope exit. Tests only (the engine's memory comes from
// the caching allocator); a failed allocation fails the test.
template <typename T>
class TestBuffer {
 public:
  explicit TestBuffer(size_t n) : n_(n) {
    if (n > 0) {
      const cudaError_t err = cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T));
      EXPECT_EQ(err, cudaSuccess) << "cudaMalloc of " << n * sizeof(T) << " bytes: " << cudaGetErrorString(err);
      if (err != cudaSuccess) p_ = nullptr;
    }
  }
  explicit TestBuffer(const std::vector<T>& host) : TestBuffer(host.size()) { upload(host); }
  TestBuffer(const TestBuffer&) = delete;
  TestBuffer& operator=(const TestBuffer&) = delete;
  ~TestBuffer() {
    if (p_ != nullptr) (void)cudaFree(p_);
  }

  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    ASSERT_EQ(host.size(), n_);
    if (n_ > 0) {
      ASSERT_EQ(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  // Synchronises the device first, so it sees the results of everything enqueued.
  std::vector<T> download() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return host;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// A bf16 device array holding the bf16 roundings of `x`.
inline TestBuffer<uint16_t> upload_bf16(const std::vector<float>& x) { return TestBuffer<uint16_t>(to_bits(x)); }
inline bf16* bf(const TestBuffer<uint16_t>& b) { return reinterpret_cast<bf16*>(b.get()); }
inline std::vector<float> download_bf16(const TestBuffer<uint16_t>& b) { return from_bits(b.download()); }

// A fixture with a cuBLASLt handle (blas_); skips naming why without a GPU (fails under
// ZINF_EXPECT_GPU=1).
class BlasFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    ZINF_REQUIRE_GPU();
    Result<Blas> b = Blas::create();
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    blas_ = std::make_unique<Blas>(std::move(b).value());
  }
  std::unique_ptr<Blas> blas_;
};

}  // namespace zinf::gpu::testing
