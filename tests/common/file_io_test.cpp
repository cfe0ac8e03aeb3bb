// Tests for the common file toolkit: exact transfers, the end of a file, atomic replace, the small-file cap.
#include "common/file_io.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "temp_dir.h"

namespace zinf::fileio {
namespace {

using zinf::testing::TempDir;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

// A system call that moves at most 3 bytes at a time and is interrupted every other time:
// the loop must keep going until every byte has moved, in order.
TEST(TransferExact, ContinuesShortTransfersEintrAndEagain) {
  const std::string src = "0123456789abcdefghijklmnopqrstuvwxyz";
  std::string dst(src.size(), '.');
  int calls = 0;
  const Status st = transfer_exact("pwrite", "/fake", 0, src.size(), /*reading=*/false, -1, [&](std::size_t done) {
    ++calls;
    if (calls % 4 == 1) {
      errno = EINTR;
      return ssize_t{-1};
    }
    if (calls % 4 == 2) {
      errno = EAGAIN;
      return ssize_t{-1};
    }
    const std::size_t n = std::min<std::size_t>(3, src.size() - done);
    std::memcpy(dst.data() + done, src.data() + done, n);
    return static_cast<ssize_t>(n);
  });
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(dst, src);
}

TEST(TransferExact, ErrorNamesOpPathOffsetLengthAndErrno) {
  const Status st = transfer_exact("pwrite", "/nvme/x.swp", 4096, 100, false, -1, [](std::size_t done) {
    if (done == 0) return ssize_t{40};
    errno = EIO;
    return ssize_t{-1};
  });
  EXPECT_EQ(st.code(), ErrorCode::kIoError);
  EXPECT_EQ(st.sys_errno(), EIO);
  // The failing call started 40 bytes in.
  EXPECT_TRUE(contains(st.message(), "pwrite /nvme/x.swp offset 4136 length 60")) << st.message();
  EXPECT_TRUE(contains(st.message(), std::strerror(EIO))) << st.message();
}

TEST(TransferExact, WriteOfNothingIsAnErrorNotALoop) {
  const Status st = transfer_exact("pwrite", "/f", 0, 10, false, -1, [](std::size_t) { return ssize_t{0}; });
  EXPECT_EQ(st.code(), ErrorCode::kIoError);
}

TEST(PreadExact, EndOfFileNamesPathOffsetAndWhereItEnds) {
  TempDir dir;
  const std::string path = dir.write("ten", "0123456789");
  char buf[16];
  const Status st = pread_exact(path, buf, sizeof(buf), 4);
  ASSERT_EQ(st.code(), ErrorCode::kOutOfRange) << st.to_string();
  EXPECT_TRUE(contains(st.message(), path)) << st.message();
  EXPECT_TRUE(contains(st.message(), "offset 4 length 16")) << st.message();
  EXPECT_TRUE(contains(st.message(), "ends at byte 10")) << st.message();
  // Reading exactly up to the end is fine.
  ASSERT_TRUE(pread_exact(path, buf, 6, 4).is_ok());
  EXPECT_EQ(std::string(buf, 6), "456789");
}

TEST(PwriteAll, RoundTripsAtAnOffset) {
  TempDir dir;
  const std::string path = dir.file("f");
  auto fd = open_file(path, O_RDWR | O_CREAT | O_EXCL);
  ASSERT_TRUE(fd.is_ok()) << fd.status().to_string();
  std::vector<char> data(1 << 20);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  ASSERT_TRUE(pwrite_all(fd->get(), path, data.data(), data.size(), 100).is_ok());
  std::vector<char> back(data.size());
  ASSERT_TRUE(pread_exact(fd->get(), path, back.data(), back.size(), 100).is_ok());
  EXPECT_EQ(back, data);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);  // the toolkit's default mode is owner-only
}

extern "C" void count_signal(int) {}

// Real short writes and EINTR: a pipe holds 64 KiB, so a 4 MiB write blocks, and signals
// (installed without SA_RESTART) interrupt it part way; write_all must still deliver every byte.
TEST(WriteAll, SurvivesSignalsOnAPipe) {
  struct sigaction sa {};
  struct sigaction old {};
  sa.sa_handler = count_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: blocked writes return early
  ASSERT_EQ(::sigaction(SIGUSR1, &sa, &old), 0);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  UniqueFd rd(fds[0]), wr(fds[1]);
  std::vector<char> data(std::size_t{4} << 20);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + (i >> 12));
  std::atomic<bool> done{false};
  Status written;
  std::thread writer([&] {
    written = write_all(wr.get(), "pipe", data.data(), data.size());
    wr.reset();
    done = true;
  });
  const pthread_t writer_thread = writer.native_handle();
  std::vector<char> got;
  std::vector<char> chunk(4096);
  for (int i = 0;; ++i) {
    if (i % 4 == 0 && !done) ::pthread_kill(writer_thread, SIGUSR1);
    const ssize_t n = ::read(rd.get(), chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) continue;
    ASSERT_GE(n, 0) << std::strerror(errno);
    if (n == 0) break;
    got.insert(got.end(), chunk.begin(), chunk.begin() + n);
  }
  writer.join();
  ::sigaction(SIGUSR1, &old, nullptr);
  ASSERT_TRUE(written.is_ok()) << written.to_string();
  EXPECT_TRUE(got == data) << "received " << got.size() << " of " << data.size() << " bytes, or different bytes";
}

