// The one rule for checkpoint tags: what a save, a load and `latest` accept, with the same limits.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/file_io.h"
#include "temp_dir.h"
#include "zinf/zero3/checkpoint.h"

namespace zinf::zero3 {
namespace {

using zinf::testing::TempDir;

TEST(CheckpointTagTest, AcceptsPlainNamesUpToTheLimit) {
  for (const std::string& tag : {std::string("global_step7"), std::string("a"), std::string("run.1-final"),
                                 std::string(kMaxTagLength, 'a'), std::string("x.old.y"), std::string("latest2")}) {
    EXPECT_TRUE(check_tag_name(tag).is_ok()) << tag << ": " << check_tag_name(tag).to_string();
  }
}

TEST(CheckpointTagTest, RefusesWhatIsNotAFolderDirectlyInside) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "empty"},
      {".", "refers to a folder itself"},
      {"..", "refers to a folder itself"},
      {"latest", "'latest' is the name of the file"},
      {"a/b", "contains '/'"},
      {std::string("a\0b", 3), "control character"},
      {"a\nb", "control character"},
      {"global_step2.tmp", "ends in .tmp or .old"},
      {"global_step2.old", "ends in .tmp or .old"},
      {std::string(kMaxTagLength + 1, 'a'), "more than the 200 zinf accepts"},
      {std::string(300, 'a'), "300 bytes"},
  };
  for (const auto& [tag, why] : cases) {
    const Status st = check_tag_name(tag);
    ASSERT_FALSE(st.is_ok()) << "'" << tag << "' was accepted";
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find(why), std::string::npos) << st.message();
  }
}

// `latest` goes through the same rule: a tag a save would refuse is never loaded through it.
TEST(CheckpointTagTest, LatestFollowsTheSameRule) {
  TempDir dir;
  const std::string longest(kMaxTagLength, 'b');
  dir.sub(longest);
  dir.sub(std::string(kMaxTagLength + 1, 'b'));
  ASSERT_TRUE(fileio::write_file_atomic(dir.path() + "/latest", longest + "\n").is_ok());
  auto ok = read_latest_tag(dir.path());
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(ok.value(), longest);
  ASSERT_TRUE(fileio::write_file_atomic(dir.path() + "/latest", std::string(kMaxTagLength + 1, 'b')).is_ok());
  auto too_long = read_latest_tag(dir.path());
  ASSERT_FALSE(too_long.is_ok());
  EXPECT_EQ(too_long.status().code(), ErrorCode::kCorruption);
  EXPECT_NE(too_long.status().message().find("more than the 200 zinf accepts"), std::string::npos)
      << too_long.status().message();
  EXPECT_NE(too_long.status().message().find(dir.path() + "/latest"), std::string::npos) << too_long.status().message();
}

}  // namespace
}  // namespace zinf::zero3
