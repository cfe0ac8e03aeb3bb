// Tests for the JSON text layer: trailing commas, comments, key positions, errors with line:col.
#include "config/json_text.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/json_check.h"
#include "test_util.h"

namespace zinf::config::detail {
namespace {

TEST(JsonTextTest, BlanksTrailingCommasKeepingOffsets) {
  std::string text = "{\"a\": [1, 2,], \"b\": {\"c\": 1,},}";
  std::string out = blank_trailing_commas(text);
  EXPECT_EQ(out.size(), text.size());
  EXPECT_EQ(out, "{\"a\": [1, 2 ], \"b\": {\"c\": 1 } }");
}

TEST(JsonTextTest, TrailingCommaBeforeCommentAndNewline) {
  std::string text = "{\"a\": 1, // last\n /* x */ }";
  EXPECT_EQ(blank_trailing_commas(text), "{\"a\": 1  // last\n /* x */ }");
}

TEST(JsonTextTest, LeavesCommasInsideStringsAndComments) {
  std::string text = "{\"a\": \",}\", \"b\\\",]\": 1 /* ,} */ , \"c\": 2}";
  EXPECT_EQ(blank_trailing_commas(text), text);
  std::string line = "{\"a\": 1 // ,}\n}";
  EXPECT_EQ(blank_trailing_commas(line), line);
}

TEST(JsonTextTest, PositionsAreOneBasedAndCountCharacters) {
  std::string text = "{\n  \"é\": 1}";
  EXPECT_EQ(position_of(text, 0).line, 1);
  EXPECT_EQ(position_of(text, 0).column, 1);
  TextPosition p = position_of(text, 5);  // the 'é' (two bytes) starts at byte 5
  EXPECT_EQ(p.line, 2);
  EXPECT_EQ(p.column, 4);
  TextPosition after = position_of(text, 7);  // the closing quote
  EXPECT_EQ(after.column, 5);
}

TEST(JsonTextTest, IndexesNestedKeysAndArrayElements) {
  std::string text = "{\n \"a\": {\"b\": [10, {\"c\": true}]},\n \"d\": 1}";
  KeyIndex idx = index_keys(text);
  ASSERT_TRUE(idx.find("a").has_value());
  EXPECT_EQ(*idx.find("a"), text.find("\"a\""));
  EXPECT_EQ(*idx.find("a.b"), text.find("\"b\""));
  EXPECT_EQ(*idx.find("a.b[0]"), text.find("10"));
  EXPECT_EQ(*idx.find("a.b[1]"), text.find("{\"c\""));
  EXPECT_EQ(*idx.find("a.b[1].c"), text.find("\"c\""));
  EXPECT_EQ(*idx.find("d"), text.find("\"d\""));
  EXPECT_FALSE(idx.duplicate_path.has_value());
}

TEST(JsonTextTest, FindsTheFirstDuplicateKey) {
  std::string text = "{\"z\": {\"stage\": 1, \"x\": 2, \"stage\": 3}, \"z2\": {\"q\": 1, \"q\": 2}}";
  KeyIndex idx = index_keys(text);
  ASSERT_TRUE(idx.duplicate_path.has_value());
  EXPECT_EQ(*idx.duplicate_path, "z.stage");
  EXPECT_EQ(idx.duplicate_offset, text.rfind("\"stage\""));
}

TEST(JsonTextTest, SameKeyInDifferentObjectsIsNotADuplicate) {
  KeyIndex idx = index_keys("{\"a\": {\"device\": 1}, \"b\": {\"device\": 2}}");
  EXPECT_FALSE(idx.duplicate_path.has_value());
}

TEST(JsonTextTest, ParsesCommentsAndTrailingCommas) {
  auto r = parse_json_text("// head\n{\"a\": [1, 2,], /* c */ \"b\": {\"c\": \"//x\",},}\n", "f.json");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->root["a"].size(), 2u);
  EXPECT_EQ(r->root["b"]["c"], "//x");
}

TEST(JsonTextTest, KeepsKeysInFileOrder) {
  auto r = parse_json_text("{\"z\": 1, \"a\": 2, \"m\": 3}", "f.json");
  ASSERT_TRUE(r.is_ok());
  std::vector<std::string> keys;
  for (auto it = r->root.begin(); it != r->root.end(); ++it) keys.push_back(it.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"z", "a", "m"}));
}

TEST(JsonTextTest, MissingCommaNamesLineAndColumnOfTheNextKey) {
  std::string text = "{\n  \"a\": 1\n  \"b\": 2\n}\n";
  auto r = parse_json_text(text, "ds_config.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(),
            "ds_config.json:3:3: syntax error while parsing object - unexpected string literal; "
            "expected '}'");
}