TEST(ReadSmallFile, RefusesAFileOverItsCap) {
  TempDir dir;
  const std::string path = dir.write("big", std::string(100, 'x'));
  auto ok = read_small_file(path, 100);
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(ok->size(), 100u);
  auto refused = read_small_file(path, 99);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_TRUE(contains(refused.status().message(), path)) << refused.status().message();
  EXPECT_TRUE(contains(refused.status().message(), "99-byte limit")) << refused.status().message();
}

TEST(ReadSmallFile, ReadsFilesThatStatAsEmpty) {
  // procfs files report size 0: the read goes to the end of the data, still under the cap.
  auto text = read_small_file("/proc/self/status");
  ASSERT_TRUE(text.is_ok()) << text.status().to_string();
  EXPECT_TRUE(contains(*text, "Pid:"));
  EXPECT_EQ(read_small_file("/proc/self/status", 10).status().code(), ErrorCode::kResourceExhausted);
}

TEST(ReadSmallFile, MissingFileIsNotFoundNamingIt) {
  TempDir dir;
  auto r = read_small_file(dir.file("nope"));
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(contains(r.status().message(), dir.file("nope")));
}

TEST(AtomicFile, ReplacesWholeFileWithOwnerOnlyMode) {
  TempDir dir;
  const std::string path = dir.write("f", "old");
  ASSERT_TRUE(write_file_atomic(path, "new contents").is_ok());
  EXPECT_EQ(slurp(path), "new contents");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"f"});  // no temporary left behind
}

TEST(AtomicFile, AbandonedWriteLeavesOldContent) {
  TempDir dir;
  const std::string path = dir.write("f", "old");
  {
    auto f = AtomicFile::create(path);
    ASSERT_TRUE(f.is_ok());
    ASSERT_TRUE(f->append("half of the new", 15).is_ok());
  }  // destroyed without commit
  EXPECT_EQ(slurp(path), "old");
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"f"});
}

// A write that really fails half way (the file size limit, EFBIG, after a short write): the
// error says so, the old file is intact and the temporary is gone.
TEST(AtomicFile, FailedWriteLeavesOldContent) {
  TempDir dir;
  const std::string path = dir.write("f", "old");
  struct rlimit old_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  void (*old_handler)(int) = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const Status st = write_file_atomic(path, std::string(10000, 'n'));
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.sys_errno(), EFBIG) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "offset 4096")) << st.message();  // the short write was continued
  EXPECT_EQ(slurp(path), "old");
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"f"});
}

TEST(AtomicFile, FailedRenameLeavesOldContentAndNoTemporary) {
  TempDir dir;
  const std::string path = dir.sub("a_folder");  // rename of a file over a folder fails
  const Status st = write_file_atomic(path, "text");
  ASSERT_FALSE(st.is_ok());
  EXPECT_TRUE(contains(st.message(), "rename")) << st.message();
  EXPECT_TRUE(std::filesystem::is_directory(path));
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"a_folder"});
}

TEST(OpenFile, NoFollowRefusesAPlantedSymlink) {
  TempDir dir;
  const std::string target = dir.write("target", "precious");
  const std::string link = dir.file("link");
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  auto fd = open_file(link, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, kPrivateFileMode, "swap data");
  ASSERT_FALSE(fd.is_ok());
  EXPECT_EQ(fd.status().sys_errno(), ELOOP);
  EXPECT_TRUE(contains(fd.status().message(), link)) << fd.status().message();
  EXPECT_TRUE(contains(fd.status().message(), "symbolic link")) << fd.status().message();
  EXPECT_EQ(slurp(target), "precious");
}

TEST(AtomicFile, APlantedSymlinkIsReplacedNotFollowed) {
  TempDir dir;
  const std::string victim = dir.write("victim", "precious");
  const std::string path = dir.file("config");
  ASSERT_EQ(::symlink(victim.c_str(), path.c_str()), 0);
  ASSERT_TRUE(write_file_atomic(path, "mine").is_ok());
  EXPECT_EQ(slurp(victim), "precious");
  EXPECT_FALSE(std::filesystem::is_symlink(path));
  EXPECT_EQ(slurp(path), "mine");
}

