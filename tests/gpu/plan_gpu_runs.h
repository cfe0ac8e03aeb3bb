// The GPU runs the planner's GPU tests compare with: the models and gpu-check configs they ran
// (bench/gpu), made on the host with the GPU models' own workspace sizes.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "gpu/gpt_gpu.h"
#include "gpu/llama_gpu.h"
#include "zinf/config/ds_config.h"
#include "zinf/model/gpt.h"
#include "zinf/model/llama.h"
#include "zinf/model/registry.h"
#include "zinf/zero3/hf_folder.h"

namespace zinf::zero3 {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
// Device memory free when the engine started: each GPU's total less about 1 GiB of CUDA context
// and libraries (H100 80GB HBM3: 81559 MiB; H200: 143771 MiB).
constexpr std::uint64_t kH100Free = (81559 - 1024) * kMiB;
constexpr std::uint64_t kH200Free = (143771 - 1024) * kMiB;

struct Made {
  std::unique_ptr<model::Model> model;
  std::uint64_t workspace = 0;
};

// `model`: a GPT preset, or an HF config.json under bench/gpu.
inline Made make_run_model(const std::string& model, bool recompute, int bt) {
  const std::string dir = ZINF_BENCH_GPU_DIR;
  Made out;
  const std::string& name = model;
  if (name.ends_with(".json")) {
    auto json = model_config_from_hf_file(dir + "/" + name);
    EXPECT_TRUE(json.is_ok()) << json.status().to_string();
    model::BuiltinOptions options;
    options.activation_checkpointing = recompute;
    auto m = model::make_builtin_model(json.value(), name, options);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    const auto* llama = dynamic_cast<const model::LlamaModel*>(m.value().get());
    EXPECT_NE(llama, nullptr) << name;
    if (llama != nullptr) out.workspace = gpu::LlamaGpu::workspace_bytes(llama->config(), bt);
    out.model = std::move(m).value();
    return out;
  }
  auto c = model::gpt_preset(name, 50257);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  c.value().activation_checkpointing = recompute;
  out.workspace = gpu::GptGpu::workspace_bytes(c.value(), bt);
  auto m = model::GptModel::create(c.value());
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  out.model = std::move(m).value();
  return out;
}

// A gpu-check config; c_nvme_offload's @NVME_PATH@ (filled in by gpu-check) is a folder here.
inline Result<config::DsConfig> load_config(const std::string& name) {
  const std::string path = std::string(ZINF_BENCH_GPU_DIR) + "/" + name;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string json = text.str();
  const char* tmp = std::getenv("ZINF_TEST_TMPDIR");
  for (std::size_t at; (at = json.find("@NVME_PATH@")) != std::string::npos;) {
    json.replace(at, 11, tmp != nullptr ? tmp : "/tmp");
  }
  return config::parse_ds_config(json, path, config::AutoContext{});
}

}  // namespace zinf::zero3
