// `zinf consolidate CKPT OUT`: full fp32 weights from a (sharded) checkpoint, as one safetensors
// file, or with --hf as a Hugging Face folder (config.json + safetensors) transformers loads, in
// the dtype of the folder the run started from unless --dtype says otherwise.
#include <iostream>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "commands.h"
#include "run_state.h"
#include "zinf/zero3/checkpoint.h"
#include "zinf/zero3/hf_folder.h"

namespace zinf::cli {
namespace {

// --dtype's names and torch's.
std::string torch_dtype_name(const std::string& short_name) {
  if (short_name == "bf16") return "bfloat16";
  if (short_name == "fp16") return "float16";
  return "float32";
}

Status write_hf(const std::string& checkpoint, const std::string& out, std::uint64_t max_shard_bytes,
                const std::string& dtype_option) {
  ZINF_ASSIGN_OR_RETURN(const zero3::CheckpointReader reader, zero3::CheckpointReader::open(checkpoint));
  std::string dtype = dtype_option.empty() ? "" : torch_dtype_name(dtype_option);
  if (dtype.empty()) {
    // The run's starting folder's dtype (zinf train --model-dir records it); fp32 otherwise.
    const std::string source = source_dtype_of(reader.client_state());
    dtype = source.empty() ? "float32" : source;
    std::cout << fmt::format("dtype: {} ({})\n", dtype,
                             source.empty() ? "the run did not start from a Hugging Face folder; --dtype to change"
                                            : "the folder the run started from; --dtype to change");
  }
  return zero3::write_hf_folder(reader, out, max_shard_bytes, dtype);
}

}  // namespace

void add_consolidate_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "consolidate", "write a checkpoint's full fp32 weights as a safetensors file, or (--hf) a Hugging Face folder");
  struct Options {
    std::string checkpoint, out;
    bool hf = false;
    std::uint64_t max_shard_bytes = 5'000'000'000ull;
    std::string dtype;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("CKPT", o->checkpoint, "checkpoint folder (with 'latest') or one tag's folder")->required();
  cmd->add_option("OUT", o->out, "output .safetensors file, or with --hf the output folder")->required();
  cmd->add_flag("--hf", o->hf, "write a Hugging Face folder: config.json + model.safetensors (sharded past --max-shard-size)");
  cmd->add_option("--max-shard-size", o->max_shard_bytes, "with --hf: bytes per safetensors shard (default 5e9)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--dtype", o->dtype,
                  "with --hf: the weights' dtype, fp32, bf16 or fp16 (default: the dtype of the Hugging Face folder "
                  "the run started from, else fp32)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  cmd->callback([o, exit_code] {
    Status s;
    if (!o->dtype.empty() && !o->hf) {
      s = Status::invalid_argument(
          fmt::format("--dtype {} applies to --hf exports; the safetensors file without --hf is fp32", o->dtype));
    } else if (o->hf) {
      s = write_hf(o->checkpoint, o->out, o->max_shard_bytes, o->dtype);
    } else {
      s = zero3::consolidate_checkpoint(o->checkpoint, o->out);
    }
    if (!s.is_ok()) {
      std::cerr << "zinf consolidate: " << s.message() << "\n";
      const ErrorCode c = s.code();
      *exit_code = c == ErrorCode::kInvalidArgument || c == ErrorCode::kNotFound || c == ErrorCode::kUnsupported ? 2 : 1;
      return;
    }
    std::cout << "wrote " << o->out << "\n";
    *exit_code = 0;
  });
}

}  // namespace zinf::cli
