// `zinf train`: ZeRO-3 training of a GPT preset, a Hugging Face folder (--model-dir) or a checkpoint's model,
// with state offloaded per ds_config.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <fstream>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "auto_options.h"
#include "common/file_io.h"
#include "commands.h"
#include "default_config.h"
#include "device/device.h"
#include "device_choice.h"
#include "device_traffic.h"
#include "model_options.h"
#include "plan_cli.h"
#include "run_state.h"
#include "zinf/config/ds_config.h"
#include "zinf/log.h"
#include "zinf/model/data.h"
#include "zinf/model/gpt.h"
#include "zinf/model/llama.h"
#include "zinf/zero3/comm.h"
#include "zinf/zero3/comm_mpi.h"
#include "zinf/zero3/comm_nccl.h"
#include "zinf/zero3/checkpoint_keep.h"
#include "zinf/zero3/engine.h"
#include "zinf/zero3/hf_folder.h"
#include "zinf/zero3/plan.h"
#include "zinf/model/registry.h"

namespace zinf::cli {
namespace {

struct TrainOptions {
  std::string config_path;
  ModelOptions model;
  AutoOptions autos;
  std::string data;
  std::string data_format = "auto";  // --data-format: auto | text | llmc | uint16 | uint32
  bool data_format_given = false;    // a resume reads the checkpoint's data with its format unless given
  int steps = kTrainDefaultSteps;
  std::string save_dir;
  int save_interval = 0;
  int save_keep = 0;  // --save-keep: step checkpoints kept in save_dir (0: all)
  std::string resume_dir;
  std::uint64_t seed = 1234;
  bool seed_given = false;          // --seed was on the command line (a resume takes the checkpoint's)
  bool allow_data_change = false;   // resume with another seed, data or batch size than the checkpoint's
  std::string json_log;
  std::string init_from;
  std::string model_dir;            // --model-dir: an HF folder's architecture and weights
  std::string model_config;         // --model-config: an HF config.json's architecture, freshly initialised
  bool model_given = false;         // a --model or dimension option (not --seq) was on the command line
  bool seq_given = false;           // --seq: the training window (a preset's positions too)
  bool activation_checkpointing = false;
  std::string comm = "auto";  // auto | local | mpi | nccl
  int comm_timeout_s = 300;   // the longest any collective waits for the other ranks
  std::string device = "auto";  // cpu | cuda | auto (cuda when the build and the machine have one)
  bool host_device = false;     // --host-device: gathered parameters and gradients on the host device
  std::string device_grad_sums = "auto";  // --device-grad-sums: auto | none | SIZE
  std::string gpu_gather = "auto";  // --gpu-gather: auto | host (the bridge) | device (the engine gathers into GPU memory)
  bool overlap_optimizer = false;  // --overlap-optimizer: sub-groups stepped during the last backward
  bool no_memory_check = false;    // --no-memory-check: start even when the host memory predicted is not there
  std::uint32_t host_device_delay_us = 0;
  bool plan = false;            // --plan: train with `zinf plan`'s winner (printed first)
  std::string host_memory_budget;  // --host-memory-budget: e.g. 6GiB (default: the config's zinf block, else none)
  PlanMachineOptions plan_machine;
};

// Where ranks other than 0 send their progress output.
std::ostream& null_stream() {
  static std::ostream null(nullptr);
  return null;
}

std::uint64_t peak_rss_bytes() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<std::uint64_t>(u.ru_maxrss) * 1024;
}

// Minor page faults of the process so far: fresh memory each step shows up here.
std::uint64_t minor_faults() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<std::uint64_t>(u.ru_minflt);
}

std::string hms(double seconds) {
  const auto s = static_cast<long>(std::max(0.0, seconds));
  return fmt::format("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60);
}

// A temporary folder removed at exit (the built-in config's NVMe swap folder).
struct TempDir {
  std::string path;
  ~TempDir() {
    if (!path.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  }
};

class Progress {
 public:
  Progress(int total, int start, std::int64_t print_every)
      : total_(total), start_(start), every_(std::max<std::int64_t>(1, print_every)), tty_(::isatty(STDOUT_FILENO) != 0),
        t0_(std::chrono::steady_clock::now()) {}

  void update(const zero3::StepReport& r, bool breakdown) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    tokens_ += r.tokens;
    const int done = static_cast<int>(r.step) - start_;
    const double tps = static_cast<double>(tokens_) / std::max(elapsed, 1e-9);
    const double eta = done > 0 ? elapsed / done * (total_ - static_cast<int>(r.step)) : 0.0;
    const int width = 24;
    const int filled = total_ > 0 ? static_cast<int>(width * r.step / total_) : width;
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.append(static_cast<std::size_t>(width - filled), '.');
    std::string line = fmt::format("step {:>5}/{} [{}] loss {:.4f} lr {:.3e} scale {:g} {:.0f} tok/s ETA {}{}",
                                   r.step, total_, bar, r.loss, r.lr, r.loss_scale, tps, hms(eta),
                                   r.skipped ? " (overflow: step skipped)" : "");
    if (breakdown) {
      line += fmt::format(" | fwd {:.3f}s bwd {:.3f}s optim {:.3f}s io-wait {:.3f}s", r.forward_s, r.backward_s,
                          r.optimizer_s, r.io_wait_s) +
              (r.early_subgroups + r.early_rolled_back > 0
                   ? fmt::format(" (hidden {:.3f}s{})", r.optimizer_hidden_s,
                                 r.early_rolled_back > 0 ? ", rolled back" : "")
                   : std::string()) +
              DeviceTraffic::step_line(r);
    }
    if (tty_) {
      std::cout << "\r" << line << "\x1b[K" << std::flush;
      if (r.step == total_) std::cout << "\n";
    } else if (r.step % every_ == 0 || r.step == total_ || done == 1) {
      std::cout << line << "\n" << std::flush;
    }
  }
  double tokens_per_s_last(const zero3::StepReport& r) const { return r.tokens / std::max(r.seconds, 1e-9); }

 private:
  int total_, start_;
  std::int64_t every_;
  bool tty_;
  std::chrono::steady_clock::time_point t0_;
  std::uint64_t tokens_ = 0;
};

// SIGINT/SIGTERM: the first asks the training loop to stop at the next step boundary (it saves
// when --save is given); a second one takes the signal's default action at once. Checkpoints
// are written to a temporary folder and renamed, so neither can leave a damaged `latest`.
std::atomic<int> stop_signal{0};

extern "C" void on_stop_signal(int sig) {
  int expected = 0;
  if (!stop_signal.compare_exchange_strong(expected, sig)) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(sig, &dfl, nullptr);
    ::raise(sig);
    return;
  }
  static const char kNote[] =
      "\nzinf train: stopping at the end of this step (send the signal again to exit at once)\n";
  (void)!::write(STDERR_FILENO, kNote, sizeof(kNote) - 1);
}

