// TempDir and the scratch folders a child dropped to nobody must reach wherever the checkout lives.
#include "temp_dir.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>

#include <gtest/gtest.h>

namespace zinf::testing {
namespace {

// Sets $ZINF_TEST_TMPDIR for one test and puts the old value back.
class ScopedTestTmpdir {
 public:
  explicit ScopedTestTmpdir(const std::string& value) {
    if (const char* old = std::getenv("ZINF_TEST_TMPDIR")) old_ = old;
    ::setenv("ZINF_TEST_TMPDIR", value.c_str(), 1);
  }
  ~ScopedTestTmpdir() {
    if (old_) {
      ::setenv("ZINF_TEST_TMPDIR", old_->c_str(), 1);
    } else {
      ::unsetenv("ZINF_TEST_TMPDIR");
    }
  }
  ScopedTestTmpdir(const ScopedTestTmpdir&) = delete;
  ScopedTestTmpdir& operator=(const ScopedTestTmpdir&) = delete;

 private:
  std::optional<std::string> old_;
};

// Whether uid kNobodyUid can search `folder` (made 0755 first), checked in a child that drops to it.
bool nobody_can_enter(const std::string& folder) {
  if (::chmod(folder.c_str(), 0755) != 0) return false;
  const pid_t pid = ::fork();
  if (pid < 0) return false;
  if (pid == 0) {
    if (!drop_to_nobody().empty()) ::_exit(2);
    ::_exit(::access(folder.c_str(), X_OK) == 0 ? 0 : 1);
  }
  int status = 0;
  return ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

TEST(TempDirTest, RemovesWhatATestLockedInside) {
  std::string path;
  {
    TempDir dir;
    path = dir.path();
    const std::string locked = dir.sub("locked");
    dir.write("locked_file", "x");
    ASSERT_EQ(::chmod(dir.file("locked_file").c_str(), 0), 0);
    ASSERT_EQ(::chmod(locked.c_str(), 0500), 0);
  }
  struct stat st {};
  EXPECT_NE(::stat(path.c_str(), &st), 0) << path << " is still there";
}

TEST(TempDirTest, NobodysFolderStaysUnderTheTestTmpdirWhenNobodyCanReachIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to switch to uid " << kNobodyUid;
  TempDir open_parent;
  ASSERT_EQ(::chmod(open_parent.path().c_str(), 0755), 0);
  if (!nobody_can_enter(open_parent.path())) GTEST_SKIP() << "uid " << kNobodyUid << " cannot reach " << open_parent.path();
  const std::string root = open_parent.sub("tmp");
  ASSERT_EQ(::chmod(root.c_str(), 0755), 0);
  ScopedTestTmpdir env(root);
  std::string why;
  const auto dir = temp_dir_nobody_can_reach(&why);
  ASSERT_NE(dir, nullptr) << why;
  EXPECT_TRUE(starts_with(dir->path(), root + "/")) << dir->path();
  EXPECT_TRUE(nobody_can_enter(dir->path())) << dir->path();
}

// A checkout under a 0700 folder (a clone in `mktemp -d`, or under /root): nobody cannot pass
// it, so the folder goes under /tmp instead, where it can.
TEST(TempDirTest, NobodysFolderLeavesATestTmpdirBehindA0700Folder) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to switch to uid " << kNobodyUid;
  TempDir closed_parent;  // mkdtemp: 0700
  const std::string root = closed_parent.sub("build/tests/tmp");
  ScopedTestTmpdir env(root);
  std::string why;
  const auto dir = temp_dir_nobody_can_reach(&why);
  if (dir == nullptr) {
    // Only when /tmp is closed to nobody as well; then the reason names both refusals.
    EXPECT_NE(why.find(closed_parent.path()), std::string::npos) << why;
    EXPECT_NE(why.find("/tmp"), std::string::npos) << why;
    GTEST_SKIP() << why;
  }
  EXPECT_FALSE(starts_with(dir->path(), closed_parent.path() + "/")) << dir->path();
  EXPECT_TRUE(starts_with(dir->path(), "/tmp/")) << dir->path();
  EXPECT_TRUE(nobody_can_enter(dir->path())) << dir->path();
}

TEST(TempDirTest, DropToNobodyNeedsRoot) {
  if (::geteuid() == 0) GTEST_SKIP() << "runs as root; the refusal is for other users";
  EXPECT_NE(drop_to_nobody(), "");
  std::string why;
  EXPECT_EQ(temp_dir_nobody_can_reach(&why), nullptr);
  EXPECT_NE(why.find("needs root"), std::string::npos) << why;
}

}  // namespace
}  // namespace zinf::testing
