// The fault matrix: ENOSPC, EIO, short transfers, EINTR, EAGAIN and zero-byte transfers injected
// at seeded points of a checkpoint save, a checkpoint load and an NVMe-offloaded training step.
// After each: an error is reported or the fault was absorbed; the latest checkpoint loads and
// training resumes bit-identically to a run that saw no fault; nothing reported as a success
// computed with wrong data; no temporary file is left behind. Prints one table row per cell
// (the table in docs/reliability.md).
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/file_io.h"
#include "temp_dir.h"
#include "zinf/aio/fault.h"
#include "zinf/config/ds_config.h"
#include "zinf/model/gpt.h"
#include "zinf/zero3/checkpoint.h"
#include "zinf/zero3/engine.h"

namespace zinf::zero3 {
namespace {

using testing::TempDir;

constexpr int kSteps = 8;         // the reference run's length
constexpr int kFirstSave = 3;     // a clean checkpoint every case starts from
constexpr int kSecondSave = 5;    // the save (or the steps before it) that a fault hits
constexpr int kPointsPerCell = 5;  // seeded injection points per (fault, operation)

std::string config_text(const std::string& nvme) {
  return fmt::format(R"({{
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {{"enabled": true}},
    "optimizer": {{"type": "AdamW", "params": {{"lr": 3e-3, "weight_decay": 0.01}}}},
    "zero_optimization": {{"stage": 3, "sub_group_size": 3000, "stage3_param_persistence_threshold": 64,
      "offload_param": {{"device": "nvme", "nvme_path": "{0}", "buffer_count": 3, "buffer_size": 4096, "max_in_cpu": 0}},
      "offload_optimizer": {{"device": "nvme", "nvme_path": "{0}"}}}},
    "aio": {{"block_size": 8192, "queue_depth": 4}}
  }})", nvme);
}

// A tiny GPT trained with both tiers on NVMe; the batches depend only on the step number.
class Training {
 public:
  explicit Training(std::shared_ptr<aio::FaultInjector> faults = nullptr) {
    auto ds = config::parse_ds_config(config_text(nvme_.path()), "fault_matrix", config::AutoContext{});
    status_ = ds.status();
    if (!ds.is_ok()) return;
    model::GptConfig c;
    c.vocab_size = 64;
    c.max_seq = 16;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 32;
    comm_ = make_local_communicator();
    EngineOptions eo{ds.value(), 7, ""};
    eo.aio_faults = std::move(faults);
    auto engine = Engine::create(std::move(model::GptModel::create(c)).value(), eo, *comm_);
    status_ = engine.status();
    if (engine.is_ok()) engine_ = std::move(engine).value();
  }
  const Status& status() const { return status_; }
  Engine& engine() { return *engine_; }

  // Steps [from, to); each loss is appended to `losses`.
  Status steps(int from, int to, std::vector<float>* losses) {
    constexpr int B = 2, T = 16;
    for (int step = from; step < to; ++step) {
      std::vector<std::int32_t> in(B * T), tg(B * T);
      for (int i = 0; i < B * T; ++i) {
        in[i] = (step * 13 + i * 7) % 64;
        tg[i] = (step * 5 + i * 3 + 1) % 64;
      }
      const MicroBatch micro{in, tg, B, T};
      auto r = engine_->train_step(std::span<const MicroBatch>(&micro, 1));
      if (!r.is_ok()) return r.status();
      losses->push_back(static_cast<float>(r->loss));
    }
    return Status::ok();
  }

 private:
  TempDir nvme_;
  Status status_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Engine> engine_;
};