// Installs the handlers for the life of the training command; the default ones come back after.
class StopSignals {
 public:
  StopSignals() {
    stop_signal.store(0);
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

// The signal every rank stops for, or 0 to go on. Ranks agree (one all-reduce when there are
// several) so that all of them stop after the same step and save together.
Result<int> agreed_stop_signal(zero3::Communicator& comm) {
  const int mine = stop_signal.load();
  if (comm.world_size() == 1) return mine;
  std::vector<double> seen = {mine == SIGINT ? 1.0 : 0.0, mine == SIGTERM ? 1.0 : 0.0};
  ZINF_RETURN_IF_ERROR(comm.all_reduce_sum(seen));
  return seen[1] > 0 ? SIGTERM : seen[0] > 0 ? SIGINT : 0;
}

// Fail before work: the folders and files a run writes are checked before anything is trained,
// so that a --save that cannot be created does not fail only after the whole run. --resume and --data
// are read, and the NVMe swap folders locked and created, before step 1 as well.
Status check_save_folder(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) {
    const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (::mkdir(dir.c_str(), fileio::kPrivateDirMode) != 0 && errno != EEXIST) {
      return Status::sys_error(fmt::format("--save {}: create the folder", dir), errno);
    }
  }
  if (!std::filesystem::is_directory(dir, ec)) {
    return Status::invalid_argument(fmt::format("--save {}: exists and is not a folder", dir));
  }
  // An unnamed file (O_TMPFILE): nothing is left behind even when the process is killed during
  // the probe (a named one was, and the next run's folder then held a stray temporary).
  {
    fileio::UniqueFd fd(::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600));
    if (fd.get() >= 0) {
      const char byte = 0;
      if (::write(fd.get(), &byte, 1) == 1) return Status::ok();
      return Status::sys_error(fmt::format("--save {}: the folder is not writable", dir), errno);
    }
    // File systems without O_TMPFILE say EOPNOTSUPP (or EISDIR/EINVAL on old kernels): probe with
    // a named file instead. Anything else is the folder's answer.
    if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) {
      return Status::sys_error(fmt::format("--save {}: the folder is not writable", dir), errno);
    }
  }
  // A named probe file, never committed: the AtomicFile removes it again.
  auto probe = fileio::AtomicFile::create(dir + "/.zinf_probe");
  if (!probe.is_ok()) return probe.status().with_context(fmt::format("--save {}: the folder is not writable", dir));
  const char byte = 0;
  return probe.value().append(&byte, 1).with_context(fmt::format("--save {}: the folder is not writable", dir));
}

Status check_json_log(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    // A FIFO or a terminal: opening it here could block; writable is what matters.
    if (::access(path.c_str(), W_OK) != 0) return Status::sys_error("--json-log " + path, errno);
    return Status::ok();
  }
  auto fd = fileio::open_file(path, O_WRONLY | O_APPEND | O_CREAT, 0644, "appending");
  return fd.is_ok() ? Status::ok() : fd.status().with_context("--json-log");
}

// The rank and world size mpirun gave this process (OpenMPI's variables; 0 and 1 without it).
int launcher_env(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : fallback;
}
int launcher_world_size() { return launcher_env("OMPI_COMM_WORLD_SIZE", 1); }
int launcher_rank() { return launcher_env("OMPI_COMM_WORLD_RANK", 0); }

// --comm: auto is MPI under mpirun with more than one rank, else local. NCCL is bootstrapped
// over MPI (local for one rank) and fails with the build's reason when it has no NCCL.
Result<std::unique_ptr<zero3::Communicator>> make_communicator(const TrainOptions& o) {
  const int world = launcher_world_size();
  const std::chrono::seconds timeout(o.comm_timeout_s);
  const std::string kind = o.comm == "auto" ? (world > 1 ? "mpi" : "local") : o.comm;
  if (kind == "local") {
    if (world > 1) {
      // N independent one-rank runs would share one --save folder and log: never what is meant.
      return Status::invalid_argument(fmt::format(
          "runs one rank, but mpirun started {} (OMPI_COMM_WORLD_SIZE); use --comm auto or mpi", world));
    }
    return zero3::make_local_communicator();
  }
  if (kind == "mpi") return zero3::make_mpi_communicator(timeout);
  std::unique_ptr<zero3::Communicator> bootstrap;
  if (world > 1) {
    ZINF_ASSIGN_OR_RETURN(bootstrap, zero3::make_mpi_communicator(timeout));
  } else {
    bootstrap = zero3::make_local_communicator();
  }
  return zero3::make_nccl_communicator(std::move(bootstrap), timeout);
}

// A run that goes past its schedule's total_num_steps keeps the schedule's last learning rate.
void warn_past_schedule(const config::DsConfig& ds, int steps) {
  if (!ds.scheduler) return;
  const std::optional<std::int64_t> total = ds.scheduler->params.integer("total_num_steps");
  if (!total || steps <= *total) return;
  log(LogLevel::kWarning, fmt::format("--steps {} goes past the schedule's end ({} total_num_steps {}): after step "
                                      "{} the learning rate stays at the schedule's last value",
                                      steps, ds.scheduler->type, *total, *total));
}

// The run's data and the seed of its order: the command line's, or on --resume the checkpoint's
// (which refuses a --seed or --data that differs, unless --allow-data-change).
struct RunData {
  model::TokenDataset data;
  DataIdentity id;
  std::uint64_t seed = 0;
  bool changed = false;  // a resume accepted other data than the checkpoint's
};

Result<RunData> load_run_data(const TrainOptions& o, const std::optional<SavedRun>& saved, const ResumeRules& rules) {
  RunData r;
  r.seed = o.seed;
  if (saved) {
    ZINF_ASSIGN_OR_RETURN(r.seed, saved->seed(o.seed_given ? std::optional(o.seed) : std::nullopt, o.seed, rules));
  }
  const std::string path = saved ? saved->data_path(o.data) : o.data;
  ZINF_ASSIGN_OR_RETURN(const model::DataFormat given_format, model::parse_data_format(o.data_format));
  model::DataFormat format = given_format;
  if (saved) {
    ZINF_ASSIGN_OR_RETURN(format, saved->data_format(o.data_format_given ? std::optional(given_format) : std::nullopt));
  }
  if (path.empty()) {
    r.data = model::TokenDataset::load_default();
  } else {
    auto loaded = model::TokenDataset::load(path, format);
    if (!loaded.is_ok()) {
      return loaded.status().with_context(
          o.data.empty() ? fmt::format("--resume {}: the checkpoint's data (give --data if it has moved)", o.resume_dir)
                         : "--data");
    }
    r.data = std::move(loaded).value();
  }
  r.id = identify_data(r.data, path, format);
  if (saved) {
    ZINF_ASSIGN_OR_RETURN(r.changed, saved->check_data(r.id, !o.data.empty(), rules));
  }
  return r;
}

