// Training throughput with parameters and optimizer state on NVMe against everything in memory.
//
// Builds two engines on the same model, data and config, differing only in the offload
// devices (none/none vs nvme/nvme, pipelined), and runs their steps interleaved (A B, B A, ...)
// so both see the same machine. Medians of tokens/s over the timed steps (the first step of
// each, which records the trace and creates state, is not timed) give the last line:
//   nvme_tokens_per_s=X memory_tokens_per_s=Y ratio=X/Y nvme_bytes_per_step=B
// Not a test: these machines are shared and noisy; the ratio is what carries information.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "zinf/config/ds_config.h"
#include "zinf/model/data.h"
#include "zinf/model/gpt.h"
#include "zinf/zero3/engine.h"

namespace {

using namespace zinf;

std::string config_for(bool nvme, const std::string& path, int micro_batch, long sub_group) {
  const std::string param = nvme ? fmt::format(R"({{"device": "nvme", "nvme_path": "{}", "buffer_count": 5,
      "buffer_size": 20000000, "max_in_cpu": 0}})", path) : R"({"device": "none"})";
  const std::string optim = nvme ? fmt::format(R"({{"device": "nvme", "nvme_path": "{}",
      "pipeline_read": true, "pipeline_write": true}})", path) : R"({"device": "none"})";
  return fmt::format(R"({{
    "train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
    "bf16": {{"enabled": true}},
    "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3, "weight_decay": 0.01}}}},
    "zero_optimization": {{"stage": 3, "sub_group_size": {}, "offload_param": {}, "offload_optimizer": {}}},
    "aio": {{"block_size": 1048576, "queue_depth": 16, "intra_op_parallelism": 1}}
  }})",
                     micro_batch, sub_group, param, optim);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"train_bench: tokens/s with state on NVMe vs in memory, same model and config"};
  std::string preset = "small", dir;
  int steps = 6, micro_batch = 4, seq = 0;
  long sub_group = 4000000;
  app.add_option("--model", preset, "model preset");
  app.add_option("--steps", steps, "timed steps per engine")->check(CLI::PositiveNumber);
  app.add_option("--micro-batch", micro_batch, "micro-batch size")->check(CLI::PositiveNumber);
  app.add_option("--seq", seq, "sequence length (default: the preset's)");
  app.add_option("--sub-group-size", sub_group, "sub_group_size elements");
  app.add_option("--nvme-path", dir, "folder for swap files (default: a temporary folder)");
  CLI11_PARSE(app, argc, argv);
  bool made = false;
  if (dir.empty()) {
    std::string templ = "/tmp/zinf_train_bench.XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) return 1;
    dir = templ;
    made = true;
  }
  auto fail = [&](const Status& s) {
    std::fprintf(stderr, "train_bench: %s\n", s.to_string().c_str());
    if (made) std::filesystem::remove_all(dir);
    return 1;
  };
  auto cfg = model::gpt_preset(preset, 256);
  if (!cfg.is_ok()) return fail(cfg.status());
  if (seq > 0) cfg->max_seq = seq;
  const int B = micro_batch, T = cfg->max_seq;
  auto comm = zero3::make_local_communicator();
  std::vector<std::unique_ptr<zero3::Engine>> engines;
  for (bool nvme : {false, true}) {
    auto ds = config::parse_ds_config(config_for(nvme, dir, micro_batch, sub_group), "train_bench", config::AutoContext{});
    if (!ds.is_ok()) return fail(ds.status());
    auto gpt = model::GptModel::create(cfg.value());
    if (!gpt.is_ok()) return fail(gpt.status());
    auto e = zero3::Engine::create(std::move(gpt).value(), zero3::EngineOptions{ds.value(), 1, ""}, *comm);
    if (!e.is_ok()) return fail(e.status());
    std::printf("%s\n", (*e)->describe().c_str());
    engines.push_back(std::move(e).value());
  }
  model::TokenDataset data = model::TokenDataset::load_default();
  auto loader = model::BatchLoader::create(std::move(data), {B, T, 0, 1, 1, true});
  if (!loader.is_ok()) return fail(loader.status());
  std::vector<std::int32_t> in(static_cast<std::size_t>(B) * T), tg(in.size());
  std::vector<double> tps[2];
  std::uint64_t nvme_bytes_before = 0, nvme_bytes_timed = 0;
  for (int round = 0; round <= steps; ++round) {
    Status s = loader->next(in, tg);
    if (!s.is_ok()) return fail(s);
    const zero3::MicroBatch mb{in, tg, B, T};
    for (int k = 0; k < 2; ++k) {
      const int which = (round % 2 == 0) ? k : 1 - k;  // alternate which engine goes first
      if (which == 1) nvme_bytes_before = engines[1]->bytes_moved();
      auto r = engines[static_cast<std::size_t>(which)]->train_step(std::span<const zero3::MicroBatch>(&mb, 1));
      if (!r.is_ok()) return fail(r.status());
      if (round == 0) continue;  // trace recording and state creation
      tps[which].push_back(static_cast<double>(r->tokens) / r->seconds);
      if (which == 1) nvme_bytes_timed += engines[1]->bytes_moved() - nvme_bytes_before;
      std::printf("round %d %-6s loss %.4f step %.3fs (fwd %.3f bwd %.3f optim %.3f io-wait %.3f) %.0f tok/s\n", round,
                  which == 1 ? "nvme" : "memory", r->loss, r->seconds, r->forward_s, r->backward_s, r->optimizer_s,
                  r->io_wait_s, tps[which].back());
    }
  }
  const double mem = median(tps[0]), nvme = median(tps[1]);
  std::printf("nvme_tokens_per_s=%.1f memory_tokens_per_s=%.1f ratio=%.3f nvme_bytes_per_step=%llu\n", nvme, mem,
              mem > 0 ? nvme / mem : 0.0, static_cast<unsigned long long>(nvme_bytes_timed / std::max(1, steps)));
  if (made) std::filesystem::remove_all(dir);
  return 0;
}