std::vector<float> reference_losses() {
  Training run;
  EXPECT_TRUE(run.status().is_ok()) << run.status().to_string();
  std::vector<float> losses;
  const Status st = run.steps(0, kSteps, &losses);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return losses;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

enum class Fault { kEnospc, kEio, kShort, kEintr, kEagain, kZero };
const char* fault_name(Fault f) {
  switch (f) {
    case Fault::kEnospc: return "ENOSPC";
    case Fault::kEio: return "EIO";
    case Fault::kShort: return "short transfer";
    case Fault::kEintr: return "EINTR";
    case Fault::kEagain: return "EAGAIN";
    case Fault::kZero: return "zero-byte transfer";
  }
  return "?";
}
// Faults the I/O layers must absorb (retry, continue); the others must be reported.
bool absorbed(Fault f, bool aio) {
  return f == Fault::kShort || f == Fault::kEintr || f == Fault::kEagain || (aio && f == Fault::kZero);
}

// Installs a toolkit fault hook on the files under `scope` for the life of the object. The
// hook counts the system calls there and injects `fault` at call `target`; a fault the toolkit
// must absorb is repeated every third call after that, five times in all.
class ToolkitFaults {
 public:
  ToolkitFaults(std::string scope, Fault fault, long target) : scope_(std::move(scope)), fault_(fault), target_(target) {
    fileio::set_fault_hook([this](const fileio::FaultSite& site) { return decide(site); });
  }
  ~ToolkitFaults() { fileio::set_fault_hook({}); }
  ToolkitFaults(const ToolkitFaults&) = delete;
  ToolkitFaults& operator=(const ToolkitFaults&) = delete;
  long calls() const { return calls_; }
  long injected() const { return injected_; }

 private:
  fileio::InjectedFault decide(const fileio::FaultSite& site) {
    std::lock_guard lock(mutex_);
    if (site.path.find(scope_) == std::string::npos) return {};
    // fsync, rename and mkdir return neither EAGAIN, a short count nor 0: those faults count
    // only transfers.
    const bool plain = site.op == "fsync" || site.op == "rename" || site.op == "mkdir";
    if (plain && (fault_ == Fault::kEagain || fault_ == Fault::kShort || fault_ == Fault::kZero)) return {};
    const long index = calls_++;
    const bool repeat = absorbed(fault_, false);
    const long since = index - target_;
    if (target_ < 0 || since < 0 || (repeat ? since % 3 != 0 || since / 3 >= 5 : since != 0)) return {};
    fileio::InjectedFault f;
    switch (fault_) {
      case Fault::kEnospc: f = {fileio::FaultKind::kErrno, ENOSPC}; break;
      case Fault::kEio: f = {fileio::FaultKind::kErrno, EIO}; break;
      case Fault::kEintr: f = {fileio::FaultKind::kErrno, EINTR}; break;
      case Fault::kEagain: f = {fileio::FaultKind::kErrno, EAGAIN}; break;
      case Fault::kShort: f = {fileio::FaultKind::kShort, 0}; break;
      case Fault::kZero: f = {fileio::FaultKind::kZero, 0}; break;
    }
    ++injected_;
    return f;
  }

  std::mutex mutex_;
  std::string scope_;
  Fault fault_;
  const long target_;
  long calls_ = 0;
  long injected_ = 0;
};

// AtomicFile temporaries ("<name>.tmp.<pid>.<n>") anywhere under `dir`.
std::vector<std::string> leftover_temporaries(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.path().filename().string().find(".tmp.") != std::string::npos) found.push_back(e.path().string());
  }
  return found;
}

struct Tally {
  int injected = 0, reported = 0, absorbed = 0, lost = 0;
};

// The latest checkpoint in `ckpt` loads in a fresh engine and training from it reproduces the
// reference losses bit for bit. Returns the step it resumed at, or -1 (with a failure) if not.
int resumes_identically(const std::string& ckpt, const std::vector<float>& ref, const std::string& what) {
  Training run;
  if (!run.status().is_ok()) {
    ADD_FAILURE() << what << ": " << run.status().to_string();
    return -1;
  }
  auto loaded = run.engine().load_checkpoint(ckpt, "");
  if (!loaded.is_ok()) {
    ADD_FAILURE() << what << ": the latest checkpoint does not load: " << loaded.status().to_string();
    return -1;
  }
  const int at = static_cast<int>(run.engine().counters().steps);
  std::vector<float> losses;
  const Status st = run.steps(at, kSteps, &losses);
  const std::vector<float> want(ref.begin() + at, ref.end());
  if (!st.is_ok() || !same_bits(losses, want)) {
    ADD_FAILURE() << what << ": resuming at step " << at << " does not reproduce the reference: " << st.to_string();
    return -1;
  }
  return at;
}

