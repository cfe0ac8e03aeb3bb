// zinf train's resume rules (tools/zinf/run_state.cpp): what a checkpoint records of its run,
// and what --resume accepts, warns about or refuses when the command line differs.
#include "run_state.h"

#include <cstdint>
#include <optional>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "temp_dir.h"
#include "zinf/model/data.h"

namespace zinf::cli {
namespace {

using zinf::testing::TempDir;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

RunState saved_state() {
  RunState s;
  s.seed = 1234;
  s.data = DataIdentity{"/data/d.txt", "1 text file", 9000, 256, 0x0123456789abcdefULL, "text"};
  s.batch = BatchGeometry{8, 64, 2, 2};
  s.position = {1, 48};
  return s;
}

// <dir>/latest naming tag "t1", whose engine.json carries `client_state` (and a model without "type").
std::string write_checkpoint(const TempDir& dir, const nlohmann::json& client_state) {
  dir.sub("t1");
  dir.write("latest", "t1\n");
  nlohmann::json engine = {{"model", {{"n_layer", 2}}}};
  if (!client_state.is_null()) engine["client_state"] = client_state;
  dir.write("t1/engine.json", engine.dump());
  return dir.path();
}

SavedRun read_ok(const std::string& dir) {
  auto r = SavedRun::read(dir);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return std::move(r).value();
}

const ResumeRules kStrict{false, false};
const ResumeRules kAllow{true, false};

TEST(RunStateTest, ASavedRunReadsBackWhatWasWritten) {
  TempDir dir;
  const RunState s = saved_state();
  const SavedRun run = read_ok(write_checkpoint(dir, run_state_json(s)));
  EXPECT_EQ(run.tag(), "t1");
  EXPECT_EQ(run.folder(), dir.path() + "/t1");
  EXPECT_EQ(run.world_size(), 2);
  EXPECT_EQ(nlohmann::json::parse(run.model_json()).value("type", ""), "gpt");  // filled in
  EXPECT_EQ(run.seed(std::nullopt, 7, kStrict).value(), 1234u);
  EXPECT_EQ(run.seed(1234, 7, kStrict).value(), 1234u);
  EXPECT_EQ(run.data_path(""), "/data/d.txt");
  EXPECT_EQ(run.data_path("/other.txt"), "/other.txt");
  EXPECT_EQ(run.data_format(std::nullopt).value(), model::DataFormat::kText);
  EXPECT_EQ(run.check_data(s.data, false, kStrict).value(), false);
  EXPECT_TRUE(run.check_batch(s.batch, kStrict).is_ok());
}

TEST(RunStateTest, AnotherSeedIsRefusedUnlessTheDataMayChange) {
  TempDir dir;
  const SavedRun run = read_ok(write_checkpoint(dir, run_state_json(saved_state())));
  auto refused = run.seed(99, 7, kStrict);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(refused.status().message(), "--seed 99 differs from the checkpoint's seed 1234"))
      << refused.status().message();
  EXPECT_EQ(run.seed(99, 7, kAllow).value(), 99u);
}

TEST(RunStateTest, OtherDataIsRefusedNamingWhetherItWasGiven) {
  TempDir dir;
  const SavedRun run = read_ok(write_checkpoint(dir, run_state_json(saved_state())));
  DataIdentity other = saved_state().data;
  other.hash ^= 1;
  auto given = run.check_data(other, true, kStrict);
  ASSERT_FALSE(given.is_ok());
  EXPECT_TRUE(contains(given.status().message(), "is not the data the checkpoint was trained on"))
      << given.status().message();
  auto changed = run.check_data(other, false, kStrict);
  ASSERT_FALSE(changed.is_ok());
  EXPECT_TRUE(contains(changed.status().message(), "has changed since it was saved")) << changed.status().message();
  EXPECT_EQ(run.check_data(other, true, kAllow).value(), true);
  // Same tokens, vocabulary and hash: the same data, wherever it now lives.
  DataIdentity moved = saved_state().data;
  moved.path = "/elsewhere/d.txt";
  EXPECT_EQ(run.check_data(moved, true, kStrict).value(), false);
}

TEST(RunStateTest, BatchGeometryRules) {
  TempDir dir;
  const SavedRun run = read_ok(write_checkpoint(dir, run_state_json(saved_state())));  // 8 x 2 x 2 ranks, seq 64
  // Another training window (--seq): refused unless the data may change, then accepted (the
  // position is carried over by share of the epoch, restore_position below).
  const Status seq = run.check_batch(BatchGeometry{8, 128, 2, 2}, kStrict);
  EXPECT_EQ(seq.code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(seq.message(), "rows of 64 tokens")) << seq.message();
  EXPECT_TRUE(run.check_batch(BatchGeometry{8, 128, 2, 2}, kAllow).is_ok());
  // Other rows per step on the same world size: refused unless the data may change.
  const Status rows = run.check_batch(BatchGeometry{4, 64, 2, 2}, kStrict);
  EXPECT_EQ(rows.code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(rows.message(), "16 rows per step")) << rows.message();
  EXPECT_TRUE(run.check_batch(BatchGeometry{4, 64, 2, 2}, kAllow).is_ok());
  // Another world size: a warning, not an error.
  EXPECT_TRUE(run.check_batch(BatchGeometry{8, 64, 2, 4}, kStrict).is_ok());
  // The same rows per step split another way: accepted.
  EXPECT_TRUE(run.check_batch(BatchGeometry{16, 64, 1, 2}, kStrict).is_ok());
}

TEST(RunStateTest, AnOlderCheckpointKeepsTheCommandLine) {
  TempDir dir;
  const SavedRun run = read_ok(write_checkpoint(dir, nlohmann::json{{"epoch", 0}, {"row", 8}}.dump()));
  EXPECT_EQ(run.seed(std::nullopt, 7, kStrict).value(), 7u);
  EXPECT_EQ(run.seed(5, 7, kStrict).value(), 5u);
  EXPECT_EQ(run.data_path(""), "");  // the built-in corpus
  EXPECT_EQ(run.data_format(std::nullopt).value(), model::DataFormat::kAuto);
  EXPECT_EQ(run.check_data(saved_state().data, false, kStrict).value(), false);
  EXPECT_TRUE(run.check_batch(BatchGeometry{8, 64, 2, 1}, kStrict).is_ok());
  EXPECT_EQ(run.world_size(), 1);
}

TEST(RunStateTest, RestoringPastTheEndOfChangedDataStartsTheNextEpoch) {
  TempDir dir;
  RunState s = saved_state();
  auto loader = model::BatchLoader::create(model::TokenDataset::load_default(), {2, 16, 0, 1, 5, true});
  ASSERT_TRUE(loader.is_ok()) << loader.status().to_string();
  s.position = {3, loader->rows_per_epoch() + 10};
  const SavedRun run = read_ok(write_checkpoint(dir, run_state_json(s)));
  const int seq = s.batch.seq;  // the saved window: positions are not rescaled
  ASSERT_TRUE(run.restore_position(*loader, true, seq, kAllow).is_ok());
  EXPECT_EQ(loader->position(), (model::BatchPosition{4, 0}));
  // Unchanged data: the saved position must be valid for it.
  EXPECT_FALSE(run.restore_position(*loader, false, seq, kStrict).is_ok());
  s.position = {2, 1};
  const SavedRun inside = read_ok(write_checkpoint(dir, run_state_json(s)));
  ASSERT_TRUE(inside.restore_position(*loader, false, seq, kStrict).is_ok());
  EXPECT_EQ(loader->position(), (model::BatchPosition{2, 1}));
  // Rows of another length resume at the same share of the epoch, rounded down to a row.
  s.position = {2, 10};
  const SavedRun other_window = read_ok(write_checkpoint(dir, run_state_json(s)));
  ASSERT_TRUE(other_window.restore_position(*loader, false, 2 * seq, kStrict).is_ok());
  EXPECT_EQ(loader->position(), (model::BatchPosition{2, 5}));
}

TEST(RunStateTest, MalformedRecordsAreCorruptionNamingTheProblem) {
  const auto message_of = [](const nlohmann::json& client_state) {
    TempDir dir;
    auto r = SavedRun::read(write_checkpoint(dir, client_state));
    EXPECT_FALSE(r.is_ok());
    if (r.is_ok()) return std::string();
    EXPECT_EQ(r.status().code(), ErrorCode::kCorruption) << r.status().to_string();
    return r.status().message();
  };
  EXPECT_TRUE(contains(message_of(nullptr), "has no client_state"));
  EXPECT_TRUE(contains(message_of(nlohmann::json{{"row", 1}}.dump()), "no data loader position"));
  nlohmann::json bad_hash = nlohmann::json::parse(run_state_json(saved_state()));
  bad_hash["data"]["hash"] = "xyz";
  EXPECT_TRUE(contains(message_of(bad_hash.dump()), "hash \"xyz\" is not a hexadecimal number"));
  nlohmann::json negative = nlohmann::json::parse(run_state_json(saved_state()));
  negative["epoch"] = -1;
  EXPECT_TRUE(contains(message_of(negative.dump()), "client_state is malformed"));
}

}  // namespace
}  // namespace zinf::cli