// The model this run trains, made on demand (activation checkpointing is known only once the
// ds_config is read): an HF folder's (--model-dir, whose weights start the run), or on --resume
// with no model option the checkpoint's, or the --model preset with its dimension options.
struct RunModel {
  std::function<Result<std::unique_ptr<model::Model>>(bool activation_checkpointing)> make;
  std::shared_ptr<const zero3::HfFolder> hf;  // --model-dir: the starting weights
  std::string source_dtype;                   // the starting HF folder's dtype (RunState::source_dtype)
  bool window_is_positions = false;           // a new preset: --seq made its positions, the window is all of them
};

// The longest default window for a model whose positions come from elsewhere (an HF folder, a
// checkpoint): fine-tunes run at 512-8192 tokens whatever the model's maximum.
constexpr int kDefaultWindow = 2048;

// The run's window T: --seq, else a resumed run's recorded window, else the model's positions
// capped at kDefaultWindow (said in one line), else (a preset) its positions.
Result<int> training_window(const TrainOptions& o, const std::optional<SavedRun>& saved, const RunModel& run_model,
                            const model::Model& m, std::ostream& out) {
  const int max_positions = m.max_seq();
  // A sliding window (Mistral v0.1) bounds the windows zinf's fully causal attention computes alike.
  const auto* llama = dynamic_cast<const model::LlamaModel*>(&m);
  const int sliding = llama != nullptr ? llama->config().sliding_window : 0;
  if (o.seq_given) {
    const int seq = o.model.seq.value_or(0);
    if (sliding > 0 && seq > sliding && seq <= max_positions) {
      return Status::invalid_argument(fmt::format(
          "--seq {} is above the model's sliding_window ({}): zinf's attention is fully causal, so it trains windows "
          "of at most {} tokens",
          seq, sliding, sliding));
    }
    if (seq < 1 || seq > max_positions) {
      return Status::invalid_argument(fmt::format("--seq {} must be between 1 and the model's max positions ({}{})",
                                                  seq, max_positions,
                                                  run_model.hf ? ", max_position_embeddings in " + run_model.hf->dir() +
                                                                     "/config.json"
                                                               : ""));
    }
    return seq;
  }
  if (saved && saved->seq()) {
    if (*saved->seq() > max_positions) {
      return Status::invalid_argument(fmt::format("--resume: the checkpoint's window {} is above the model's max "
                                                  "positions ({}): give --seq",
                                                  *saved->seq(), max_positions));
    }
    return *saved->seq();
  }
  if (run_model.window_is_positions) return max_positions;
  int window = std::min(max_positions, kDefaultWindow);
  if (sliding > 0) window = std::min(window, sliding);
  out << fmt::format("window: {} tokens per row (--seq; default min(max positions {}{}, {}))\n", window, max_positions,
                     sliding > 0 ? fmt::format(", sliding window {}", sliding) : "", kDefaultWindow);
  return window;
}

Result<RunModel> resolve_run_model(const TrainOptions& o, const model::TokenDataset& data,
                                   const std::optional<SavedRun>& saved) {
  RunModel r;
  if (!o.model_config.empty()) {
    if (o.model_given) {
      return Status::invalid_argument("--model-config takes the model from that config.json: drop --model, --layers, "
                                      "--hidden, --heads and --vocab (--seq sets the training window)");
    }
    if (!o.model_dir.empty()) {
      return Status::invalid_argument("--model-config and --model-dir both give the model: --model-dir starts from "
                                      "the folder's weights, --model-config from a fresh initialisation; use one");
    }
    ZINF_ASSIGN_OR_RETURN(r.make, model_from_config_option(o.model_config));
    return r;
  }
  if (!o.model_dir.empty()) {
    if (o.model_given) {
      return Status::invalid_argument("--model-dir takes the model from the folder's config.json: drop --model, "
                                      "--layers, --hidden, --heads and --vocab (--seq sets the training window)");
    }
    if (!o.init_from.empty()) {
      return Status::invalid_argument("--model-dir and --init-from both give the starting weights: use one");
    }
    auto hf = zero3::HfFolder::open(o.model_dir);
    if (!hf.is_ok()) return hf.status().with_context("--model-dir");
    r.hf = std::make_shared<const zero3::HfFolder>(std::move(hf).value());
    r.source_dtype = r.hf->dtype();
    r.make = [folder = r.hf](bool recompute) { return folder->make_model(recompute); };
    return r;
  }
  if (saved && !o.model_given && !saved->model_json().empty()) {
    const std::string json = saved->model_json(), source = saved->folder() + "/engine.json";
    r.source_dtype = saved->source_dtype();
    r.make = [json, source](bool recompute) -> Result<std::unique_ptr<model::Model>> {
      auto m = model::make_builtin_model(json, source, model::BuiltinOptions{recompute});
      if (!m.is_ok()) return m.status().with_context("--resume (give the model options to resume a model zinf does not build)");
      return m;
    };
    return r;
  }
  if (saved) r.source_dtype = saved->source_dtype();
  auto mc = o.model.resolve(data.vocab_size());
  if (!mc.is_ok()) return mc.status();
  const model::GptConfig gpt = mc.value();
  r.window_is_positions = true;
  r.make = [gpt](bool recompute) -> Result<std::unique_ptr<model::Model>> {
    model::GptConfig c = gpt;
    c.activation_checkpointing = recompute;
    ZINF_ASSIGN_OR_RETURN(std::unique_ptr<model::GptModel> m, model::GptModel::create(c));
    return std::unique_ptr<model::Model>(std::move(m));
  };
  return r;
}


// The share of a step's wall time the GPU's compute stream was not busy.
double gpu_wait_share(double compute_s, double step_s) {
  return step_s > 0 ? std::clamp(1.0 - compute_s / step_s, 0.0, 1.0) : 0.0;
}

// The GPU's step breakdown over a run's steps after its first (the warm-up: allocator misses,
// cuBLASLt heuristics, first touches), printed at the end of a --device cuda run.
struct GpuSteady {
  int steps = 0;
  double step_s = 0;
  std::uint64_t tokens = 0;
  DeviceTimes sum;

  void add(const DeviceTimes& d, const zero3::StepReport& r) {
    ++steps;
    step_s += r.seconds;
    tokens += r.tokens;
    sum.times += d.times;
    sum.flops_per_token = d.flops_per_token;
    sum.flops_formula = d.flops_formula;
  }

