// `zinf eval (--resume CKPT | --model-dir DIR)`: the mean next-token loss of a model over the first
// N*B windows of a token file, in order, with every parameter in memory (no engine, no offload).
#include <algorithm>
#include <climits>
#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "device_choice.h"
#include "zinf/model/data.h"
#include "zinf/model/llama.h"
#include "zinf/model/local_params.h"
#include "zinf/model/registry.h"
#include "zinf/zero3/checkpoint.h"
#include "zinf/zero3/hf_folder.h"

namespace zinf::cli {
namespace {

struct EvalOptions {
  std::string resume;
  std::string model_dir;
  std::string data;
  std::string data_format = "auto";
  int batch = 8;
  int seq = 0;      // 0: the checkpoint's training window, else min(max positions, 2048)
  int batches = 0;  // 0: every whole batch the data holds
  bool json = false;
  std::string device = "auto";  // cpu | cuda | auto, as zinf train
};

struct EvalResult {
  double loss = 0;
  std::uint64_t tokens = 0;
  int batches = 0, batch = 0, seq = 0;
  std::string model, checkpoint, data, device;
};

// The checkpoint's model with its saved weights, in memory.
struct LoadedModel {
  std::unique_ptr<model::Model> model;
  model::LocalParams params;
  int trained_seq = 0;  // the window the checkpoint was trained at (zinf train records it), or 0
};

// The "seq" a zinf train checkpoint's client_state records, or 0.
int recorded_seq(const std::string& client_state) {
  const auto j = nlohmann::json::parse(client_state, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return 0;
  const auto it = j.find("seq");
  return it != j.end() && it->is_number_integer() && it->get<std::int64_t>() > 0 && it->get<std::int64_t>() <= INT32_MAX
             ? static_cast<int>(it->get<std::int64_t>())
             : 0;
}

Result<LoadedModel> load_checkpoint_model(const std::string& checkpoint) {
  ZINF_ASSIGN_OR_RETURN(zero3::CheckpointReader reader, zero3::CheckpointReader::open(checkpoint));
  const std::string source = reader.folder() + "/engine.json";
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> m, model::make_builtin_model(reader.model_config_json(), source));
  const auto params = m->params();
  if (params.size() != reader.params().size()) {
    return Status::corruption(fmt::format("{}: {} parameters saved, the model it names has {}", source,
                                          reader.params().size(), params.size()));
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].name != reader.params()[i].name || params[i].shape != reader.params()[i].shape) {
      return Status::corruption(fmt::format("{}: saved parameter {} is '{}', the model it names has '{}' there",
                                            source, i, reader.params()[i].name, params[i].name));
    }
  }
  ZINF_ASSIGN_OR_RETURN(model::LocalParams lp, model::LocalParams::create(params, m->modules()));
  for (std::size_t i = 0; i < params.size(); ++i) {
    ZINF_RETURN_IF_ERROR(reader.read_param(i, lp.param(static_cast<int>(i))));
  }
  return LoadedModel{std::move(m), std::move(lp), recorded_seq(reader.client_state())};
}

// An HF folder's model with its weights, in memory.
Result<LoadedModel> load_hf_model(const std::string& dir) {
  ZINF_ASSIGN_OR_RETURN(zero3::HfFolder hf, zero3::HfFolder::open(dir));
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> m, hf.make_model());
  ZINF_ASSIGN_OR_RETURN(model::LocalParams lp, model::LocalParams::create(m->params(), m->modules()));
  for (std::size_t i = 0; i < m->params().size(); ++i) {
    ZINF_RETURN_IF_ERROR(hf.read_param(i, lp.param(static_cast<int>(i))));
  }
  return LoadedModel{std::move(m), std::move(lp)};
}