TEST(FileLock, SecondHolderIsRefusedNamingThePid) {
  TempDir dir;
  const std::string path = dir.file("zinf.lock");
  auto first = FileLock::acquire(path, "swap folder X");
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  EXPECT_EQ(slurp(path), std::to_string(::getpid()) + "\n");
  auto second = FileLock::acquire(path, "swap folder X");
  ASSERT_FALSE(second.is_ok());
  EXPECT_EQ(second.status().code(), ErrorCode::kInvalidArgument);
  const std::string msg = second.status().message();
  EXPECT_TRUE(contains(msg, "swap folder X is in use by another zinf process")) << msg;
  EXPECT_TRUE(contains(msg, "pid " + std::to_string(::getpid()))) << msg;
  EXPECT_TRUE(contains(msg, path)) << msg;
  { auto released = std::move(first); }
  EXPECT_TRUE(FileLock::acquire(path, "swap folder X").is_ok());
}

TEST(FileLock, ASymlinkAtTheLockIsRefused) {
  TempDir dir;
  const std::string victim = dir.write("victim", "precious");
  const std::string path = dir.file("zinf.lock");
  ASSERT_EQ(::symlink(victim.c_str(), path.c_str()), 0);
  auto lock = FileLock::acquire(path, "x");
  ASSERT_FALSE(lock.is_ok());
  EXPECT_EQ(lock.status().sys_errno(), ELOOP);
  EXPECT_EQ(slurp(victim), "precious");
}

TEST(MakePrivateDirs, CreatesOwnerOnlyFoldersAndRefusesLinks) {
  TempDir dir;
  ASSERT_TRUE(make_private_dirs(dir.path(), {"a", "b"}).is_ok());
  struct stat st {};
  ASSERT_EQ(::stat((dir.path() + "/a/b").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_TRUE(make_private_dirs(dir.path(), {"a", "b"}).is_ok());  // existing: fine
  const std::string elsewhere = dir.sub("elsewhere");
  ASSERT_EQ(::symlink(elsewhere.c_str(), (dir.path() + "/c").c_str()), 0);
  const Status st2 = make_private_dirs(dir.path(), {"c", "d"});
  ASSERT_FALSE(st2.is_ok());
  EXPECT_TRUE(contains(st2.message(), dir.path() + "/c")) << st2.message();
  EXPECT_TRUE(contains(st2.message(), "symbolic link")) << st2.message();
  EXPECT_FALSE(std::filesystem::exists(elsewhere + "/d"));
}

// rename and mkdir go through the fault hook: the site names both paths of a rename; an injected
// errno fails the call with an error naming the path(s) and leaves the file system as it was;
// EINTR is retried; the other kinds run the real call.
TEST(FaultHook, RenameAndMkdirAskTheHook) {
  TempDir dir;
  const std::string from = dir.write("from", "x");
  const std::string to = dir.path() + "/to";
  const std::string sub = dir.path() + "/sub";
  std::vector<std::string> sites;
  InjectedFault next;
  set_fault_hook([&](const FaultSite& site) {
    sites.push_back(fmt::format("{} {}{}", site.op, site.path, site.new_path ? " -> " + *site.new_path : ""));
    return std::exchange(next, InjectedFault{});
  });
  next = {FaultKind::kErrno, ENOSPC};
  const Status renamed = rename_path(from, to);
  next = {FaultKind::kErrno, EIO};
  const Status made = make_dir(sub);
  EXPECT_EQ(renamed.sys_errno(), ENOSPC);
  EXPECT_TRUE(contains(renamed.message(), "rename " + from + " to " + to)) << renamed.message();
  EXPECT_EQ(made.sys_errno(), EIO);
  EXPECT_TRUE(contains(made.message(), "mkdir " + sub)) << made.message();
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"from"});
  next = {FaultKind::kErrno, EINTR};
  EXPECT_TRUE(rename_path(from, to).is_ok());
  next = {FaultKind::kShort, 0};
  EXPECT_TRUE(make_dir(sub).is_ok());
  EXPECT_TRUE(make_dir(sub).is_ok());  // already there: fine
  next = {FaultKind::kErrno, ENOSPC};
  EXPECT_FALSE(make_private_dirs(dir.path(), {"private"}).is_ok());
  set_fault_hook({});
  EXPECT_TRUE(std::filesystem::is_directory(sub));
  EXPECT_EQ(slurp(to), "x");
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/private"));
  EXPECT_EQ(sites, (std::vector<std::string>{"rename " + from + " -> " + to, "mkdir " + sub,
                                             "rename " + from + " -> " + to, "rename " + from + " -> " + to,
                                             "mkdir " + sub, "mkdir " + sub, "mkdir " + dir.path() + "/private"}));
}

TEST(ParentDir, Cases) {
  EXPECT_EQ(parent_dir("a/b/c"), "a/b");
  EXPECT_EQ(parent_dir("c"), ".");
  EXPECT_EQ(parent_dir("/c"), "/");
}

}  // namespace
}  // namespace zinf::fileio