  std::string summary() const {
    const double n = steps;
    const device::StepTimes& t = sum.times;
    const double per = step_s / n;
    const double tflops = sum.flops_per_token * static_cast<double>(tokens) / std::max(step_s, 1e-9) / 1e12;
    auto pct = [&](double x) { return 100.0 * x / std::max(step_s, 1e-9); };
    return fmt::format(
        "gpu: {} steps after the first: {:.3f} s/step, {:.0f} tok/s, model {:.2f} TFLOPS ({} flops per token: {})\n"
        "gpu: per step: compute {:.3f} s ({:.1f}%), the GPU waits {:.1f}% of the step; host: uploads (with "
        "--gpu-gather device: bf16 casts enqueued) {:.3f} s ({:.1f}%, {:.2f} GB), gradient downloads {:.3f} s ({:.1f}%, {:.2f} GB), engine gathers {:.3f} s ({:.1f}%), "
        "engine grads_ready {:.3f} s ({:.1f}%), outside the passes (optimizer, clipping) {:.3f} s ({:.1f}%)\n",
        steps, per, static_cast<double>(tokens) / std::max(step_s, 1e-9), tflops, sum.flops_per_token,
        sum.flops_formula, t.gpu_compute_s / n, pct(t.gpu_compute_s), 100.0 * gpu_wait_share(t.gpu_compute_s, step_s),
        t.upload_s / n, pct(t.upload_s), t.upload_bytes / n / 1e9, t.download_s / n, pct(t.download_s),
        t.download_bytes / n / 1e9, t.host_acquire_s / n, pct(t.host_acquire_s), t.host_grads_ready_s / n,
        pct(t.host_grads_ready_s), (step_s - t.pass_s) / n, pct(step_s - t.pass_s));
  }
};

// The most checkpoints this run's saves hold in --save at once beyond what is there now (the
// engine checks their size against the free space before any work): every periodic save and
// the last one, or with --save-keep N the N kept plus the one being written.
std::uint64_t checkpoints_to_write(const TrainOptions& o, const std::optional<SavedRun>& saved) {
  if (o.save_dir.empty()) return 0;
  const std::int64_t start = saved ? zero3::step_of_tag(saved->tag()).value_or(0) : 0;
  std::int64_t saves = 1;  // the last (or a stop signal's)
  if (o.save_interval > 0 && o.steps > start) saves += (o.steps - 1) / o.save_interval - start / o.save_interval;
  if (o.save_keep <= 0) return static_cast<std::uint64_t>(saves);
  const auto there = static_cast<std::int64_t>(zero3::list_step_checkpoints(o.save_dir).size());
  return static_cast<std::uint64_t>(std::min(saves, std::max<std::int64_t>(1, o.save_keep + 1 - there)));
}

// Before any state is allocated: the host memory zinf plan predicts for this run (the engine's own
// layout and sizing) against MemAvailable, and with --device cuda (the engine gathering into GPU
// memory) the GPU memory against the room on the model's GPU. A run that cannot fit even under
// the prediction's stated error (10% for the host, 15% for the GPU: docs/plan.md) is refused with
// the shortfall and what to change, instead of failing for memory minutes into its set-up; one
// that may not fit gets a notice. Skipped with a host memory budget (the engine sizes and checks
// the run against it), with W > 1 (ranks may share a machine's memory or not), and for the GPU
// bridge (--gpu-gather host), whose terms the prediction does not model. Returns the predicted peak
// device memory (0: not predicted), which the end-of-run summary prints beside the measured one.
Result<std::uint64_t> check_memory(const TrainOptions& o, const zero3::EngineOptions& eo, model::Model& m, int T,
                                   const zero3::Communicator& comm, bool cuda) {
  if (o.no_memory_check || comm.world_size() > 1 || eo.host_memory_budget != 0 || eo.ds.zinf.host_memory_budget != 0) {
    return std::uint64_t{0};
  }
  const bool on_gpu = eo.device.kind == zero3::EngineDevice::Kind::kModelDevice;
  if (cuda && !on_gpu) return std::uint64_t{0};
  const int B = static_cast<int>(eo.ds.batch.train_micro_batch_size_per_gpu);
  zero3::GpuRun gpu_run;
  std::string gpu_name;
  if (on_gpu && m.compute_device() != nullptr) {
    device::Device& d = *m.compute_device();
    ZINF_ASSIGN_OR_RETURN(gpu_run.free_bytes, d.memory_room());
    gpu_run.workspace_bytes = m.activation_bytes(B, T);  // a GPU model's device workspace
    gpu_name = d.describe();
  }
  ZINF_ASSIGN_OR_RETURN(const zero3::MemoryPrediction mem,
                        zero3::predict_memory(m, eo.ds, B, T, on_gpu ? zero3::ComputeOn::kGpu : zero3::ComputeOn::kHost,
                                              gpu_run));
  ZINF_ASSIGN_OR_RETURN(const zero3::Machine machine, zero3::describe_machine({}));
  const double need = static_cast<double>(mem.host_bytes());
  const double have = static_cast<double>(machine.host_available);
  if (machine.host_available != 0 && need > have) {
    const std::string what = fmt::format(
        "{}: this run is predicted to need {:.1f} GiB of host memory (largest: {}), and {:.1f} GiB are available ({})",
        eo.ds.source, need / (1 << 30), zero3::largest_terms(mem.host), have / (1 << 30), machine.host_source);
    if (0.9 * need <= have) {
      log(LogLevel::kNotice, what + "; the prediction may be up to 10% high, so it may still fit");
    } else {
      const config::ZeroSection& z = eo.ds.zero;
      std::string change;
      if (z.offload_optimizer.device != config::OffloadDevice::kNvme) change += "offload the optimizer state to NVMe (offload_optimizer.device nvme), ";
      if (z.offload_param.device != config::OffloadDevice::kNvme) change += "offload the parameters to NVMe (offload_param.device nvme), ";
      if (!on_gpu) change += "use a smaller micro-batch or activation checkpointing, ";
      return Status::resource_exhausted(fmt::format(
          "{}: at least {:.1f} GiB short. To fit: {}give a host memory budget (--host-memory-budget) for the engine to "
          "size its buffers to, or let `zinf plan` find a configuration that fits; --no-memory-check starts anyway",
          what, (0.9 * need - have) / (1 << 30), change));
    }
  }
  if (!on_gpu || gpu_name.empty() || gpu_run.free_bytes == UINT64_MAX) return std::uint64_t{0};
  const zero3::GpuFit fit = zero3::check_gpu_fit(mem, eo.ds, gpu_run.free_bytes, gpu_name);
  if (fit.verdict == zero3::GpuFit::Verdict::kDoesNotFit) return Status::resource_exhausted(fit.message);
  if (fit.verdict == zero3::GpuFit::Verdict::kMayNotFit) log(LogLevel::kNotice, fit.message);
  return mem.gpu;
}

