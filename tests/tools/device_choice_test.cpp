// zinf's --device resolution on every machine: the request against what the build and the
// machine have, and which models may go to the GPU.
#include "device_choice.h"

#include <gtest/gtest.h>

namespace zinf::cli {
namespace {

DeviceProbe no_build() { return DeviceProbe{}; }
DeviceProbe no_device() {
  return DeviceProbe{true, 0, "no CUDA device: cudaGetDeviceCount: cudaErrorNoDevice: no CUDA-capable device is detected", "", ""};
}
DeviceProbe one_h100() { return DeviceProbe{true, 1, "", "NVIDIA H100 80GB HBM3, 79.6 GiB", "NVIDIA H100 80GB HBM3"}; }

DeviceChoice must(Result<DeviceChoice> r) {
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? r.value() : DeviceChoice{};
}

TEST(ResolveDevice, AutoIsCudaOnlyWithTheLayerAndADevice) {
  const DeviceChoice gpu = must(resolve_device("auto", one_h100()));
  EXPECT_EQ(gpu.device, ComputeDevice::kCuda);
  EXPECT_FALSE(gpu.explicit_request);
  EXPECT_EQ(gpu.line(), "device: cuda (NVIDIA H100 80GB HBM3, 79.6 GiB)");

  const DeviceChoice none = must(resolve_device("auto", no_device()));
  EXPECT_EQ(none.device, ComputeDevice::kCpu);
  EXPECT_EQ(none.line(), "device: cpu (" + no_device().why_none + ")");

  const DeviceChoice unbuilt = must(resolve_device("auto", no_build()));
  EXPECT_EQ(unbuilt.device, ComputeDevice::kCpu);
  EXPECT_NE(unbuilt.line().find("built without the GPU layer"), std::string::npos) << unbuilt.line();

  // A build-less probe wins even if it claims devices (it never does: nothing was probed).
  EXPECT_EQ(must(resolve_device("auto", DeviceProbe{false, 2, "", "x", "x"})).device, ComputeDevice::kCpu);
  // Several GPUs: GPU 0, said so.
  EXPECT_EQ(must(resolve_device("auto", DeviceProbe{true, 8, "", "NVIDIA H200, 139.8 GiB", "NVIDIA H200"})).line(),
            "device: cuda (NVIDIA H200, 139.8 GiB; GPU 0 of 8)");
}

TEST(ResolveDevice, CudaWithoutAGpuFailsNamingWhy) {
  for (const DeviceProbe& p : {no_build(), no_device()}) {
    Result<DeviceChoice> r = resolve_device("cuda", p);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kUnsupported);
    EXPECT_EQ(r.status().message().rfind("--device cuda: ", 0), 0u) << r.status().message();
    const std::string why = p.build_has_gpu ? "cudaErrorNoDevice" : "built without the GPU layer";
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().message();
  }
  const DeviceChoice gpu = must(resolve_device("cuda", one_h100()));
  EXPECT_EQ(gpu.device, ComputeDevice::kCuda);
  EXPECT_TRUE(gpu.explicit_request);
}

TEST(ResolveDevice, CpuIgnoresTheProbeAndOthersAreRefused) {
  for (const DeviceProbe& p : {no_build(), no_device(), one_h100()}) {
    const DeviceChoice c = must(resolve_device("cpu", p));
    EXPECT_EQ(c.device, ComputeDevice::kCpu);
    EXPECT_EQ(c.line(), "device: cpu (--device cpu)");
  }
  Result<DeviceChoice> r = resolve_device("gpu", one_h100());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
}

TEST(FitDeviceToModel, TheGptAndLlamaGoToTheGpu) {
  const DeviceChoice asked = must(resolve_device("cuda", one_h100()));
  EXPECT_EQ(must(fit_device_to_model(asked, "gpt")).device, ComputeDevice::kCuda);
  EXPECT_EQ(must(fit_device_to_model(asked, "llama")).device, ComputeDevice::kCuda);
  EXPECT_EQ(must(fit_device_to_model(must(resolve_device("auto", one_h100())), "llama")).device, ComputeDevice::kCuda);
  // A user's model (registry.h) has no GPU pass.
  Result<DeviceChoice> mlp = fit_device_to_model(asked, "mlp");
  ASSERT_FALSE(mlp.is_ok());
  EXPECT_EQ(mlp.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(mlp.status().message().find("mlp runs on the CPU only for now"), std::string::npos)
      << mlp.status().message();

  // auto falls back to the CPU and says why; cpu stays cpu for any model.
  const DeviceChoice fallback = must(fit_device_to_model(must(resolve_device("auto", one_h100())), "mlp"));
  EXPECT_EQ(fallback.device, ComputeDevice::kCpu);
  EXPECT_EQ(fallback.line(), "device: cpu (mlp runs on the CPU only for now)");
  EXPECT_EQ(must(fit_device_to_model(must(resolve_device("cpu", one_h100())), "llama")).device, ComputeDevice::kCpu);
}

}  // namespace
}  // namespace zinf::cli