std::vector<long> points(long calls, Fault fault, int op) {
  std::mt19937 rng(static_cast<unsigned>(1000 + static_cast<int>(fault) * 10 + op));
  std::uniform_int_distribution<long> pick(0, std::max<long>(0, calls - 1));
  std::vector<long> out;
  for (int i = 0; i < kPointsPerCell; ++i) out.push_back(pick(rng));
  return out;
}

void print_row(Fault f, const char* op, const Tally& t) {
  std::cout << fmt::format("| {} | {} | {} | {} | {} | {} |\n", fault_name(f), op, t.injected, t.reported,
                           t.absorbed, t.lost);
}

class FaultMatrix : public ::testing::TestWithParam<Fault> {
 protected:
  static void SetUpTestSuite() { ref_ = new std::vector<float>(reference_losses()); }
  static void TearDownTestSuite() {
    delete ref_;
    ref_ = nullptr;
  }
  static std::vector<float>* ref_;
};
std::vector<float>* FaultMatrix::ref_ = nullptr;

// A fault during a save: reported (or absorbed); `latest` names a complete checkpoint, the
// previous one when the save failed, and training resumes from it bit-identically.
TEST_P(FaultMatrix, CheckpointSave) {
  const Fault fault = GetParam();
  const std::vector<float>& ref = *ref_;
  long calls = 0;
  {  // How many toolkit calls a clean save makes.
    TempDir ckpt;
    Training run;
    std::vector<float> l;
    ASSERT_TRUE(run.steps(0, kSecondSave, &l).is_ok());
    ToolkitFaults count(ckpt.path(), fault, -1);
    ASSERT_TRUE(run.engine().save_checkpoint(ckpt.path(), "global_step5", "{}").is_ok());
    calls = count.calls();
  }
  ASSERT_GT(calls, 5);
  Tally t;
  for (const long target : points(calls, fault, 0)) {
    const std::string what = fmt::format("{} at call {} of {} in a save", fault_name(fault), target, calls);
    TempDir ckpt;
    Training run;
    std::vector<float> losses;
    ASSERT_TRUE(run.steps(0, kFirstSave, &losses).is_ok());
    ASSERT_TRUE(run.engine().save_checkpoint(ckpt.path(), "global_step3", "{}").is_ok());
    ASSERT_TRUE(run.steps(kFirstSave, kSecondSave, &losses).is_ok());
    Status saved;
    long injected = 0;
    {
      ToolkitFaults faults(ckpt.path(), fault, target);
      saved = run.engine().save_checkpoint(ckpt.path(), "global_step5", "{}");
      injected = faults.injected();
    }
    ASSERT_GT(injected, 0) << what;
    ++t.injected;
    if (absorbed(fault, false)) {
      EXPECT_TRUE(saved.is_ok()) << what << ": " << saved.to_string();
    } else {
      EXPECT_FALSE(saved.is_ok()) << what << ": the save reported success";
    }
    saved.is_ok() ? ++t.absorbed : ++t.reported;
    EXPECT_EQ(leftover_temporaries(ckpt.path()), std::vector<std::string>()) << what;
    const int at = resumes_identically(ckpt.path(), ref, what);
    if (at < 0 || (saved.is_ok() && at != kSecondSave)) ++t.lost;
    EXPECT_TRUE(at == kFirstSave || at == kSecondSave) << what << ": resumed at " << at;
  }
  print_row(fault, "checkpoint save", t);
  EXPECT_EQ(t.lost, 0);
}

