// Tests for the safetensors writer and reader: round trip, atomicity, and corrupt files.
#include "zinf/zero3/safetensors.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "temp_dir.h"

namespace zinf::zero3 {
namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  zinf::testing::TempDir tmp_{"st_test."};
  const std::string dir_ = tmp_.path();
};

TEST_F(SafetensorsTest, RoundTripsTensorsAndMetadata) {
  const std::string path = dir_ + "/model.safetensors";
  std::vector<TensorToWrite> tensors;
  tensors.push_back({"wte", {3, 2}, [](std::span<float> out) {
                       for (std::size_t i = 0; i < out.size(); ++i) out[i] = 0.5f * static_cast<float>(i);
                       return Status::ok();
                     }});
  tensors.push_back({"ln_f.bias", {5}, [](std::span<float> out) {
                       for (float& v : out) v = -1.25f;
                       return Status::ok();
                     }});
  ASSERT_TRUE(write_safetensors(path, tensors, {{"format", "pt"}}).is_ok());
  auto reader = SafetensorsReader::open(path);
  ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
  ASSERT_EQ(reader->entries().size(), 2u);
  EXPECT_EQ(reader->metadata().at("format"), "pt");
  std::vector<float> wte(6);
  ASSERT_TRUE(reader->read_f32("wte", wte).is_ok());
  EXPECT_EQ(wte, (std::vector<float>{0, 0.5f, 1, 1.5f, 2, 2.5f}));
  std::vector<float> wrong(4);
  Status s = reader->read_f32("ln_f.bias", wrong);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("has 5 elements"), std::string::npos);
  EXPECT_EQ(reader->read_f32("missing", wrong).code(), ErrorCode::kNotFound);
}

TEST_F(SafetensorsTest, FailedFillLeavesOldFileIntact) {
  const std::string path = dir_ + "/model.safetensors";
  std::vector<TensorToWrite> good = {{"a", {2}, [](std::span<float> out) {
                                        out[0] = 1;
                                        out[1] = 2;
                                        return Status::ok();
                                      }}};
  ASSERT_TRUE(write_safetensors(path, good).is_ok());
  std::vector<TensorToWrite> bad = {{"a", {2}, [](std::span<float>) { return Status::aborted("disk gone"); }}};
  Status s = write_safetensors(path, bad);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("tensor a"), std::string::npos);
  auto reader = SafetensorsReader::open(path);
  ASSERT_TRUE(reader.is_ok());
  std::vector<float> a(2);
  ASSERT_TRUE(reader->read_f32("a", a).is_ok());
  EXPECT_EQ(a, (std::vector<float>{1, 2}));
  // No temporary files left behind.
  std::size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1u);
}

TEST_F(SafetensorsTest, RejectsTruncatedAndCorruptFiles) {
  const std::string path = dir_ + "/bad.safetensors";
  std::vector<TensorToWrite> t = {{"w", {4}, [](std::span<float> out) {
                                     for (float& v : out) v = 3;
                                     return Status::ok();
                                   }}};
  ASSERT_TRUE(write_safetensors(path, t).is_ok());
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size - 4);  // cut the last element
  auto reader = SafetensorsReader::open(path);
  ASSERT_FALSE(reader.is_ok());
  EXPECT_EQ(reader.status().code(), ErrorCode::kCorruption);
  EXPECT_NE(reader.status().message().find("tensor w"), std::string::npos);
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << "abc";
  }
  EXPECT_EQ(SafetensorsReader::open(path).status().code(), ErrorCode::kCorruption);
}

}  // namespace
}  // namespace zinf::zero3