// Sends `text` from rank 0 to every rank (its length first).
Status broadcast_text(zero3::Communicator& comm, std::string& text) {
  std::uint64_t size = text.size();
  ZINF_RETURN_IF_ERROR(comm.broadcast(std::as_writable_bytes(std::span(&size, 1)), 0));
  text.resize(size);
  return comm.broadcast(std::as_writable_bytes(std::span(text.data(), text.size())), 0);
}

// zinf train --plan: with W > 1 only rank 0 plans (its probes and its printout) and every rank
// trains rank 0's winner, which the ranks' own probes might not have chosen alike. Each rank's
// temporary NVMe folder (`scratch`, per rank and per machine) takes the place of rank 0's in the
// config. When rank 0's plan fails (nothing fits, or an error), every rank fails.
Result<PlannedRun> plan_on_rank0(zero3::Communicator& comm, const std::function<Result<PlannedRun>()>& plan,
                                 const std::string& scratch) {
  if (comm.world_size() == 1) return plan();
  Result<PlannedRun> planned = Status::internal("not planned on this rank");
  std::string config, rank0_scratch = scratch;
  if (comm.rank() == 0) {
    planned = plan();
    if (planned.is_ok()) config = planned->ds_config;
  }
  ZINF_RETURN_IF_ERROR(broadcast_text(comm, config));
  ZINF_RETURN_IF_ERROR(broadcast_text(comm, rank0_scratch));
  if (comm.rank() == 0) return planned;
  if (config.empty()) return Status::resource_exhausted("--plan: rank 0 gave no configuration to train (its output says why)");
  for (std::size_t at = 0; (at = config.find(rank0_scratch, at)) != std::string::npos; at += scratch.size()) {
    config.replace(at, rank0_scratch.size(), scratch);
  }
  return PlannedRun{config};
}

