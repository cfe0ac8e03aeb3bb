// A checkpoint's engine.json written by engine_json_text and read back by parse_engine_json, and
// the save's folder sequence (prepare_save_folder, install_tag_folder), without an engine.
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/file_io.h"
#include "temp_dir.h"
#include "zero3/checkpoint_folder.h"
#include "zero3/checkpoint_format.h"
#include "zero3/model_partition.h"
#include "zinf/model/gpt.h"

namespace zinf::zero3 {
namespace {

using zinf::testing::TempDir;

bool exists(const std::string& path) { return std::filesystem::exists(path); }

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class CheckpointFormatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto gpt = model::GptModel::create(model::GptConfig{});
    ASSERT_TRUE(gpt.is_ok()) << gpt.status().to_string();
    model_ = std::move(gpt).value();
    auto plan = model_partition_plan(model_->params(), model_->modules().size(), 2);
    ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
    layout_ = swap::PartitionLayout::build(layout_partitions(model_->params(), model_->modules(), *plan), 20000);
    std::uint64_t rank_bytes = 0;
    for (const swap::SubGroup& sg : layout_.subgroups) rank_bytes += sg.numel * 3 * sizeof(float);
    record_ = detail::SaveRecord{"global_step7", "bf16", "AdamW", &layout_, 2, false, 3,
                                 EngineCounters{7, 6, 6, 1024.0, 6, 2, 1},
                                 {{rank_bytes, 0xFFFF'FFFF'0000'0001u}, {rank_bytes, 42}},
                                 R"({"seed": 1})"};
  }

  std::unique_ptr<model::GptModel> model_;
  swap::PartitionLayout layout_;
  detail::SaveRecord record_;
};

TEST_F(CheckpointFormatTest, WhatASaveWritesReadsBack) {
  const std::string text = detail::engine_json_text(*model_, record_);
  EXPECT_EQ(nlohmann::json::parse(text).value("format", 0), detail::kCheckpointFormat);
  auto parsed = detail::parse_engine_json(text, "ckpt/global_step7");
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  const detail::EngineJson& e = parsed.value();
  EXPECT_EQ(e.format, detail::kCheckpointFormat);
  EXPECT_EQ(e.model, detail::model_json(*model_));
  EXPECT_EQ(e.model_layout.params.size(), model_->params().size());
  EXPECT_EQ(e.model_layout.modules.size(), model_->modules().size());
  EXPECT_EQ(e.saved.plan.world_size(), 2);
  EXPECT_EQ(e.saved.layout.fingerprint(), layout_.fingerprint());
  EXPECT_EQ(e.saved.arrays, 3u);
  EXPECT_EQ(e.precision, "bf16");
  EXPECT_EQ(e.optimizer, "AdamW");
  EXPECT_EQ(e.checksum_algo, detail::kChecksumAlgo);
  EXPECT_FALSE(e.node_local);
  ASSERT_EQ(e.ranks.size(), 2u);
  EXPECT_EQ(e.ranks[0].checksum, 0xFFFF'FFFF'0000'0001u);  // all 64 bits
  EXPECT_EQ(e.ranks[1].checksum, 42u);
  EXPECT_EQ(e.ranks[0].bytes, e.saved.rank_file_bytes);
  EXPECT_EQ(e.counters.steps, 7);
  EXPECT_EQ(e.counters.updates, 6);
  EXPECT_EQ(e.counters.loss_scale, 1024.0);
  EXPECT_EQ(e.counters.scaler_last_overflow, 2);
  EXPECT_EQ(e.client_state, R"({"seed": 1})");
}

// Format 3's checksums use all 64 bits and name their algorithm. Format 2 (earlier zinf's
// released checkpoints) is still read, its checksums the top 53 bits; formats 1 (never released)
// and 4 are Unsupported.
TEST_F(CheckpointFormatTest, Format3KeepsWholeChecksumsFormat2FiftyThreeBitsOthersAreUnsupported) {
  nlohmann::json j = nlohmann::json::parse(detail::engine_json_text(*model_, record_));
  j["ranks"][0]["checksum"] = 0xFFFF'FFFF'0000'0001u;
  auto whole = detail::parse_engine_json(j.dump(), "ckpt/t");
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  EXPECT_EQ(whole->ranks[0].checksum, 0xFFFF'FFFF'0000'0001u);
  j["format"] = 2;
  // Format 2's checksums are the top 53 bits: a larger value is out of range there.
  auto too_big = detail::parse_engine_json(j.dump(), "ckpt/t");
  ASSERT_FALSE(too_big.is_ok());
  EXPECT_EQ(too_big.status().code(), ErrorCode::kCorruption);
  EXPECT_NE(too_big.status().message().find("ranks[0].checksum"), std::string::npos) << too_big.status().message();
  j["ranks"][0]["checksum"] = 0xFFFF'FFFF'0000'0001u >> 11;
  auto format2 = detail::parse_engine_json(j.dump(), "ckpt/t");
  ASSERT_TRUE(format2.is_ok()) << format2.status().to_string();
  EXPECT_EQ(format2->format, 2);
  for (const nlohmann::json& other : {nlohmann::json(1), nlohmann::json(4), nlohmann::json("3")}) {
    j["format"] = other;
    auto r = detail::parse_engine_json(j.dump(), "ckpt/t");
    ASSERT_FALSE(r.is_ok()) << other.dump();
    EXPECT_EQ(r.status().code(), ErrorCode::kUnsupported) << r.status().to_string();
    EXPECT_NE(r.status().message().find("reads formats 2 to 3"), std::string::npos) << r.status().message();
  }
  j["ranks"][0]["checksum"] = 0xFFFF'FFFF'0000'0001u;
  j["format"] = 3;
  j["checksum_algo"] = "fnv1a-64";
  auto other_sum = detail::parse_engine_json(j.dump(), "ckpt/t");
  EXPECT_EQ(other_sum.status().code(), ErrorCode::kUnsupported) << other_sum.status().to_string();
  j.erase("checksum_algo");
  auto no_sum = detail::parse_engine_json(j.dump(), "ckpt/t");
  EXPECT_EQ(no_sum.status().code(), ErrorCode::kCorruption) << no_sum.status().to_string();
  EXPECT_NE(no_sum.status().message().find("checksum_algo"), std::string::npos) << no_sum.status().message();
}

// What a save killed part way left is cleared; a <tag>.old that is the only copy comes back.
TEST(CheckpointFolderTest, PrepareClearsWhatAKilledSaveLeft) {
  TempDir root;
  const std::string dir = root.path() + "/ckpt";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  for (const char* folder : {"/x.tmp", "/a", "/a.old", "/b.old"}) ASSERT_EQ(::mkdir((dir + folder).c_str(), 0700), 0);
  ASSERT_TRUE(fileio::write_file_atomic(dir + "/latest.tmp.123", "a\n").is_ok());
  std::optional<fileio::FileLock> lock;
  ASSERT_TRUE(detail::prepare_save_folder(dir, "b", &lock).is_ok());
  EXPECT_TRUE(lock.has_value());
  EXPECT_FALSE(exists(dir + "/x.tmp"));
  EXPECT_FALSE(exists(dir + "/latest.tmp.123"));
  EXPECT_FALSE(exists(dir + "/a.old"));  // beside a complete a
  EXPECT_TRUE(exists(dir + "/a"));
  EXPECT_TRUE(exists(dir + "/b"));  // put back: it was the only copy of b
  EXPECT_FALSE(exists(dir + "/b.old"));
  EXPECT_TRUE(exists(detail::tmp_tag_folder(dir, "b")));
}

TEST(CheckpointFolderTest, InstallReplacesTheTagAndWritesLatestLast) {
  TempDir root;
  const std::string dir = root.path();
  std::optional<fileio::FileLock> lock;
  ASSERT_TRUE(detail::prepare_save_folder(dir, "t", &lock).is_ok());
  ASSERT_TRUE(fileio::write_file_atomic(detail::tmp_tag_folder(dir, "t") + "/engine.json", "first").is_ok());
  ASSERT_TRUE(detail::install_tag_folder(dir, "t").is_ok());
  EXPECT_EQ(read_all(dir + "/t/engine.json"), "first");
  EXPECT_EQ(read_all(dir + "/latest"), "t\n");
  EXPECT_FALSE(exists(detail::tmp_tag_folder(dir, "t")));
  // A second save of the same tag replaces it; no .old is left behind.
  lock.reset();
  ASSERT_TRUE(detail::prepare_save_folder(dir, "t", &lock).is_ok());
  ASSERT_TRUE(fileio::write_file_atomic(detail::tmp_tag_folder(dir, "t") + "/engine.json", "second").is_ok());
  ASSERT_TRUE(detail::install_tag_folder(dir, "t").is_ok());
  EXPECT_EQ(read_all(dir + "/t/engine.json"), "second");
  EXPECT_FALSE(exists(dir + "/t.old"));
  EXPECT_EQ(detail::rank_file(dir + "/t", 3), dir + "/t/rank3.state");
}

}  // namespace
}  // namespace zinf::zero3
