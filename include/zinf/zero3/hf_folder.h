// Hugging Face model folders in and out: config.json plus model.safetensors, or shards listed
// by model.safetensors.index.json, for the architectures zinf builds (model_type "gpt2", and the
// Llama family: "llama", "mistral", "qwen2", "qwen3").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "zinf/model/model.h"
#include "zinf/status.h"
#include "zinf/zero3/checkpoint.h"

namespace zinf::zero3 {

// An HF folder opened for reading. open() reads config.json (its model_type decides the
// architecture; keys zinf cannot honour, such as another activation or a layer-norm epsilon,
// are errors naming the key) and the safetensors headers, and checks that every parameter of
// the model is there with its shape: a missing, mis-shaped or unreadable tensor is an error
// naming it and the file. F32, BF16 and F16 tensors are read as fp32.
class HfFolder {
 public:
  static Result<HfFolder> open(const std::string& dir);
  HfFolder(HfFolder&&) noexcept;
  HfFolder& operator=(HfFolder&&) noexcept;
  ~HfFolder();

  const std::string& dir() const;
  const std::string& model_type() const;  // "gpt2", "llama", "mistral", "qwen2" or "qwen3"
  // The weights' dtype, torch's name ("float32", "bfloat16", "float16"): config.json's "dtype"
  // or "torch_dtype", else the tensors' when they agree, else "float32". What an export of a run
  // started from this folder is written in (write_hf_folder).
  const std::string& dtype() const;
  // The folder's architecture, as a new model (the same every call).
  Result<std::unique_ptr<model::Model>> make_model(bool activation_checkpointing = false) const;
  // Parameter `index` of make_model()'s params(), fp32, in zinf's layout (HF GPT-2's Conv1D
  // weights, stored [in, out], are transposed).
  Status read_param(std::size_t index, std::span<float> out) const;

 private:
  struct Impl;
  explicit HfFolder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The built-in model's config_json() for an HF config.json's text, with HfFolder::open's checks
// (errors name `source` and the key). For tools and tests that build the model without weights.
Result<std::string> model_config_from_hf(const std::string& config_text, const std::string& source);

// The same for a config.json file, or a folder holding one (its weights, if any, are not read):
// the architecture alone, for a run that starts from the built-in model's own initialisation (as
// transformers' from_config does). Errors name the file.
Result<std::string> model_config_from_hf_file(const std::string& path);

// Writes a checkpoint's fp32 weights, rounded to `torch_dtype` ("float32", "bfloat16" or
// "float16", to nearest even; config.json's torch_dtype and dtype say it), as an HF folder
// `out_dir` (created if missing) that
// transformers loads unchanged: config.json and model.safetensors, or, when the tensors pass
// max_shard_bytes, model-0000K-of-0000N.safetensors with model.safetensors.index.json. Every
// file is replaced atomically. Built-in architectures only (a user model has no HF class):
// another type is an unsupported error naming it.
Status write_hf_folder(const CheckpointReader& checkpoint, const std::string& out_dir,
                       std::uint64_t max_shard_bytes = 5'000'000'000ull, const std::string& torch_dtype = "float32");

}  // namespace zinf::zero3