// A fault during a load: reported (or absorbed, and then training is bit-identical); the
// checkpoint itself is untouched and loads in the next try.
TEST_P(FaultMatrix, CheckpointLoad) {
  const Fault fault = GetParam();
  const std::vector<float>& ref = *ref_;
  TempDir ckpt;
  {
    Training run;
    std::vector<float> l;
    ASSERT_TRUE(run.steps(0, kSecondSave, &l).is_ok());
    ASSERT_TRUE(run.engine().save_checkpoint(ckpt.path(), "global_step5", "{}").is_ok());
  }
  long calls = 0;
  {
    Training run;
    ToolkitFaults count(ckpt.path(), fault, -1);
    ASSERT_TRUE(run.engine().load_checkpoint(ckpt.path(), "").is_ok());
    calls = count.calls();
  }
  ASSERT_GT(calls, 3);
  Tally t;
  for (const long target : points(calls, fault, 1)) {
    const std::string what = fmt::format("{} at call {} of {} in a load", fault_name(fault), target, calls);
    Training run;
    Result<std::string> loaded = Status::internal("unset");
    long injected = 0;
    {
      ToolkitFaults faults(ckpt.path(), fault, target);
      loaded = run.engine().load_checkpoint(ckpt.path(), "");
      injected = faults.injected();
    }
    ASSERT_GT(injected, 0) << what;
    ++t.injected;
    bool lost = false;
    if (loaded.is_ok()) {
      ++t.absorbed;
      EXPECT_TRUE(absorbed(fault, false)) << what << ": the load reported success";
      // It said it loaded: training from it must be the reference's.
      std::vector<float> losses;
      const Status st = run.steps(kSecondSave, kSteps, &losses);
      lost = !st.is_ok() || !same_bits(losses, std::vector<float>(ref.begin() + kSecondSave, ref.end()));
      EXPECT_FALSE(lost) << what << ": a load that succeeded trained differently";
    } else {
      ++t.reported;
      EXPECT_FALSE(absorbed(fault, false)) << what << ": " << loaded.status().to_string();
    }
    if (resumes_identically(ckpt.path(), ref, what) != kSecondSave) lost = true;
    t.lost += lost ? 1 : 0;
  }
  print_row(fault, "checkpoint load", t);
  EXPECT_EQ(t.lost, 0);
}

