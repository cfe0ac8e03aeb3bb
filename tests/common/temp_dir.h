// Test helper shared by every suite: a fresh folder per test, removed with its contents.
#pragma once

#include <string>
#include <string_view>

namespace zinf::testing {

// A new folder under $ZINF_TEST_TMPDIR (or /tmp) named <prefix>XXXXXX; removed, with anything a
// test made read-only in it, on destruction. A failed mkdtemp is a test failure.
class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "zinf_test_");
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
  std::string path_;
};

}  // namespace zinf::testing
