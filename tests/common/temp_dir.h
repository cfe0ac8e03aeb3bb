// Test helper shared by every suite: a fresh folder per test, removed with its contents.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <string_view>

namespace zinf::testing {

// A new folder under $ZINF_TEST_TMPDIR (or /tmp) named <prefix>XXXXXX; removed, with anything a
// test made read-only in it, on destruction. A failed mkdtemp is a test failure.
class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "zinf_test_");
  // The same under `root` instead of $ZINF_TEST_TMPDIR.
  TempDir(std::string_view prefix, const std::string& root);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path()/name (not created).
  std::string file(std::string_view name) const { return path_ + "/" + std::string(name); }
  // Creates the folder path()/name (and parents) and returns it.
  std::string sub(std::string_view name) const;
  // Creates or overwrites the file path()/name with `text` and returns its path.
  std::string write(std::string_view name, std::string_view text) const;

 private:
  void create(std::string_view prefix, const std::string& root);
  std::string path_;
};

// The unprivileged user the permission tests switch to in a child process.
inline constexpr uid_t kNobodyUid = 65534;
inline constexpr gid_t kNobodyGid = 65534;

// Makes this process uid and gid kNobodyUid/kNobodyGid (real, effective and saved) with no
// supplementary groups. Call it only in a forked child: it cannot be undone. Returns "" or why
// it failed (not root, or the switch was refused).
std::string drop_to_nobody();

// A TempDir that kNobodyUid can reach: every folder above it grants that user search (x)
// permission, so a child that drop_to_nobody() may work in it wherever the checkout lives (a
// clone under a 0700 folder such as /root included). The folder itself keeps mkdtemp's 0700;
// the test opens it as far as it needs. Tries $ZINF_TEST_TMPDIR, then /tmp; returns nullptr,
// with *why naming what each refused, when neither works: the test then skips with that reason.
std::unique_ptr<TempDir> temp_dir_nobody_can_reach(std::string* why, std::string_view prefix = "zinf_test_");

}  // namespace zinf::testing
