// Helpers shared by the config tests.
#include "test_util.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

namespace zinf::config::testing {

std::string data_path(std::string_view name) {
  return std::string(ZINF_CONFIG_TEST_DATA) + "/" + std::string(name);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

Result<DsConfig> parse(std::string_view text, const AutoContext& ctx) {
  return parse_ds_config(text, "ds_config.json", ctx);
}

std::string error_of(std::string_view text, const AutoContext& ctx) {
  Result<DsConfig> r = parse(text, ctx);
  if (r.is_ok()) {
    ADD_FAILURE() << "expected an error, but this parsed:\n" << text;
    return "";
  }
  return r.status().message();
}

AutoContext model_context() {
  AutoContext ctx;
  ctx.hidden_size = 1024;
  return ctx;
}

AutoContext trainer_context() {
  AutoContext ctx;
  ctx.world_size = 2;
  ctx.hidden_size = 1024;
  ctx.micro_batch = 8;
  ctx.grad_accum = 1;
  ctx.lr = 5e-5;
  ctx.betas = std::array<double, 2>{0.9, 0.999};
  ctx.eps = 1e-8;
  ctx.weight_decay = 0.0;
  ctx.warmup_steps = 0;
  ctx.total_steps = 1000;
  ctx.gradient_clipping = 1.0;
  ctx.precision = Precision::kFp16;
  return ctx;
}

std::string replace_all(std::string text, std::string_view from, std::string_view to) {
  std::size_t pos = 0;
  while ((pos = text.find(from, pos)) != std::string::npos) {
    text.replace(pos, from.size(), to);
    pos += to.size();
  }
  return text;
}

}  // namespace zinf::config::testing
