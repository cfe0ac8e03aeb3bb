// A program outside the zinf tree that brings its own model: it defines TokenMlp (token_mlp.h)
// and trains it through the installed libzinf with ZeRO-3, parameters and optimizer state
// offloaded to NVMe swap files, then saves a checkpoint and consolidates it into a safetensors
// file without any help from the model's code.
//
// Usage: mlp_example SWAP_DIR [STEPS]. Exit status 0 when training lowered the loss.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <zinf/config/ds_config.h>
#include <zinf/model/data.h>
#include <zinf/status.h>
#include <zinf/zero3/checkpoint.h>
#include <zinf/zero3/comm.h>
#include <zinf/zero3/engine.h>

#include "token_mlp.h"

namespace {

// A ds_config.json as a DeepSpeed user writes it: ZeRO-3, bf16, parameters and optimizer on NVMe.
std::string ds_config_text(const std::string& nvme, int micro_batch) {
  return R"({
    "train_micro_batch_size_per_gpu": )" + std::to_string(micro_batch) + R"(,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0}},
    "zero_optimization": {
      "stage": 3,
      "sub_group_size": 20000,
      "offload_param": {"device": "nvme", "nvme_path": ")" + nvme + R"(", "buffer_count": 4, "buffer_size": 65536},
      "offload_optimizer": {"device": "nvme", "nvme_path": ")" + nvme + R"("}
    },
    "aio": {"block_size": 65536, "queue_depth": 8}
  })";
}

int fail(const zinf::Status& s) {
  std::fprintf(stderr, "mlp_example: %s\n", s.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: mlp_example SWAP_DIR [STEPS]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int steps = argc > 2 ? std::atoi(argv[2]) : 40;
  const int B = 8, T = 32;

  auto ds = zinf::config::parse_ds_config(ds_config_text(dir, B), "mlp_example config", zinf::config::AutoContext{});
  if (!ds.is_ok()) return fail(ds.status());
  auto model = example::TokenMlp::create(example::TokenMlpConfig{});
  if (!model.is_ok()) return fail(model.status());
  auto comm = zinf::zero3::make_local_communicator();
  auto engine = zinf::zero3::Engine::create(std::move(model).value(), zinf::zero3::EngineOptions{ds.value(), 42, ""},
                                            *comm);
  if (!engine.is_ok()) return fail(engine.status());
  std::printf("%s\n", (*engine)->describe().c_str());

  auto loader = zinf::model::BatchLoader::create(zinf::model::TokenDataset::load_default(), {B, T, 0, 1, 42, true});
  if (!loader.is_ok()) return fail(loader.status());
  std::vector<int32_t> in(static_cast<std::size_t>(B) * T), tg(in.size());
  double first = 0, last = 0;
  const int window = std::max(1, steps / 8);  // single-batch losses are noisy: average each end
  for (int step = 0; step < steps; ++step) {
    zinf::Status s = loader->next(in, tg);
    if (!s.is_ok()) return fail(s);
    const zinf::zero3::MicroBatch mb{in, tg, B, T};
    auto r = (*engine)->train_step(std::span<const zinf::zero3::MicroBatch>(&mb, 1));
    if (!r.is_ok()) return fail(r.status());
    if (step < window) first += r->loss / window;
    if (step >= steps - window) last += r->loss / window;
  }
  std::printf("mlp_example: %d steps with parameters and optimizer state on NVMe (%s): loss %.4f -> %.4f, "
              "%.1f MiB of NVMe traffic\n",
              steps, dir.c_str(), first, last, (*engine)->bytes_moved() / 1048576.0);

  const std::string ckpt = dir + "/ckpt";
  zinf::Status s = (*engine)->save_checkpoint(ckpt, "final", "{}");
  if (s.is_ok()) s = zinf::zero3::consolidate_checkpoint(ckpt, dir + "/token_mlp.safetensors");
  if (!s.is_ok()) return fail(s);
  std::printf("mlp_example: checkpoint %s consolidated into %s/token_mlp.safetensors\n", ckpt.c_str(), dir.c_str());
  if (!(last < first - 0.3)) {
    std::fprintf(stderr, "mlp_example: the loss did not fall (%.4f -> %.4f)\n", first, last);
    return 1;
  }
  return 0;
}
