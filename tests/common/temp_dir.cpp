// TempDir: per-test folders under $ZINF_TEST_TMPDIR; the folders a child dropped to nobody reaches.
#include "temp_dir.h"

#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include <gtest/gtest.h>

namespace zinf::testing {
namespace {

std::string default_root() {
  const char* base = std::getenv("ZINF_TEST_TMPDIR");
  return base != nullptr && *base != '\0' ? base : "/tmp";
}

// `folder` and each folder above it, outermost first: /a/b/c -> /, /a, /a/b, /a/b/c.
std::vector<std::string> folder_and_ancestors(const std::filesystem::path& folder) {
  std::vector<std::string> chain;
  std::filesystem::path prefix;
  for (const auto& part : folder) {
    prefix /= part;
    chain.push_back(prefix.string());
  }
  return chain;
}

// "" when kNobodyUid may search `folder` and every folder above it, else which one it may not.
// Checked by that user in a forked child, so ownership, groups, ACLs and security modules all count.
std::string why_nobody_cannot_reach(const std::string& folder) {
  std::error_code ec;
  const std::filesystem::path canonical = std::filesystem::canonical(folder, ec);
  if (ec) return folder + ": " + ec.message();
  const std::vector<std::string> chain = folder_and_ancestors(canonical);
  constexpr int kDropFailed = 255;
  const pid_t pid = ::fork();
  if (pid < 0) return std::string("fork: ") + std::strerror(errno);
  if (pid == 0) {
    if (!drop_to_nobody().empty()) ::_exit(kDropFailed);
    for (std::size_t i = 0; i < chain.size() && i + 1 < kDropFailed; ++i) {
      if (::access(chain[i].c_str(), X_OK) != 0) ::_exit(static_cast<int>(i) + 1);
    }
    ::_exit(0);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return std::string("waitpid: ") + std::strerror(errno);
  }
  if (!WIFEXITED(status)) return "the probe child died with signal " + std::to_string(WTERMSIG(status));
  const int code = WEXITSTATUS(status);
  if (code == 0) return "";
  if (code == kDropFailed) return "cannot switch to uid " + std::to_string(kNobodyUid);
  struct stat st {};
  const std::string& refused = chain[static_cast<std::size_t>(code - 1)];
  char mode[8] = "?";
  if (::stat(refused.c_str(), &st) == 0) std::snprintf(mode, sizeof(mode), "%04o", st.st_mode & 07777);
  return folder + ": uid " + std::to_string(kNobodyUid) + " may not search " + refused + " (mode " + mode +
         ", owner uid " + std::to_string(st.st_uid) + ")";
}

}  // namespace

std::string drop_to_nobody() {
  if (::geteuid() != 0) return "needs root to switch to uid " + std::to_string(kNobodyUid);
  if (::setgroups(0, nullptr) != 0 || ::setresgid(kNobodyGid, kNobodyGid, kNobodyGid) != 0 ||
      ::setresuid(kNobodyUid, kNobodyUid, kNobodyUid) != 0) {
    return "cannot switch to uid " + std::to_string(kNobodyUid) + ": " + std::strerror(errno);
  }
  return "";
}

std::unique_ptr<TempDir> temp_dir_nobody_can_reach(std::string* why, std::string_view prefix) {
  std::string refusals;
  if (::geteuid() != 0) {
    refusals = "needs root to switch to uid " + std::to_string(kNobodyUid);
  } else {
    std::vector<std::string> roots{default_root()};
    if (roots[0] != "/tmp") roots.emplace_back("/tmp");
    for (const std::string& root : roots) {
      std::error_code ec;
      std::filesystem::create_directories(root, ec);
      const std::string refused = why_nobody_cannot_reach(root);
      if (refused.empty()) return std::make_unique<TempDir>(prefix, root);
      refusals += (refusals.empty() ? "" : "; ") + refused;
    }
  }
  if (why != nullptr) *why = "no scratch folder uid " + std::to_string(kNobodyUid) + " can reach: " + refusals;
  return nullptr;
}

TempDir::TempDir(std::string_view prefix) { create(prefix, default_root()); }

TempDir::TempDir(std::string_view prefix, const std::string& root) { create(prefix, root); }

void TempDir::create(std::string_view prefix, const std::string& root) {
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
