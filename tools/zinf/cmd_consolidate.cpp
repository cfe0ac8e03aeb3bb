// `zinf consolidate CKPT OUT.safetensors`: full fp32 weights from a (sharded) checkpoint.
#include <iostream>
#include <memory>

#include "commands.h"
#include "zinf/zero3/checkpoint.h"

namespace zinf::cli {

void add_consolidate_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("consolidate", "write a checkpoint's full fp32 weights as a safetensors file");
  auto paths = std::make_shared<std::pair<std::string, std::string>>();
  cmd->add_option("CKPT", paths->first, "checkpoint folder (with 'latest') or one tag's folder")->required();
  cmd->add_option("OUT", paths->second, "output .safetensors file")->required();
  cmd->callback([paths, exit_code] {
    Status s = zero3::consolidate_checkpoint(paths->first, paths->second);
    if (!s.is_ok()) {
      std::cerr << "zinf consolidate: " << s.message() << "\n";
      *exit_code = s.code() == ErrorCode::kInvalidArgument || s.code() == ErrorCode::kNotFound ? 2 : 1;
      return;
    }
    std::cout << "wrote " << paths->second << "\n";
    *exit_code = 0;
  });
}

}  // namespace zinf::cli
