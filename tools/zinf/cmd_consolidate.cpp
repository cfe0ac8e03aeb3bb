// `zinf consolidate CKPT OUT`: full fp32 weights from a (sharded) checkpoint, as one safetensors
// file, or with --hf as a Hugging Face folder (config.json + safetensors) transformers loads.
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "zinf/zero3/checkpoint.h"
#include "zinf/zero3/hf_folder.h"

namespace zinf::cli {

void add_consolidate_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "consolidate", "write a checkpoint's full fp32 weights as a safetensors file, or (--hf) a Hugging Face folder");
  struct Options {
    std::string checkpoint, out;
    bool hf = false;
    std::uint64_t max_shard_bytes = 5'000'000'000ull;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("CKPT", o->checkpoint, "checkpoint folder (with 'latest') or one tag's folder")->required();
  cmd->add_option("OUT", o->out, "output .safetensors file, or with --hf the output folder")->required();
  cmd->add_flag("--hf", o->hf, "write a Hugging Face folder: config.json + model.safetensors (sharded past --max-shard-size)");
  cmd->add_option("--max-shard-size", o->max_shard_bytes, "with --hf: bytes per safetensors shard (default 5e9)")
      ->check(CLI::PositiveNumber);
  cmd->callback([o, exit_code] {
    Status s;
    if (o->hf) {
      auto reader = zero3::CheckpointReader::open(o->checkpoint);
      s = reader.is_ok() ? zero3::write_hf_folder(reader.value(), o->out, o->max_shard_bytes) : reader.status();
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
