// Disk, like memory: the free-space check before any work (a test double for statvfs), swap files
// removed when the engine closes (after a failed step too), --save-keep's pruning.
#include "zinf/zero3/disk_space.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine_harness.h"
#include "temp_dir.h"
#include "zinf/aio/fault.h"
#include "zinf/model/gpt.h"
#include "zinf/zero3/checkpoint_keep.h"

namespace zinf::zero3 {
namespace {

using zinf::testing::TempDir;
namespace t = zinf::zero3::testing;

std::unique_ptr<model::Model> small_gpt() {
  model::GptConfig c;
  c.vocab_size = 64;
  c.max_seq = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  return std::move(model::GptModel::create(c)).value();
}

// Regular files anywhere under `dir`.
std::vector<std::string> files_under(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (e.is_regular_file()) out.push_back(e.path().string());
  }
  return out;
}

std::vector<std::string> swap_data_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const std::string& f : files_under(dir)) {
    if (f.ends_with(".swp") || f.ends_with("manifest.json")) out.push_back(f);
  }
  return out;
}

// Every path one file system, with `free` bytes.
FreeSpaceProbe one_disk(std::uint64_t free, std::vector<std::string>* asked = nullptr) {
  return [free, asked](const std::string& path) -> Result<DiskSpace> {
    if (asked != nullptr) asked->push_back(path);
    return DiskSpace{7, free};
  };
}