// Runs the training loop on `comm`, which the caller owns so that it can end the job when this
// fails on one rank. Everything this creates (engine, swap files) is released before it returns.
// `*stopped_by` is the signal that stopped the run early (0 when it ran to --steps).
Status run_train(const TrainOptions& o, zero3::Communicator& comm, int* stopped_by) {
  // The device first: a --device cuda that cannot be honoured fails before any work.
  ZINF_ASSIGN_OR_RETURN(DeviceChoice device,
                        resolve_device(o.device, o.device == "cpu" ? DeviceProbe{} : probe_devices()));
  if (o.save_keep > 0 && o.save_dir.empty()) return Status::invalid_argument("--save-keep needs --save (the folder it keeps checkpoints in)");
  if (!o.save_dir.empty()) ZINF_RETURN_IF_ERROR(check_save_folder(o.save_dir));
  if (!o.json_log.empty() && comm.rank() == 0) ZINF_RETURN_IF_ERROR(check_json_log(o.json_log));
  // A resumed run continues the checkpoint's data order: its seed and data unless told otherwise.
  const ResumeRules rules{o.allow_data_change, comm.rank() == 0};
  std::optional<SavedRun> saved;
  if (!o.resume_dir.empty()) {
    ZINF_ASSIGN_OR_RETURN(saved, SavedRun::read(o.resume_dir));
  }
  // Data first: it decides the vocabulary.
  ZINF_ASSIGN_OR_RETURN(RunData run_data, load_run_data(o, saved, rules));
  model::TokenDataset& data = run_data.data;
  ZINF_ASSIGN_OR_RETURN(RunModel run_model, resolve_run_model(o, data, saved));
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> probe, run_model.make(false));
  ZINF_RETURN_IF_ERROR(data.check_ids_below(static_cast<std::uint32_t>(probe->vocab_size())));
  ZINF_ASSIGN_OR_RETURN(device, fit_device_to_model(std::move(device), probe->type()));

  // Rank 0 speaks for the job; the other ranks log only warnings and errors.
  if (comm.rank() != 0) set_log_level(LogLevel::kWarning);
  std::ostream& out = comm.rank() == 0 ? std::cout : null_stream();
  out << device.line() << "\n";
  ZINF_ASSIGN_OR_RETURN(config::AutoContext ctx,
                        o.autos.context(probe->hidden_size() > 0 ? std::optional<std::int64_t>(probe->hidden_size())
                                                                 : std::nullopt));
  ctx.run_steps = o.steps;  // the schedule's length only where total_num_steps is "auto"
  ctx.world_size = comm.world_size();
  TempDir swap_dir;
  std::optional<PlannedRun> planned;  // --plan: the winner and its prediction
  Result<config::DsConfig> ds = Status::internal("unset");
  if (o.config_path.empty()) {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base != nullptr ? base : "/tmp") + "/zinf_train_nvme.XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) return Status::sys_error("create a temporary NVMe folder " + templ, errno);
    swap_dir.path = templ;
    if (o.plan) {
      // The planner sizes the run at the window it will train (its line, if any, comes later).
      ZINF_ASSIGN_OR_RETURN(const int window, training_window(o, saved, run_model, *probe, null_stream()));
      ZINF_ASSIGN_OR_RETURN(planned, plan_on_rank0(comm, [&] {
                              return plan_for_train(o.plan_machine, ctx, run_model.make, window, templ,
                                                    device.device == ComputeDevice::kCuda, out);
                            }, templ));
      ds = config::parse_ds_config(planned->ds_config, "<plan>", ctx);
    } else {
      ds = config::parse_ds_config(default_ds_config(templ), "<built-in config>", ctx);
      log(LogLevel::kInfo, fmt::format("no --config: built-in ZeRO-3 config with NVMe offload to {}", templ));
    }
  } else {
    ds = config::load_ds_config(o.config_path, ctx);
  }
  if (!ds.is_ok()) return ds.status();
  config::log_resolved_config(ds.value());
  if (comm.rank() == 0) warn_past_schedule(ds.value(), o.steps);

  // The ds_config block, like the flag, turns on block recompute in backward.
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> the_model,
                        run_model.make(o.activation_checkpointing || ds->activation_checkpointing.present));
  // The window from the CPU model (its sliding window), before it is placed on the device.
  ZINF_ASSIGN_OR_RETURN(const int T, training_window(o, saved, run_model, *the_model, out));
  ZINF_ASSIGN_OR_RETURN(the_model, place_model(std::move(the_model), device));
  zero3::EngineOptions eo{ds.value(), o.seed, o.init_from};
  if (o.host_device || o.host_device_delay_us > 0) {
    if (device.device == ComputeDevice::kCuda) {
      return Status::invalid_argument("--host-device runs the CPU model on the host device; use it with --device cpu");
    }
    eo.device.kind = zero3::EngineDevice::Kind::kHostDevice;
    eo.device.seed = o.seed;
    eo.device.max_delay_us = o.host_device_delay_us;
  }
  if (o.gpu_gather != "auto" && device.device != ComputeDevice::kCuda) {
    return Status::invalid_argument(fmt::format("--gpu-gather {} is where a GPU model's parameters are gathered; use it "
                                                "with --device cuda",
                                                o.gpu_gather));
  }
  if (o.gpu_gather == "device" && comm.world_size() > 1 && comm.name() != "nccl") {
    return Status::invalid_argument(fmt::format(
        "--gpu-gather device with {} ranks all-gathers and reduce-scatters in GPU memory, which needs NCCL: add "
        "--comm nccl (this run's communicator is {}), or use --gpu-gather host",
        comm.world_size(), comm.name()));
  }
  // auto: into GPU memory with one rank (the faster path, the same bits) or with NCCL across ranks
  // (its collectives on device memory); through the host bridge with another communicator.
  const bool device_collectives = comm.world_size() == 1 || comm.name() == "nccl";
  if (device.device == ComputeDevice::kCuda &&
      (o.gpu_gather == "device" || (o.gpu_gather == "auto" && device_collectives))) {
    eo.device.kind = zero3::EngineDevice::Kind::kModelDevice;
  }
  if (o.device_grad_sums != "auto" && eo.device.kind == zero3::EngineDevice::Kind::kHostMemory) {
    return Status::invalid_argument(fmt::format(
        "--device-grad-sums {}: gradients are summed on a device only where the engine gathers into device memory "
        "(--device cuda with one rank or --comm nccl, or --host-device); this run gathers into host memory",
        o.device_grad_sums));
  }
  if (o.device_grad_sums == "none" || o.device_grad_sums == "0") {
    eo.device.hold_gradient_bytes = 0;
  } else if (o.device_grad_sums != "auto") {
    ZINF_ASSIGN_OR_RETURN(eo.device.hold_gradient_bytes, parse_bytes("--device-grad-sums", o.device_grad_sums));
  }
  eo.overlap_optimizer = o.overlap_optimizer;
  if (o.host_memory_budget == "none" || o.host_memory_budget == "0") {
    eo.ds.zinf.host_memory_budget = 0;  // not the config's either
  } else if (!o.host_memory_budget.empty()) {
    ZINF_ASSIGN_OR_RETURN(eo.host_memory_budget, parse_bytes("--host-memory-budget", o.host_memory_budget));
  }
  eo.budget_seq = T;
  eo.save_dir = o.save_dir;
  eo.save_copies = checkpoints_to_write(o, saved);
  if (run_model.hf) {
    eo.initial_weights = [hf = run_model.hf](std::size_t index, std::span<float> out) {
      return hf->read_param(index, out).with_context("--model-dir");
    };
  }
  ZINF_ASSIGN_OR_RETURN(const std::uint64_t predicted_device_peak,
                        check_memory(o, eo, *the_model, T, comm, device.device == ComputeDevice::kCuda));
  ZINF_ASSIGN_OR_RETURN(auto engine, zero3::Engine::create(std::move(the_model), eo, comm));
  out << engine->describe() << "\n";
  if (engine->host_budget().budget != 0) out << engine->host_budget().summary << "\n";
  out << fmt::format("data: {} ({} tokens, vocab {})\n", data.source(), data.size(), data.vocab_size());

  const auto& batch = ds->batch;
  const int B = static_cast<int>(batch.train_micro_batch_size_per_gpu);
  const int gas = static_cast<int>(batch.gradient_accumulation_steps);
  // The data order: the seed (the checkpoint's on resume) and the batch geometry.
  const BatchGeometry geometry{B, T, gas, comm.world_size()};
  model::BatchLoaderOptions lo{B, T, comm.rank(), comm.world_size(), run_data.seed, true};
  ZINF_ASSIGN_OR_RETURN(model::BatchLoader loader, model::BatchLoader::create(std::move(data), lo));

  if (saved) {
    ZINF_RETURN_IF_ERROR(saved->check_batch(geometry, rules));
    // The tag SavedRun read; its client state is the one SavedRun holds.
    ZINF_RETURN_IF_ERROR(engine->load_checkpoint(o.resume_dir, saved->tag()).status());
    ZINF_RETURN_IF_ERROR(saved->restore_position(loader, run_data.changed, T, rules));
    const int saved_world = saved->world_size();
    out << fmt::format("resumed from {} at step {}{}\n", o.resume_dir, engine->counters().steps,
                       saved_world != comm.world_size() ? fmt::format(" (saved by {} ranks)", saved_world) : "");
    if (comm.rank() == 0 && engine->counters().steps >= o.steps) {
      log(LogLevel::kWarning, fmt::format("--steps {}: the checkpoint is already at step {}; nothing to train",
                                          o.steps, engine->counters().steps));
    }
  }

  std::ofstream json_log;
  if (!o.json_log.empty() && comm.rank() == 0) {
    json_log.open(o.json_log, std::ios::app);
    if (!json_log) return Status::sys_error("--json-log " + o.json_log, errno);
  }
  auto save = [&](std::int64_t step) -> Status {
    const std::string client =
        run_state_json(RunState{run_data.seed, run_data.id, geometry, loader.position(), run_model.source_dtype});
    ZINF_RETURN_IF_ERROR(engine->save_checkpoint(o.save_dir, zero3::step_tag(step), client));
    out << (::isatty(STDOUT_FILENO) ? "\n" : "") << fmt::format("saved {}/{}\n", o.save_dir, zero3::step_tag(step));
    // --save-keep: the rank that writes `latest` removes the oldest (never the one `latest` names).
    const bool writer = ds->checkpoint.use_node_local_storage ? comm.local_rank() == 0 : comm.rank() == 0;
    if (o.save_keep > 0 && writer) {
      ZINF_ASSIGN_OR_RETURN(const std::vector<std::string> removed,
                            zero3::keep_newest_checkpoints(o.save_dir, static_cast<std::size_t>(o.save_keep)));
      for (const std::string& tag : removed) log(LogLevel::kInfo, fmt::format("--save-keep {}: removed {}/{}", o.save_keep, o.save_dir, tag));
    }
    return Status::ok();
  };

  std::vector<std::vector<std::int32_t>> inputs(static_cast<std::size_t>(gas)), targets(static_cast<std::size_t>(gas));
  std::vector<zero3::MicroBatch> micro(static_cast<std::size_t>(gas));
  DeviceTraffic traffic;
  traffic.set_predicted_peak(predicted_device_peak);
  const auto start_step = static_cast<int>(engine->counters().steps);
  Progress progress(o.steps, start_step, ds->steps_per_print);
  double first_loss = NAN, last_loss = NAN;
  std::vector<double> step_seconds;  // each step's wall time (the --plan line's median)
  std::int64_t saved_step = -1;
  // On the GPU: the model's time breakdown, per step and over the steps after this run's first.
  std::optional<DeviceTimes> gpu_prev = device_times(engine->model(), T);
  GpuSteady gpu_steady;
  std::uint64_t faults_before = minor_faults();
  while (engine->counters().steps < o.steps) {
    ZINF_ASSIGN_OR_RETURN(const int sig, agreed_stop_signal(comm));
    if (sig != 0) {
      const std::int64_t step = engine->counters().steps;
      const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
      std::string did = "nothing saved (no --save)";
      if (!o.save_dir.empty() && step == start_step) {
        did = "nothing saved (no step trained in this run)";
      } else if (!o.save_dir.empty() && saved_step == step) {
        did = fmt::format("already saved {}/global_step{}", o.save_dir, step);
      } else if (!o.save_dir.empty()) {
        ZINF_RETURN_IF_ERROR(save(step));
        did = fmt::format("saved {}/global_step{}", o.save_dir, step);
      }
      out << (::isatty(STDOUT_FILENO) ? "\n" : "")
          << fmt::format("stopped by {} after step {} of {}: {}\n", name, step, o.steps, did);
      if (gpu_steady.steps > 0) out << gpu_steady.summary();
      out << std::flush;
      *stopped_by = sig;
      return Status::ok();
    }
    for (int g = 0; g < gas; ++g) {
      inputs[g].resize(static_cast<std::size_t>(B) * T);
      targets[g].resize(static_cast<std::size_t>(B) * T);
      ZINF_RETURN_IF_ERROR(loader.next(inputs[g], targets[g]));
      micro[g] = zero3::MicroBatch{inputs[g], targets[g], B, T};
    }
    ZINF_ASSIGN_OR_RETURN(zero3::StepReport r, engine->train_step(micro));
    step_seconds.push_back(r.seconds);
    if (std::isnan(first_loss)) first_loss = r.loss;
    last_loss = r.loss;
    if (comm.rank() == 0) progress.update(r, ds->wall_clock_breakdown);
    traffic.add(r);
    std::optional<DeviceTimes> gpu_step;
    if (gpu_prev) {
      const DeviceTimes now = device_times(engine->model(), T).value_or(*gpu_prev);
      gpu_step = now - *gpu_prev;
      gpu_prev = now;
      if (static_cast<int>(r.step) > start_step + 1) gpu_steady.add(*gpu_step, r);
    }
    const std::uint64_t faults_now = minor_faults();
    const std::uint64_t step_faults = faults_now - faults_before;
    faults_before = faults_now;
    if (json_log.is_open()) {
      nlohmann::json line = {{"step", r.step},
                             {"loss", r.loss},
                             {"lr", r.lr},
                             {"loss_scale", r.loss_scale},
                             {"grad_norm", std::isfinite(r.grad_norm) ? nlohmann::json(r.grad_norm) : nlohmann::json()},
                             {"skipped", r.skipped},
                             {"tokens_per_s", progress.tokens_per_s_last(r)},
                             {"peak_rss_bytes", peak_rss_bytes()},
                             {"step_s", r.seconds},
                             {"forward_s", r.forward_s},
                             {"backward_s", r.backward_s},
                             {"optimizer_s", r.optimizer_s},
                             {"setup_s", r.setup_s},
                             {"after_passes_s", r.after_passes_s},
                             {"io_wait_s", r.io_wait_s},
                             {"gather_s", r.gather_s},
                             {"grad_store_s", r.grad_store_s},
                             {"gathered_elements", r.gathered_elements},
                             {"minor_faults", step_faults},
                             {"nvme_bytes", engine->bytes_moved()},
                             {"pinned_bytes", r.pinned_bytes},
                             {"pinned_high_water_bytes", r.pinned_high_water}};
      DeviceTraffic::add_json(line, r);
      if (eo.overlap_optimizer) {
        line["optimizer_hidden_s"] = r.optimizer_hidden_s;
        line["early_subgroups"] = r.early_subgroups;
        line["early_rolled_back"] = r.early_rolled_back;
      }
      if (gpu_step) {
        for (const auto& f : device::kStepTimeSeconds) line[f.json_key] = gpu_step->times.*f.member;
        for (const auto& f : device::kStepTimeCounts) line[f.json_key] = gpu_step->times.*f.member;
        line["gpu_wait_share"] = gpu_wait_share(gpu_step->times.gpu_compute_s, r.seconds);
        line["model_tflops"] = gpu_step->flops_per_token * static_cast<double>(r.tokens) / std::max(r.seconds, 1e-9) / 1e12;
      }
      json_log << line.dump() << "\n" << std::flush;
    }
    if (!o.save_dir.empty() && o.save_interval > 0 && r.step % o.save_interval == 0 && r.step < o.steps) {
      ZINF_RETURN_IF_ERROR(save(r.step));
      saved_step = r.step;
    }
  }
  if (!o.save_dir.empty()) ZINF_RETURN_IF_ERROR(save(engine->counters().steps));
  if (gpu_steady.steps > 0) out << gpu_steady.summary();
  out << traffic.summary();
  if (planned) out << planned_against_measured(*planned, step_seconds, peak_rss_bytes());
  out << fmt::format("done: {} steps, loss {:.4f} -> {:.4f}, peak RSS {:.1f} MiB, NVMe traffic {:.1f} MiB\n",
                           engine->counters().steps, first_loss, last_loss, peak_rss_bytes() / 1048576.0,
                           engine->bytes_moved() / 1048576.0);
  return Status::ok();
}

}  // namespace

