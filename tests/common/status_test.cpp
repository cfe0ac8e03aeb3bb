// Tests for Status/Result: messages carry their context and errno text.
#include "zinf/status.h"

#include <cerrno>

#include <gtest/gtest.h>

namespace zinf {
namespace {

TEST(StatusTest, OkIsOk) {
  Status s;
  EXPECT_TRUE(s.is_ok());
  EXPECT_EQ(s.to_string(), "OK");
  EXPECT_TRUE(s.with_context("anything").is_ok());
}

TEST(StatusTest, IoErrorNamesEverything) {
  Status s = Status::io_error("pwrite", "/nvme/a.swp", 4096, 8192, EIO);
  EXPECT_EQ(s.code(), ErrorCode::kIoError);
  EXPECT_EQ(s.sys_errno(), EIO);
  EXPECT_EQ(s.message(), "pwrite /nvme/a.swp offset 4096 length 8192: Input/output error");
}

TEST(StatusTest, NoSpaceIsResourceExhausted) {
  Status s = Status::io_error("pwrite", "/x", 0, 1, ENOSPC);
  EXPECT_EQ(s.code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(s.message().find("No space left on device"), std::string::npos);
}

TEST(StatusTest, ContextIsPrepended) {
  Status s = Status::sys_error("open /missing/dir/f", ENOENT).with_context("swap store");
  EXPECT_EQ(s.code(), ErrorCode::kNotFound);
  EXPECT_EQ(s.message(), "swap store: open /missing/dir/f: No such file or directory");
  EXPECT_EQ(s.to_string(), "NotFound: swap store: open /missing/dir/f: No such file or directory");
}

Result<int> half(int x) {
  if (x % 2 != 0) return Status::invalid_argument("odd");
  return x / 2;
}

Status quarter(int x, int* out) {
  ZINF_ASSIGN_OR_RETURN(int h, half(x));
  ZINF_ASSIGN_OR_RETURN(*out, half(h));
  return Status::ok();
}

TEST(ResultTest, ValueAndErrorPropagate) {
  int out = 0;
  EXPECT_TRUE(quarter(8, &out).is_ok());
  EXPECT_EQ(out, 2);
  Status s = quarter(6, &out);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd");
}

}  // namespace
}  // namespace zinf