// A fault in the NVMe tiers' aio requests during training steps: the step fails with an error,
// or the fault is retried away and the step's loss is the reference's; either way the last
// checkpoint resumes bit-identically.
TEST_P(FaultMatrix, TrainingStepWithNvmeOffload) {
  const Fault fault = GetParam();
  const std::vector<float>& ref = *ref_;
  long completions = 0;
  {
    auto faults = std::make_shared<aio::FaultInjector>();
    Training run(faults);
    std::vector<float> l;
    ASSERT_TRUE(run.steps(0, kFirstSave, &l).is_ok());
    faults->add(aio::FaultRule{aio::FaultAction::kDelay, aio::FaultOp::kAny, "", 0, UINT64_MAX, 0, 0,
                               std::chrono::microseconds(0)});
    ASSERT_TRUE(run.steps(kFirstSave, kSecondSave, &l).is_ok());
    completions = static_cast<long>(faults->injected());
  }
  ASSERT_GT(completions, 5);
  Tally t;
  for (const long target : points(completions, fault, 2)) {
    const std::string what = fmt::format("{} at aio completion {} of {} in steps {}-{}", fault_name(fault), target,
                                         completions, kFirstSave + 1, kSecondSave);
    TempDir ckpt;
    auto faults = std::make_shared<aio::FaultInjector>();
    Training run(faults);
    std::vector<float> losses;
    ASSERT_TRUE(run.steps(0, kFirstSave, &losses).is_ok());
    ASSERT_TRUE(run.engine().save_checkpoint(ckpt.path(), "global_step3", "{}").is_ok());
    aio::FaultRule rule;
    rule.skip = static_cast<std::uint64_t>(target);
    rule.count = absorbed(fault, true) ? 3 : 1;
    switch (fault) {
      case Fault::kEnospc: rule.errno_value = ENOSPC; break;
      case Fault::kEio: rule.errno_value = EIO; break;
      case Fault::kEintr: rule.errno_value = EINTR; break;
      case Fault::kEagain: rule.errno_value = EAGAIN; break;
      case Fault::kShort: rule.action = aio::FaultAction::kShorten; rule.shorten_by = 1000; break;
      case Fault::kZero: rule.action = aio::FaultAction::kZero; break;
    }
    faults->add(rule);
    const Status st = run.steps(kFirstSave, kSecondSave, &losses);
    ASSERT_GT(faults->injected(), 0u) << what;
    faults->clear();
    ++t.injected;
    bool lost = false;
    if (st.is_ok()) {
      ++t.absorbed;
      EXPECT_TRUE(absorbed(fault, true)) << what << ": the steps reported success";
      // Steps that reported success computed what the reference did, and so does what follows.
      const Status more = run.steps(kSecondSave, kSteps, &losses);
      lost = !more.is_ok() || !same_bits(losses, ref);
      EXPECT_FALSE(lost) << what << ": training that reported success differs from the reference";
    } else {
      ++t.reported;
      EXPECT_FALSE(absorbed(fault, true)) << what << ": " << st.to_string();
    }
    if (resumes_identically(ckpt.path(), ref, what) != kFirstSave) lost = true;
    t.lost += lost ? 1 : 0;
  }
  print_row(fault, "training step (NVMe aio)", t);
  EXPECT_EQ(t.lost, 0);
}