Result<EvalResult> run_eval(const EvalOptions& o) {
  if (o.resume.empty() == o.model_dir.empty()) {
    return Status::invalid_argument("give one of --resume CKPT and --model-dir DIR");
  }
  ZINF_ASSIGN_OR_RETURN(DeviceChoice device,
                        resolve_device(o.device, o.device == "cpu" ? DeviceProbe{} : probe_devices()));
  auto made = o.resume.empty() ? load_hf_model(o.model_dir) : load_checkpoint_model(o.resume);
  if (!made.is_ok()) return made.status().with_context(o.resume.empty() ? "--model-dir" : "--resume");
  LoadedModel loaded = std::move(made).value();
  ZINF_ASSIGN_OR_RETURN(device, fit_device_to_model(std::move(device), loaded.model->type()));
  // A sliding window (Mistral v0.1) from the CPU model, before it is placed on the device.
  const auto* cpu_llama = dynamic_cast<const model::LlamaModel*>(loaded.model.get());
  const int sliding_window = cpu_llama != nullptr ? cpu_llama->config().sliding_window : 0;
  ZINF_ASSIGN_OR_RETURN(loaded.model, place_model(std::move(loaded.model), device));
  model::Model& m = *loaded.model;
  ZINF_ASSIGN_OR_RETURN(const model::DataFormat format, model::parse_data_format(o.data_format));
  model::TokenDataset data = model::TokenDataset::load_default();
  if (!o.data.empty()) {
    auto d = model::TokenDataset::load(o.data, format);
    if (!d.is_ok()) return d.status().with_context("--data");
    data = std::move(d).value();
  }
  // Default: the trained window, else min(max positions, a sliding window, 2048) as zinf train's.
  int fallback = std::min(m.max_seq(), 2048);
  if (sliding_window > 0) fallback = std::min(fallback, sliding_window);
  const int T = o.seq > 0 ? o.seq : loaded.trained_seq > 0 ? loaded.trained_seq : fallback;
  if (T > m.max_seq()) {
    return Status::invalid_argument(fmt::format("--seq {} is longer than the model's max positions {}", T, m.max_seq()));
  }
  const std::uint64_t windows = data.size() > 0 ? (data.size() - 1) / static_cast<std::uint64_t>(T) : 0;
  const std::uint64_t whole_batches = windows / static_cast<std::uint64_t>(o.batch);
  const int N = o.batches > 0 ? o.batches : static_cast<int>(std::min<std::uint64_t>(whole_batches, INT32_MAX));
  if (N < 1 || static_cast<std::uint64_t>(N) > whole_batches) {
    return Status::invalid_argument(fmt::format(
        "--batches {} x --batch {} windows of {} tokens need {} tokens; {} has {} (room for {} batch{})", N, o.batch,
        T + 1, static_cast<std::uint64_t>(N) * static_cast<std::uint64_t>(o.batch) * static_cast<std::uint64_t>(T) + 1,
        data.source(), data.size(), whole_batches, whole_batches == 1 ? "" : "es"));
  }
  // Every token the windows read must be one the model knows: say which one is not.
  const std::uint64_t used = static_cast<std::uint64_t>(N) * static_cast<std::uint64_t>(o.batch) * T + 1;
  ZINF_RETURN_IF_ERROR(data.check_ids_below(static_cast<std::uint32_t>(m.vocab_size()), used).with_context("--data"));
  ZINF_ASSIGN_OR_RETURN(model::BatchLoader loader, model::BatchLoader::create(data, {o.batch, T, 0, 1, 0, false}));
  std::vector<std::int32_t> in(static_cast<std::size_t>(o.batch) * T), tg(in.size());
  double sum = 0;
  for (int b = 0; b < N; ++b) {
    ZINF_RETURN_IF_ERROR(loader.next(in, tg));
    auto loss = m.forward_loss(in, tg, o.batch, T, loaded.params);
    if (!loss.is_ok()) return loss.status().with_context(fmt::format("batch {}", b));
    sum += loss.value();
  }
  EvalResult r;
  r.loss = sum / N;  // every batch has B*T positions: the mean over all of them
  r.tokens = static_cast<std::uint64_t>(N) * static_cast<std::uint64_t>(o.batch) * static_cast<std::uint64_t>(T);
  r.batches = N;
  r.batch = o.batch;
  r.seq = T;
  r.model = m.describe();
  r.checkpoint = o.resume.empty() ? o.model_dir : o.resume;
  r.data = data.source();
  r.device = device.describe();
  return r;
}

}  // namespace

void add_eval_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "eval", "mean next-token loss of a checkpoint's model over the first windows of a token file, in order");
  auto o = std::make_shared<EvalOptions>();
  cmd->add_option("--resume", o->resume, "checkpoint folder (with 'latest') or one tag's folder");
  cmd->add_option("--model-dir", o->model_dir,
                  "a Hugging Face model folder (config.json + safetensors; model_type gpt2, llama, mistral, qwen2 or qwen3)");
  cmd->add_option("--data", o->data, "text file, folder, or token file (default: built-in corpus)");
  cmd->add_option("--data-format", o->data_format,
                  "how --data files are read: auto (llm.c magic -> llmc, other *.bin -> uint16, else text), text, "
                  "llmc, uint16 or uint32 (raw little-endian ids)")
      ->check(CLI::IsMember({"auto", "text", "llmc", "uint16", "uint32"}));
  cmd->add_option("--batch", o->batch, "windows per forward pass (B)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--seq", o->seq,
                  "tokens per window (T; default: the window the checkpoint was trained at, else min(the model's max "
                  "positions, 2048))")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--batches", o->batches, "forward passes (N; default: every whole batch in the data)")
      ->check(CLI::Range(1, INT32_MAX));
  cmd->add_flag("--json", o->json, "print one JSON object instead of a line");
  cmd->add_option("--device", o->device, "where the model computes: auto (cuda when present), cpu, or cuda (the GPT only)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->callback([o, exit_code] {
    auto r = run_eval(*o);
    if (!r.is_ok()) {
      std::cerr << "zinf eval: " << r.status().message() << "\n";
      const ErrorCode c = r.status().code();
      *exit_code = c == ErrorCode::kInvalidArgument || c == ErrorCode::kNotFound || c == ErrorCode::kUnsupported ? 2 : 1;
      return;
    }
    if (o->json) {
      const nlohmann::json j = {{"loss", r->loss},       {"tokens", r->tokens},         {"batches", r->batches},
                                {"batch", r->batch},     {"seq", r->seq},               {"model", r->model},
                                {o->resume.empty() ? "model_dir" : "checkpoint", r->checkpoint}, {"data", r->data},
                                {"device", r->device}};
      std::cout << j.dump() << "\n";
    } else {
      std::cout << fmt::format("eval: loss {:.6f} (perplexity {:.3f}) over {} tokens: {} batches of {} x {} from {}\n"
                               "model: {} ({})\ndevice: {}\n",
                               r->loss, std::exp(r->loss), r->tokens, r->batches, r->batch, r->seq, r->data, r->model,
                               r->checkpoint, r->device);
    }
    *exit_code = 0;
  });
}

}  // namespace zinf::cli