TEST(JsonTextTest, MissingValueNamesItsPosition) {
  auto r = parse_json_text("{\n  \"a\": 1,\n  \"b\": }", "x.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message().rfind("x.json:3:8: syntax error", 0), 0u) << r.status().message();
}

TEST(JsonTextTest, UnterminatedStringPointsAtTheEndOfItsLine) {
  auto r = parse_json_text("{\"a\": \"abc\n}", "x.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message().rfind("x.json:1:11: ", 0), 0u) << r.status().message();
  EXPECT_NE(r.status().message().find("control character"), std::string::npos);
}

TEST(JsonTextTest, EmptyInputIsAnError) {
  auto r = parse_json_text("  \n", "x.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("x.json:2:1: "), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("unexpected end of input"), std::string::npos);
}

TEST(JsonTextTest, TrailingGarbageIsAnError) {
  auto r = parse_json_text("{\"a\": 1} x", "x.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message().rfind("x.json:1:10: ", 0), 0u) << r.status().message();
}

TEST(JsonTextTest, NumberOverflowNamesItsPosition) {
  auto r = parse_json_text("{\n  \"a\": 1e999}", "x.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "x.json:2:8: number overflow parsing '1e999'");
}

TEST(JsonTextTest, DuplicateKeyIsAnErrorWithItsPosition) {
  auto r = parse_json_text("{\n \"zero_optimization\": {\n  \"stage\": 2,\n  \"stage\": 3\n }\n}",
                           "ds_config.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message().rfind("ds_config.json:4:3: zero_optimization.stage: duplicate key", 0),
            0u)
      << r.status().message();
}

TEST(JsonTextTest, CommaOnlyIsNotTrailingWhenAValueFollows) {
  // "[1,,2]" stays invalid: only a comma right before a closing bracket is blanked.
  auto r = parse_json_text("[1,,2]", "x.json");
  EXPECT_FALSE(r.is_ok());
}

}  // namespace
}  // namespace zinf::config::detail

namespace zinf::config::detail {
namespace {

// The one integer rule (common/json_check.h): ds_config takes whole floats (5e8 is the integer
// DeepSpeed reads), files zinf writes do not; both refuse fractions, strings and values past 2^63.
TEST(IntegerRuleTest, ConfigAndZinfFilesShareOneRuleAndDifferOnlyInWholeFloats) {
  using jsonck::IntError;
  using jsonck::WholeFloats;
  const auto read = [](const char* text, WholeFloats floats) {
    return jsonck::read_int64(nlohmann::json::parse(text), floats);
  };
  for (WholeFloats floats : {WholeFloats::kAccept, WholeFloats::kRefuse}) {
    EXPECT_EQ(read("42", floats).value, 42);
    EXPECT_EQ(read("-7", floats).value, -7);
    EXPECT_EQ(read("9223372036854775807", floats).value, INT64_MAX);
    EXPECT_EQ(read("9223372036854775808", floats).error, IntError::kOutOfRange);
    EXPECT_EQ(read("\"3\"", floats).error, IntError::kNotAnInteger);
    EXPECT_EQ(read("true", floats).error, IntError::kNotAnInteger);
  }
  EXPECT_EQ(read("5e8", WholeFloats::kAccept).value, 500000000);
  EXPECT_EQ(read("2.0", WholeFloats::kAccept).value, 2);
  EXPECT_EQ(read("2.5", WholeFloats::kAccept).error, IntError::kNotWhole);
  EXPECT_EQ(read("1e19", WholeFloats::kAccept).error, IntError::kOutOfRange);
  EXPECT_EQ(read("5e8", WholeFloats::kRefuse).error, IntError::kNotAnInteger);
  EXPECT_EQ(read("2.5", WholeFloats::kRefuse).error, IntError::kNotAnInteger);
  // The two readers' messages.
  EXPECT_NE(jsonck::int_value(nlohmann::json::parse("2.0"), 0, 9, {"f.json", "k"}).status().message().find(
                "f.json: k: expected an integer from 0 to 9, got 2.0"),
            std::string::npos);
  EXPECT_TRUE(testing::parse(R"({"train_batch_size": 2.0})").is_ok());
  EXPECT_NE(testing::error_of(R"({"train_batch_size": 2, "zero_optimization": {"sub_group_size": 2.5}})")
                .find("sub_group_size: expected a non-negative integer, got 2.5 (not a whole number)"),
            std::string::npos);
}

}  // namespace
}  // namespace zinf::config::detail