std::string param_name(const ::testing::TestParamInfo<Fault>& info) {
  static const char* const kNames[] = {"Enospc", "Eio", "Short", "Eintr", "Eagain", "Zero"};
  return kNames[static_cast<int>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(Faults, FaultMatrix,
                         ::testing::Values(Fault::kEnospc, Fault::kEio, Fault::kShort, Fault::kEintr, Fault::kEagain,
                                           Fault::kZero),
                         param_name);

// Fails the `target`-th call of `op` ("rename" or "mkdir") under `scope` with `err`, for the
// life of the object; counts those calls.
class CallFault {
 public:
  CallFault(std::string scope, std::string op, int err, long target)
      : scope_(std::move(scope)), op_(std::move(op)), err_(err), target_(target) {
    fileio::set_fault_hook([this](const fileio::FaultSite& site) {
      std::lock_guard lock(mutex_);
      if (site.op != op_ || site.path.find(scope_) == std::string::npos) return fileio::InjectedFault{};
      if (calls_++ != target_) return fileio::InjectedFault{};
      return fileio::InjectedFault{fileio::FaultKind::kErrno, err_};
    });
  }
  ~CallFault() { fileio::set_fault_hook({}); }
  CallFault(const CallFault&) = delete;
  CallFault& operator=(const CallFault&) = delete;
  long calls() const { return calls_; }

 private:
  std::mutex mutex_;
  std::string scope_, op_;
  int err_;
  long target_;
  long calls_ = 0;
};

// ENOSPC and EIO on every rename and every mkdir of a checkpoint save, for a new tag and for a
// re-save of the tag `latest` names (which also moves the old folder aside, and back when the
// new one cannot be moved in): the save fails with an error naming the call and the path; the
// folder's `latest` still loads a complete checkpoint, the previous one (for a re-save whose new
// folder was already in place when `latest` failed, the new one, under the same tag), and
// resumes bit-identically; no temporary file is left.
TEST(FaultMatrixRenameMkdir, CheckpointSave) {
  const std::vector<float> ref = reference_losses();
  for (const std::string op : {"rename", "mkdir"}) {
    for (const int err : {ENOSPC, EIO}) {
      for (const bool resave : {false, true}) {
        const char* tag = resave ? "global_step3" : "global_step5";
        Tally t;
        for (long target = 0;; ++target) {
          const std::string what = fmt::format("{} on {} {} of a {}save", err == EIO ? "EIO" : "ENOSPC", op, target,
                                               resave ? "re-" : "");
          TempDir ckpt;
          Training run;
          std::vector<float> losses;
          ASSERT_TRUE(run.steps(0, kFirstSave, &losses).is_ok());
          ASSERT_TRUE(run.engine().save_checkpoint(ckpt.path(), "global_step3", "{}").is_ok());
          ASSERT_TRUE(run.steps(kFirstSave, kSecondSave, &losses).is_ok());
          Status saved;
          long calls = 0;
          {
            CallFault fault(ckpt.path(), op, err, target);
            saved = run.engine().save_checkpoint(ckpt.path(), tag, "{}");
            calls = fault.calls();
          }
          if (target >= calls) {  // every call of this save has had its fault
            EXPECT_TRUE(saved.is_ok()) << what << ": " << saved.to_string();
            EXPECT_GE(target, op == "rename" ? (resave ? 5 : 4) : 2) << what << ": fewer calls than the save makes";
            break;
          }
          ++t.injected;
          EXPECT_FALSE(saved.is_ok()) << what << ": the save reported success";
          if (saved.is_ok()) {
            ++t.lost;
            continue;
          }
          ++t.reported;
          EXPECT_EQ(saved.sys_errno(), err) << what << ": " << saved.to_string();
          EXPECT_NE(saved.message().find(op + " " + ckpt.path()), std::string::npos) << what << ": " << saved.message();
          EXPECT_EQ(leftover_temporaries(ckpt.path()), std::vector<std::string>()) << what;
          const int at = resumes_identically(ckpt.path(), ref, what);
          const bool complete = at == kFirstSave || (resave && at == kSecondSave);
          EXPECT_TRUE(complete) << what << ": resumed at " << at;
          if (!complete) ++t.lost;
        }
        std::cout << fmt::format("| {} on {} | checkpoint {} | {} | {} | {} | {} |\n", err == EIO ? "EIO" : "ENOSPC", op,
                                 resave ? "re-save of the `latest` tag" : "save", t.injected, t.reported, t.absorbed,
                                 t.lost);
        EXPECT_EQ(t.lost, 0);
      }
    }
  }
}

// `latest` is checked by one function: a tag that leaves the folder, or names nothing, is refused.
TEST(LatestTag, OnlyAPlainExistingFolderIsAccepted) {
  TempDir dir;
  std::filesystem::create_directory(dir.path() + "/global_step2");
  const auto latest_says = [&](const std::string& text) {
    EXPECT_TRUE(fileio::write_file_atomic(dir.path() + "/latest", text).is_ok());
    return read_latest_tag(dir.path());
  };
  EXPECT_EQ(latest_says("global_step2\n").value(), "global_step2");
  for (const std::string& bad : std::vector<std::string>{"", "\n", ".", "..", "../x", "/etc", "a/../global_step2",
                                std::string("global_step2\0x", 14), std::string(kMaxTagLength + 1, 'a'),
                                "global_step3"}) {
    auto r = latest_says(bad);
    EXPECT_FALSE(r.is_ok()) << "'" << bad << "' was accepted";
    if (!r.is_ok()) {
      EXPECT_NE(r.status().message().find(dir.path() + "/latest"), std::string::npos) << r.status().message();
    }
  }
  // A huge `latest` is refused without reading it all.
  EXPECT_FALSE(latest_says(std::string(1 << 20, 'a')).is_ok());
  EXPECT_FALSE(read_latest_tag(dir.path() + "/missing").is_ok());
  EXPECT_FALSE(check_tag_name("a/b").is_ok());
  EXPECT_TRUE(check_tag_name("global_step7").is_ok());
}

// A re-save of the tag `latest` names, cut off between moving the old folder aside and moving
// the new one in, leaves `latest` loadable (from <tag>.old), and the next save of the tag puts
// the old folder back before it removes anything.
TEST(LatestTag, ResaveCutBetweenItsRenamesStillLoads) {
  const std::vector<float> ref = reference_losses();
  TempDir ckpt;
  Training run;
  std::vector<float> losses;
  ASSERT_TRUE(run.steps(0, kFirstSave, &losses).is_ok());
  ASSERT_TRUE(run.engine().save_checkpoint(ckpt.path(), "tag", "{}").is_ok());
  // The state of the folder at the cut: <tag> moved to <tag>.old, the new one still <tag>.tmp.
  std::filesystem::rename(ckpt.path() + "/tag", ckpt.path() + "/tag.old");
  std::filesystem::create_directory(ckpt.path() + "/tag.tmp");
  EXPECT_EQ(read_latest_tag(ckpt.path()).value(), "tag");
  EXPECT_EQ(resumes_identically(ckpt.path(), ref, "latest at <tag>.old"), kFirstSave);
  EXPECT_TRUE(CheckpointReader::open(ckpt.path()).is_ok());
  // A new save of the same tag whose rank file fails: the old folder is back in place, loadable.
  {
    ToolkitFaults faults(ckpt.path() + "/tag.tmp", Fault::kEio, 0);
    EXPECT_FALSE(run.engine().save_checkpoint(ckpt.path(), "tag", "{}").is_ok());
  }
  EXPECT_TRUE(std::filesystem::exists(ckpt.path() + "/tag/engine.json"));
  EXPECT_EQ(resumes_identically(ckpt.path(), ref, "after a failed re-save"), kFirstSave);
  // And a clean re-save replaces it.
  ASSERT_TRUE(run.steps(kFirstSave, kSecondSave, &losses).is_ok());
  ASSERT_TRUE(run.engine().save_checkpoint(ckpt.path(), "tag", "{}").is_ok());
  EXPECT_FALSE(std::filesystem::exists(ckpt.path() + "/tag.old"));
  EXPECT_FALSE(std::filesystem::exists(ckpt.path() + "/tag.tmp"));
  EXPECT_EQ(resumes_identically(ckpt.path(), ref, "after a clean re-save"), kSecondSave);
}

// A re-save stopped after its new folder was in place and before it removed the old copy (a kill
// after "latest written", seen in kill_test.sh) leaves <tag>.old beside a complete <tag>: the next
// save, of any tag, removes it, and <tag> still loads.
TEST(LatestTag, OldCopyBesideACompleteTagGoesAtTheNextSave) {
  const std::vector<float> ref = reference_losses();
  TempDir ckpt;
  Training run;
  std::vector<float> losses;
  ASSERT_TRUE(run.steps(0, kFirstSave, &losses).is_ok());
  ASSERT_TRUE(run.engine().save_checkpoint(ckpt.path(), "tag", "{}").is_ok());
  std::filesystem::copy(ckpt.path() + "/tag", ckpt.path() + "/tag.old", std::filesystem::copy_options::recursive);
  EXPECT_EQ(resumes_identically(ckpt.path(), ref, "<tag> beside <tag>.old"), kFirstSave);
  ASSERT_TRUE(run.steps(kFirstSave, kSecondSave, &losses).is_ok());
  ASSERT_TRUE(run.engine().save_checkpoint(ckpt.path(), "other", "{}").is_ok());
  EXPECT_FALSE(std::filesystem::exists(ckpt.path() + "/tag.old"));
  EXPECT_TRUE(std::filesystem::exists(ckpt.path() + "/tag/engine.json"));
  Training fresh;
  EXPECT_TRUE(fresh.engine().load_checkpoint(ckpt.path(), "tag").is_ok());
  EXPECT_EQ(resumes_identically(ckpt.path(), ref, "after the next save"), kSecondSave);
}

}  // namespace
}  // namespace zinf::zero3