TEST(DiskSpace, UsesOnOneFileSystemAddUpAndTheRefusalNamesNeedAndFree) {
  const std::vector<DiskUse> uses = {{"/nvme", "offload_optimizer swap files", 3u << 20, 0},
                                     {"/nvme", "offload_param swap files", 2u << 20, 0}};
  EXPECT_TRUE(check_disk_space(uses, one_disk(5u << 20)).is_ok());
  const Status st = check_disk_space(uses, one_disk((5u << 20) - 1));
  ASSERT_EQ(st.code(), ErrorCode::kResourceExhausted) << st.to_string();
  EXPECT_NE(st.message().find("writes 5.0 MiB more on the file system of /nvme"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("which has 5.0 MiB free"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("offload_optimizer swap files in /nvme: 3.0 MiB"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("offload_param swap files in /nvme: 2.0 MiB"), std::string::npos) << st.message();
}

TEST(DiskSpace, FileSystemsAreCheckedApartAndAnEarlierRunsFilesCount) {
  const FreeSpaceProbe two = [](const std::string& path) -> Result<DiskSpace> {
    return DiskSpace{path == "/a" ? 1u : 2u, 4u << 20};
  };
  const std::vector<DiskUse> apart = {{"/a", "swap", 3u << 20, 0}, {"/b", "--save", 3u << 20, 0}};
  EXPECT_TRUE(check_disk_space(apart, two).is_ok());
  // 6 MiB of which 3 MiB are the files an earlier run left, replaced by this one: 3 MiB more.
  const std::vector<DiskUse> again = {{"/a", "swap", 6u << 20, 3u << 20}};
  EXPECT_TRUE(check_disk_space(again, two).is_ok());
  const std::vector<DiskUse> more = {{"/a", "swap", 8u << 20, 3u << 20}};
  EXPECT_EQ(check_disk_space(more, two).code(), ErrorCode::kResourceExhausted);
}

TEST(DiskSpace, TheRealProbeAnswersForAFolderNotYetMade) {
  TempDir dir;
  auto here = probe_free_space(dir.path());
  auto below = probe_free_space(dir.path() + "/not/yet/made");
  ASSERT_TRUE(here.is_ok()) << here.status().to_string();
  ASSERT_TRUE(below.is_ok()) << below.status().to_string();
  EXPECT_EQ(here->device, below->device);
  EXPECT_GT(here->free_bytes, 0u);
}

// The engine asks before it makes any swap store, and a disk too small is refused with nothing
// written; one just large enough runs.
TEST(DiskSpace, EngineRefusesARunTheDiskCannotHoldBeforeWritingAnything) {
  TempDir nvme;
  const config::DsConfig ds = t::ds_config("nvme", nvme.path());
  auto comm = make_local_communicator();
  std::vector<std::string> asked;
  EngineOptions tight{ds, 11, ""};
  tight.free_space = one_disk(64 << 10, &asked);
  auto refused = Engine::create(small_gpt(), tight, *comm);
  ASSERT_FALSE(refused.is_ok());
  const Status& st = refused.status();
  EXPECT_EQ(st.code(), ErrorCode::kResourceExhausted) << st.to_string();
  EXPECT_NE(st.message().find("not enough free disk space"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("which has 64.0 KiB free"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("offload_optimizer swap files in " + nvme.path()), std::string::npos) << st.message();
  EXPECT_EQ(asked.size(), 2u);  // the optimizer's and the parameters' swap folders
  EXPECT_TRUE(files_under(nvme.path()).empty()) << "written before the check: " << files_under(nvme.path()).front();

  // With a --save of three copies the same check includes them.
  EngineOptions roomy{ds, 11, ""};
  roomy.free_space = one_disk(std::uint64_t{1} << 40);
  auto engine = Engine::create(small_gpt(), roomy, *comm);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const std::uint64_t ckpt = engine.value()->checkpoint_bytes();
  EXPECT_GT(ckpt, 0u);
  engine.value().reset();
  EngineOptions saving{ds, 11, ""};
  saving.save_dir = nvme.path() + "/ckpt";
  saving.save_copies = 3;
  saving.free_space = one_disk(std::uint64_t{1} << 40);
  EXPECT_TRUE(Engine::create(small_gpt(), saving, *comm).is_ok());
  saving.free_space = one_disk(3 * ckpt);  // the swap files and three checkpoints do not fit
  const Status with_save = Engine::create(small_gpt(), saving, *comm).status();
  EXPECT_EQ(with_save.code(), ErrorCode::kResourceExhausted) << with_save.to_string();
  EXPECT_NE(with_save.message().find("--save: 3 checkpoints of"), std::string::npos) << with_save.message();
}

// Swap files are scratch: gone when the engine closes, after a run that failed as after one that
// succeeded; the lock files stay (see StoreConfig::remove_at_close).
TEST(DiskSpace, SwapFilesAreRemovedWhenTheEngineClosesEvenAfterAFailedStep) {
  TempDir nvme;
  const config::DsConfig ds = t::ds_config("nvme", nvme.path());
  auto comm = make_local_communicator();
  EngineOptions o{ds, 11, ""};
  o.aio_faults = std::make_shared<aio::FaultInjector>();
  {
    auto engine = Engine::create(small_gpt(), o, *comm);
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    ASSERT_TRUE(t::train(*engine.value(), 0, 1, 64).is_ok());
    EXPECT_FALSE(swap_data_files(nvme.path()).empty());
    aio::FaultRule rule;
    rule.op = aio::FaultOp::kWrite;
    o.aio_faults->add(rule);
    EXPECT_FALSE(t::train(*engine.value(), 1, 2, 64).is_ok());
  }
  EXPECT_TRUE(swap_data_files(nvme.path()).empty()) << swap_data_files(nvme.path()).front();
  o.aio_faults->clear();
  {
    auto engine = Engine::create(small_gpt(), o, *comm);
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    ASSERT_TRUE(t::train(*engine.value(), 0, 2, 64).is_ok());
  }
  EXPECT_TRUE(swap_data_files(nvme.path()).empty()) << swap_data_files(nvme.path()).front();
}

// A fake checkpoint folder <dir>/<tag> with an engine.json.
void fake_checkpoint(const TempDir& dir, const std::string& tag) {
  dir.sub(tag);
  dir.write(tag + "/engine.json", "{}");
}

TEST(SaveKeep, KeepsTheNewestStepCheckpointsAndNeverTheOneLatestNames) {
  TempDir dir;
  for (int s : {1, 2, 3, 10, 11}) fake_checkpoint(dir, step_tag(s));
  fake_checkpoint(dir, "mine");  // not a step checkpoint: never counted or removed
  dir.sub("global_step0");       // no engine.json: not a complete save, left alone
  dir.write("latest", "global_step2\n");
  auto removed = keep_newest_checkpoints(dir.path(), 2);
  ASSERT_TRUE(removed.is_ok()) << removed.status().to_string();
  EXPECT_EQ(removed.value(), (std::vector<std::string>{"global_step3", "global_step1"}));
  std::vector<std::string> left;
  for (const StepCheckpoint& c : list_step_checkpoints(dir.path())) left.push_back(c.tag);
  EXPECT_EQ(left, (std::vector<std::string>{"global_step2", "global_step10", "global_step11"}));
  EXPECT_TRUE(std::filesystem::exists(dir.file("mine/engine.json")));
  EXPECT_TRUE(std::filesystem::exists(dir.file("global_step0")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("global_step3.tmp")));
  // latest among the newest takes one of the places.
  dir.write("latest", "global_step11\n");
  removed = keep_newest_checkpoints(dir.path(), 1);
  ASSERT_TRUE(removed.is_ok()) << removed.status().to_string();
  EXPECT_EQ(removed.value(), (std::vector<std::string>{"global_step10", "global_step2"}));
}

TEST(SaveKeep, WithoutAReadableLatestNothingIsRemoved) {
  TempDir dir;
  for (int s : {1, 2, 3}) fake_checkpoint(dir, step_tag(s));
  const auto removed = keep_newest_checkpoints(dir.path(), 1);
  ASSERT_FALSE(removed.is_ok());
  EXPECT_NE(removed.status().message().find("nothing removed"), std::string::npos) << removed.status().message();
  EXPECT_EQ(list_step_checkpoints(dir.path()).size(), 3u);
}

TEST(SaveKeep, StepTagsRoundTripAndOtherNamesAreNotSteps) {
  EXPECT_EQ(step_of_tag(step_tag(42)), 42);
  for (const char* name : {"global_step", "global_step-1", "global_step1x", "step1", "global_step+1"}) {
    EXPECT_FALSE(step_of_tag(name).has_value()) << name;
  }
}

}  // namespace
}  // namespace zinf::zero3