void add_train_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("train", "train a model (a GPT preset, --model-dir an HF gpt2/llama folder, or the --resume checkpoint's) with ZeRO-3 (state in memory, CPU or NVMe per ds_config)");
  auto o = std::make_shared<TrainOptions>();
  cmd->add_option("--config", o->config_path, "ds_config.json (default: a built-in ZeRO-3 NVMe-offload config)");
  o->model.add_to(*cmd, "small");
  o->autos.add_to(*cmd);
  cmd->add_option("--data", o->data, "text file, folder, or token file (default: built-in corpus; a resumed run: the checkpoint's)");
  cmd->add_option("--data-format", o->data_format,
                  "how --data files are read: auto (llm.c magic -> llmc, other *.bin -> uint16, else text), text, "
                  "llmc, uint16 or uint32 (raw little-endian ids; a resumed run: the checkpoint's)")
      ->check(CLI::IsMember({"auto", "text", "llmc", "uint16", "uint32"}));
  cmd->add_option("--steps", o->steps, "the optimizer step to reach (default 50); the schedule's length is its total_num_steps")->check(CLI::PositiveNumber);
  cmd->add_option("--save", o->save_dir, "checkpoint folder (saved at the end, and every --save-interval steps)");
  cmd->add_option("--save-interval", o->save_interval, "steps between checkpoints")->check(CLI::NonNegativeNumber);
  cmd->add_option("--save-keep", o->save_keep,
                  "keep only the newest N step checkpoints in --save (older ones are removed after each save; "
                  "never the one 'latest' names); default: keep all")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--resume", o->resume_dir, "continue from the latest checkpoint in this folder");
  cmd->add_option("--seed", o->seed,
                  "seed for initialisation and data order (default 1234; a resumed run takes the checkpoint's)");
  cmd->add_flag("--allow-data-change", o->allow_data_change,
                "resume even with another --seed, --data or batch size than the checkpoint's (warns: the data "
                "order then differs from an uninterrupted run)");
  cmd->add_option("--json-log", o->json_log, "append one JSON object per optimizer step to this file");
  cmd->add_option("--init-from", o->init_from, "start from the weights in this safetensors file");
  cmd->add_option("--model-dir", o->model_dir,
                  "a Hugging Face model folder (config.json + safetensors; model_type gpt2, llama, mistral, qwen2 or "
                  "qwen3): its architecture and weights (--seq: the window, default min(max positions, 2048))");
  cmd->add_option("--model-config", o->model_config,
                  "a Hugging Face config.json, or a folder holding one (model_type gpt2, llama, mistral, qwen2 or "
                  "qwen3): its architecture, trained from zinf's own initialisation (normal(0, 0.02) weights from "
                  "--seed, as transformers' from_config; no weights are read); --seq: the window, default "
                  "min(max positions, 2048)");
  cmd->add_flag("--activation-checkpointing", o->activation_checkpointing, "recompute blocks in backward");
  cmd->add_option("--device", o->device,
                  "where the model computes: auto (cuda when this build has the GPU layer and a CUDA device is "
                  "present, else cpu), cpu, or cuda (the GPT only; the optimizer stays on the CPU)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_flag("--host-device", o->host_device,
                "keep gathered parameters and gradients in the memory of a host device (streams as threads) and move "
                "them through its copy streams: the device-resident engine's orchestration on the CPU, the same "
                "results as without; prints what it moved and how long compute waited");
  cmd->add_option("--gpu-gather", o->gpu_gather,
                  "with --device cuda, where the engine gathers parameters and gradients: device (GPU memory, "
                  "through the copy streams: prefetched along the trace, gradients downloaded while backward goes "
                  "on; with offload none and one rank the whole state stays on the GPU and AdamW runs there; with "
                  "more ranks NCCL all-gathers and reduce-scatters in GPU memory, so --comm nccl), host "
                  "(host memory; the model uploads each module and downloads its gradients, synchronously), or "
                  "auto (device with one rank or --comm nccl, host otherwise; the default)")
      ->check(CLI::IsMember({"auto", "host", "device"}));
  cmd->add_option("--device-grad-sums", o->device_grad_sums,
                  "with gradient_accumulation_steps > 1 and gathers into device memory (--gpu-gather device, "
                  "--host-device), the device memory that may hold gradients summed across a step's micro-batches, "
                  "so that only the step's sums come back: auto (up to 40% of the device memory free at the start; "
                  "the default), none, or a size such as 8G; the same results");
  cmd->add_flag("--no-memory-check", o->no_memory_check,
                "start even when the host memory this run is predicted to need (zinf plan's prediction) is more "
                "than the machine has available; without it such a run is refused before any work");
  cmd->add_flag("--overlap-optimizer", o->overlap_optimizer,
                "step each sub-group's optimizer during the last backward as soon as its gradients are final, and "
                "keep it unless the step clips or overflows (then it is redone at the end): the same results; needs "
                "parameters and optimizer state in memory (offload none or cpu)");
  cmd->add_option("--host-device-delay-us", o->host_device_delay_us,
                  "with --host-device: a random delay up to this many microseconds before each stream item (implies "
                  "--host-device)")
      ->check(CLI::Range(0, 1000000));
  cmd->add_option("--comm", o->comm, "communicator: auto (mpi under mpirun with > 1 rank, else local), local, mpi, nccl")
      ->check(CLI::IsMember({"auto", "local", "mpi", "nccl"}));
  cmd->add_option("--comm-timeout", o->comm_timeout_s,
                  "seconds any collective waits for the other ranks before failing (default 300)")
      ->check(CLI::Range(1, 7 * 24 * 3600));
  cmd->add_flag("--plan", o->plan,
                "plan first (zinf plan: the fastest config that fits this model here), print the plan, and train "
                "with it; NVMe folders from --nvme-path, else a temporary folder");
  o->plan_machine.add_to(*cmd, true);
  cmd->add_option("--host-memory-budget", o->host_memory_budget,
                  "host memory this process may hold, e.g. 6GiB: pinned pools, gathered parameters and buckets are "
                  "sized to fit it, and a budget the run cannot fit is refused before any work (default: the "
                  "config's zinf.host_memory_budget, else none; 'none' or 0: no budget, whatever the config says)");
  cmd->callback([o, exit_code, cmd] {
    if (o->plan && !o->config_path.empty()) {
      std::cerr << "zinf train: --plan writes the config itself: drop --config (or drop --plan)\n";
      *exit_code = 2;
      return;
    }
    o->seed_given = cmd->count("--seed") > 0;
    o->data_format_given = cmd->count("--data-format") > 0;
    o->model_given = false;
    for (const char* opt : {"--model", "--layers", "--hidden", "--heads", "--vocab"}) {
      o->model_given = o->model_given || cmd->count(opt) > 0;
    }
    o->seq_given = cmd->count("--seq") > 0;
    Result<std::unique_ptr<zero3::Communicator>> comm = make_communicator(*o);
    int stopped_by = 0;
    Status s;
    {
      const StopSignals signals;
      s = comm.is_ok() ? run_train(*o, *comm.value(), &stopped_by) : comm.status().with_context("--comm " + o->comm);
    }
    if (s.is_ok()) {
      // Stopped by a signal: the shell's convention, 128 + the signal's number.
      *exit_code = stopped_by != 0 ? 128 + stopped_by : 0;
      return;
    }
    const int world = comm.is_ok() ? comm.value()->world_size() : launcher_world_size();
    const int rank = comm.is_ok() ? comm.value()->rank() : launcher_rank();
    std::cout << std::flush;
    std::cerr << (::isatty(STDOUT_FILENO) ? "\n" : "") << "zinf train: "
              << (world > 1 ? fmt::format("rank {}: ", rank) : "") << s.message() << "\n"
              << std::flush;
    *exit_code = s.code() == ErrorCode::kInvalidArgument || s.code() == ErrorCode::kNotFound ||
                         s.code() == ErrorCode::kUnsupported
                     ? 2
                     : 1;
    // One failed rank ends the job now; the others would otherwise sit in their next collective
    // until --comm-timeout. run_train has already released its engine and swap files.
    if (comm.is_ok() && world > 1) comm.value()->abort(*exit_code);
  });
}

}  // namespace zinf::cli
