// TempDir: per-test folders under $ZINF_TEST_TMPDIR.
#include "temp_dir.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace zinf::testing {

TempDir::TempDir(std::string_view prefix) {
  const char* base = std::getenv("ZINF_TEST_TMPDIR");
  const std::string root = base != nullptr && *base != '\0' ? base : "/tmp";
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  std::string templ = root + "/" + std::string(prefix) + "XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << templ << ": " << std::strerror(errno);
    return;
  }
  path_ = templ;
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  std::error_code ec;
  // Give back write permission on anything a test locked, then remove it all.
  for (auto it = std::filesystem::recursive_directory_iterator(path_, ec);
       it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    std::filesystem::permissions(it->path(), std::filesystem::perms::owner_all, std::filesystem::perm_options::add,
                                 ec);
  }
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::sub(std::string_view name) const {
  const std::string p = file(name);
  std::filesystem::create_directories(p);
  return p;
}

std::string TempDir::write(std::string_view name, std::string_view text) const {
  const std::string p = file(name);
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
  return p;
}

}  // namespace zinf::testing
