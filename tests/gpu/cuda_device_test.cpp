// The device interface's contract (tests/device/device_conformance.h) on the CUDA device. Skipped
// without a GPU (failed under ZINF_EXPECT_GPU=1).
#include "gpu/cuda_device.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "device_conformance.h"
#include "gate_kernel.h"
#include "gpu/cuda_error.h"
#include "gpu_test_util.h"

namespace zinf::gpu {
namespace {

using device::testing::DeviceCase;
using device::testing::DeviceConformance;
using device::StreamContext;
using device::Work;

class CudaOps final : public device::testing::TestOps {
 public:
  Work axpb(float* p, std::size_t n, float mul, float add) override {
    return [=](const StreamContext& ctx) {
      return cuda_status(testing::launch_axpb(static_cast<cudaStream_t>(ctx.native_stream), p, n, mul, add), "axpb");
    };
  }
  Work gate() override {
    return [this](const StreamContext& ctx) {
      if (!gate_.error().empty()) return Status::internal("gate: " + gate_.error());
      return cuda_status(gate_.launch(static_cast<cudaStream_t>(ctx.native_stream)), "gate kernel");
    };
  }
  void open() override { gate_.open(); }

 private:
  testing::Gate gate_;
};

// Skip without a GPU, unless one is expected (ZINF_EXPECT_GPU=1): then make_device fails.
std::string skip_reason() { return testing::gpu_expected() ? std::string() : testing::why_no_gpu(); }

std::unique_ptr<device::Device> make_device() {
  auto d = make_cuda_device();
  EXPECT_TRUE(d.is_ok()) << d.status().to_string();
  return d.is_ok() ? std::move(d).value() : nullptr;
}

INSTANTIATE_TEST_SUITE_P(CudaDevice, DeviceConformance,
                         ::testing::Values(DeviceCase{"gpu0", make_device,
                                                      [] { return std::unique_ptr<device::testing::TestOps>(std::make_unique<CudaOps>()); },
                                                      skip_reason}),
                         device::testing::case_name);

TEST(CudaDeviceWithoutGpu, CreatingOneSaysThereIsNoDevice) {
  ZINF_REQUIRE_NO_GPU();
  auto d = make_cuda_device();
  ASSERT_FALSE(d.is_ok());
  EXPECT_EQ(d.status().code(), ErrorCode::kUnsupported) << d.status().to_string();
}

}  // namespace
}  // namespace zinf::gpu
