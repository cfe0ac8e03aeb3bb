// Tests of the swap store: striped layout, alignment, space reuse, manifest and reopening.
#include "zinf/swap/swap_store.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "swap/host_buffer.h"
#include "swap_test_util.h"

namespace zinf::swap {
namespace {

using testing::TempDir;

struct Tensor {
  std::string key;
  DType dtype;
  std::uint64_t numel;
  std::uint64_t seed;
};

const std::vector<Tensor>& sample_tensors() {
  static const std::vector<Tensor> t = {
      {"param/h.0.attn.c_attn.weight", DType::kBF16, 3 * 64 * 1024 + 77, 11},
      {"param/h.0.ln_1.bias", DType::kBF16, 5, 12},
      {"optim/subgroup0/exp_avg", DType::kF32, 100000, 13},
      {"optim/subgroup0/master", DType::kF32, 65536, 14},
      {"grad/empty", DType::kF16, 0, 15},
  };
  return t;
}

std::unique_ptr<SwapStore> open_store(aio::Handle& h, std::vector<std::string> paths, OpenMode mode,
                                      std::size_t stripe = 64 << 10) {
  StoreConfig c;
  c.nvme_paths = std::move(paths);
  c.rank = 3;
  c.kind = StoreKind::kOptimizer;
  c.stripe_unit = stripe;
  Result<std::unique_ptr<SwapStore>> s = SwapStore::open(c, mode, h);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? std::move(s).value() : nullptr;
}

void write_tensor(SwapStore& s, const Tensor& t) {
  ASSERT_TRUE(s.allocate(t.key, t.dtype, t.numel).is_ok());
  const std::size_t n = t.numel * dtype_size(t.dtype);
  Result<detail::HostBuffer> buf = detail::HostBuffer::allocate(n, false);
  ASSERT_TRUE(buf.is_ok());
  testing::fill_pattern(buf->data(), n, 0, t.seed);
  const Status st = s.write(t.key, 0, buf->data(), n);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
}

// Empty string when the tensor reads back exactly.
std::string verify_tensor(SwapStore& s, const Tensor& t) {
  Result<TensorRecord> r = s.find(t.key);
  if (!r.is_ok()) return r.status().to_string();
  if (r->dtype != t.dtype || r->numel != t.numel) return "shape differs for " + t.key;
  const std::size_t n = t.numel * dtype_size(t.dtype);
  Result<detail::HostBuffer> buf = detail::HostBuffer::allocate(n, false);
  if (!buf.is_ok()) return buf.status().to_string();
  const Status st = s.read(t.key, 0, buf->data(), n);
  if (!st.is_ok()) return st.to_string();
  const std::int64_t bad = testing::first_mismatch(buf->data(), n, 0, t.seed);
  return bad < 0 ? "" : t.key + " differs at byte " + std::to_string(bad);
}

class SwapStoreStripes : public ::testing::TestWithParam<int> {};

TEST_P(SwapStoreStripes, RoundTripsAlignedStripedExtents) {
  TempDir dir;
  std::vector<std::string> paths;
  for (int i = 0; i < GetParam(); ++i) paths.push_back(dir.sub("nvme" + std::to_string(i)));
  auto h = testing::make_handle();
  auto s = open_store(*h, paths, OpenMode::kCreate);
  ASSERT_TRUE(s);
  for (const Tensor& t : sample_tensors()) write_tensor(*s, t);
  for (const Tensor& t : sample_tensors()) EXPECT_EQ(verify_tensor(*s, t), "");
  for (int i = 0; i < GetParam(); ++i) {
    EXPECT_TRUE(std::filesystem::exists(paths[i] + "/zinf_swap/rank3/optimizer/stripe" + std::to_string(i) + ".swp"));
  }
  Result<TensorRecord> big = s->find(sample_tensors()[0].key);
  ASSERT_TRUE(big.is_ok());
  // 393370 bytes -> 397312 padded -> 7 units of 64 KiB (the last 4 KiB): min(7, F) extents.
  EXPECT_EQ(big->extents.size(), static_cast<std::size_t>(std::min(7, GetParam())));
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < big->extents.size(); ++i) {
    EXPECT_EQ(big->extents[i].file, i);
    EXPECT_EQ(big->extents[i].offset % kSwapAlignment, 0u);
    EXPECT_EQ(big->extents[i].length % kSwapAlignment, 0u);
    total += big->extents[i].length;
  }
  EXPECT_EQ(total, align_up(big->nbytes, kSwapAlignment));
}

INSTANTIATE_TEST_SUITE_P(Paths, SwapStoreStripes, ::testing::Values(1, 3));

TEST(SwapStore, FilesFollowTheDocumentedStripeLayout) {
  TempDir dir;
  const std::vector<std::string> paths = {dir.sub("a"), dir.sub("b")};
  auto h = testing::make_handle();
  auto s = open_store(*h, paths, OpenMode::kCreate, 8192);
  ASSERT_TRUE(s);
  const Tensor t{"t", DType::kF32, 9000, 77};  // 36000 bytes, padded to 36864: 5 units of 8 KiB
  write_tensor(*s, t);
  ASSERT_TRUE(s->commit().is_ok());
  Result<TensorRecord> r = s->find("t");
  ASSERT_TRUE(r.is_ok());
  // Unit u lives in file u % 2 at extent offset + (u / 2) * 8192.
  for (std::uint64_t pos = 0; pos < r->nbytes; pos += 997) {
    const std::uint64_t u = pos / 8192;
    const Extent& e = r->extents[u % 2];
    std::ifstream f(s->data_files()[u % 2], std::ios::binary);
    f.seekg(static_cast<std::streamoff>(e.offset + (u / 2) * 8192 + pos % 8192));
    char c = 0;
    f.read(&c, 1);
    ASSERT_EQ(static_cast<std::uint8_t>(c), testing::pattern_byte(pos, t.seed)) << "byte " << pos;
  }
}

TEST(SwapStore, SameSizeRewritesInPlaceAndFreedSpaceIsReused) {
  TempDir dir;
  auto h = testing::make_handle();
  auto s = open_store(*h, {dir.path()}, OpenMode::kCreate);
  ASSERT_TRUE(s);
  Result<TensorRecord> a = s->allocate("a", DType::kF32, 50000);
  Result<TensorRecord> b = s->allocate("b", DType::kF32, 50000);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  Result<TensorRecord> a2 = s->allocate("a", DType::kF32, 50001);  // same padded size
  ASSERT_TRUE(a2.is_ok());
  EXPECT_EQ(a2->extents[0].offset, a->extents[0].offset);
  const std::uint64_t size_before = s->stats().file_bytes;
  ASSERT_TRUE(s->erase("a").is_ok());
  Result<TensorRecord> c = s->allocate("c", DType::kBF16, 100000);  // fits a's old space
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->extents[0].offset, a->extents[0].offset);
  EXPECT_EQ(s->stats().file_bytes, size_before);
  EXPECT_EQ(s->erase("a").code(), ErrorCode::kNotFound);
}

TEST(SwapStore, RejectsMisalignedRanges) {
  TempDir dir;
  auto h = testing::make_handle();
  auto s = open_store(*h, {dir.path()}, OpenMode::kCreate);
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->allocate("t", DType::kF32, 10000).is_ok());
  Result<detail::HostBuffer> buf = detail::HostBuffer::allocate(40000, false);
  ASSERT_TRUE(buf.is_ok());
  EXPECT_EQ(s->read("t", 100, buf->data(), 4096).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s->read("t", 0, buf->data(), 5000).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s->read("t", 36864, buf->data(), 8192).code(), ErrorCode::kInvalidArgument);  // past the end
  EXPECT_TRUE(s->write("t", 36864, buf->data(), 40000 - 36864).is_ok());                  // ends the tensor
  EXPECT_EQ(s->read("nope", 0, buf->data(), 4096).code(), ErrorCode::kNotFound);
}

TEST(SwapStore, ReopensFromTheManifest) {
  TempDir dir;
  const std::vector<std::string> paths = {dir.sub("a"), dir.sub("b"), dir.sub("c")};
  auto h = testing::make_handle();
  {
    auto s = open_store(*h, paths, OpenMode::kCreate);
    ASSERT_TRUE(s);
    for (const Tensor& t : sample_tensors()) write_tensor(*s, t);
    s->set_metadata("optimizer.step", "7");
    ASSERT_TRUE(s->commit().is_ok());
    // Tensors added after the last commit are not in the manifest.
    ASSERT_TRUE(s->allocate("uncommitted", DType::kF32, 10).is_ok());
    EXPECT_EQ(s->generation(), 1u);
  }
  auto s = open_store(*h, paths, OpenMode::kOpen);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->generation(), 1u);
  EXPECT_EQ(s->metadata("optimizer.step"), "7");
  EXPECT_FALSE(s->contains("uncommitted"));
  EXPECT_EQ(s->keys().size(), sample_tensors().size());
  for (const Tensor& t : sample_tensors()) EXPECT_EQ(verify_tensor(*s, t), "");
  // New space does not overlap the reopened tensors.
  write_tensor(*s, Tensor{"new", DType::kF32, 70000, 99});
  for (const Tensor& t : sample_tensors()) EXPECT_EQ(verify_tensor(*s, t), "");
}

TEST(SwapStore, OpenErrorsSayWhatIsWrong) {
  TempDir dir;
  auto h = testing::make_handle();
  StoreConfig c;
  c.nvme_paths = {dir.path()};
  Result<std::unique_ptr<SwapStore>> missing = SwapStore::open(c, OpenMode::kOpen, *h);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  c.nvme_paths = {};
  EXPECT_EQ(SwapStore::open(c, OpenMode::kCreate, *h).status().code(), ErrorCode::kInvalidArgument);
  c.nvme_paths = {dir.sub("x"), dir.sub("y")};
  {
    Result<std::unique_ptr<SwapStore>> s = SwapStore::open(c, OpenMode::kCreate, *h);
    ASSERT_TRUE(s.is_ok());
    ASSERT_TRUE((*s)->commit().is_ok());
  }
  StoreConfig fewer = c;
  fewer.nvme_paths.pop_back();
  Result<std::unique_ptr<SwapStore>> wrong = SwapStore::open(fewer, OpenMode::kOpen, *h);
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_NE(wrong.status().message().find("striped over 2 nvme_paths but 1"), std::string::npos);
  std::ofstream(dir.path() + "/x/zinf_swap/rank0/parameters/manifest.json") << "{not json";
  EXPECT_EQ(SwapStore::open(c, OpenMode::kOpen, *h).status().code(), ErrorCode::kCorruption);
}

TEST(SwapStore, ReadErrorNamesTheTensor) {
  TempDir dir;
  auto faults = std::make_shared<aio::FaultInjector>();
  auto h = testing::make_handle(faults);
  auto s = open_store(*h, {dir.path()}, OpenMode::kCreate);
  ASSERT_TRUE(s);
  const Tensor t{"optim/sg1/exp_avg", DType::kF32, 70000, 5};
  write_tensor(*s, t);
  faults->add(testing::fail_reads());
  Result<detail::HostBuffer> buf = detail::HostBuffer::allocate(280000, false);
  ASSERT_TRUE(buf.is_ok());
  const Status st = s->read(t.key, 0, buf->data(), 280000);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("read 'optim/sg1/exp_avg'"), std::string::npos) << st.to_string();
  EXPECT_EQ(verify_tensor(*s, t), "");  // the fault was one chunk; the data is intact
}

// Flips one byte of the data file under byte `at` of tensor `key` (stripe layout of swap_store.h);
// returns "<file> offset <start of that 4 KiB page in the file>".
std::string flip_byte(SwapStore& s, const std::string& key, std::uint64_t at) {
  Result<TensorRecord> r = s.find(key);
  EXPECT_TRUE(r.is_ok());
  const std::uint64_t unit = s.config().stripe_unit;
  const std::uint64_t files = s.data_files().size();
  const std::uint64_t u = at / unit;
  const Extent& e = r->extents[u % files];
  const std::uint64_t off = e.offset + (u / files) * unit + at % unit;
  const std::string path = s.data_files()[e.file];
  const int fd = ::open(path.c_str(), O_RDWR);
  EXPECT_GE(fd, 0);
  unsigned char c = 0;
  EXPECT_EQ(::pread(fd, &c, 1, static_cast<off_t>(off)), 1);
  c ^= 0x10;
  EXPECT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(off)), 1);
  ::close(fd);
  return path + " offset " + std::to_string(align_down(off, kSwapAlignment));
}

TEST(SwapStoreChecksums, DamagedPageIsCorruptionNamingTensorFileAndOffset) {
  TempDir dir;
  const std::vector<std::string> paths = {dir.sub("a"), dir.sub("b")};
  auto h = testing::make_handle();
  const Tensor t{"optim/sg0/master.s1", DType::kF32, 9000, 21};  // 36000 bytes, 9 pages over 2 files
  std::string where;
  {
    auto s = open_store(*h, paths, OpenMode::kCreate, 8192);
    ASSERT_TRUE(s);
    write_tensor(*s, t);
    ASSERT_TRUE(s->commit().is_ok());
    where = flip_byte(*s, t.key, 20000);  // page 4: bytes [16384, 20480)
    const std::string st = verify_tensor(*s, t);
    EXPECT_NE(st.find("Corruption"), std::string::npos) << st;
    EXPECT_NE(st.find("checksum mismatch in tensor 'optim/sg0/master.s1' bytes [16384, 20480)"), std::string::npos)
        << st;
    EXPECT_NE(st.find(where), std::string::npos) << st;
    // A read that does not cover the damaged page is fine.
    Result<detail::HostBuffer> buf = detail::HostBuffer::allocate(16384, false);
    ASSERT_TRUE(buf.is_ok());
    EXPECT_TRUE(s->read(t.key, 0, buf->data(), 16384).is_ok());
  }
  // The checksums live in the manifest: a reopened store (a new run) sees the damage too.
  auto s = open_store(*h, paths, OpenMode::kOpen, 8192);
  ASSERT_TRUE(s);
  const std::string st = verify_tensor(*s, t);
  EXPECT_NE(st.find("checksum mismatch"), std::string::npos) << st;
  EXPECT_NE(st.find(where), std::string::npos) << st;
  // Rewriting the tensor makes it whole again.
  write_tensor(*s, t);
  EXPECT_EQ(verify_tensor(*s, t), "");
}

TEST(SwapStoreChecksums, OffMeansNoCheck) {
  TempDir dir;
  auto h = testing::make_handle();
  StoreConfig c;
  c.nvme_paths = {dir.path()};
  c.checksums = false;
  auto s = std::move(SwapStore::open(c, OpenMode::kCreate, *h)).value();
  const Tensor t{"p", DType::kBF16, 5000, 3};
  write_tensor(*s, t);
  flip_byte(*s, t.key, 100);
  EXPECT_EQ(verify_tensor(*s, t), "p differs at byte 100");
}

TEST(SwapStoreChecksums, PagesNeverWrittenAreNotChecked) {
  TempDir dir;
  auto h = testing::make_handle();
  auto s = open_store(*h, {dir.path()}, OpenMode::kCreate);
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->allocate("t", DType::kF32, 4096).is_ok());  // 4 pages
  Result<detail::HostBuffer> buf = detail::HostBuffer::allocate(16384, false);
  ASSERT_TRUE(buf.is_ok());
  testing::fill_pattern(buf->data(), 16384, 0, 9);
  ASSERT_TRUE(s->write("t", 4096, buf->data(), 4096).is_ok());  // page 1 only
  EXPECT_TRUE(s->read("t", 0, buf->data(), 16384).is_ok());
  flip_byte(*s, "t", 4097);
  EXPECT_EQ(s->read("t", 0, buf->data(), 16384).code(), ErrorCode::kCorruption);
}

// A store written with checksums, reopened and rewritten without them, then reopened with them
// again: the old checksums were dropped, so the new data is not reported as damaged.
TEST(SwapStoreChecksums, RewrittenWithoutChecksumsLeavesNoStaleOnes) {
  TempDir dir;
  auto h = testing::make_handle();
  StoreConfig c;
  c.nvme_paths = {dir.path()};
  const Tensor first{"t", DType::kF32, 20000, 1}, second{"t", DType::kF32, 20000, 2};
  for (bool checksums : {true, false}) {
    c.checksums = checksums;
    auto s = std::move(SwapStore::open(c, OpenMode::kOpenOrCreate, *h)).value();
    write_tensor(*s, checksums ? first : second);
    ASSERT_TRUE(s->commit().is_ok());
  }
  c.checksums = true;
  auto s = std::move(SwapStore::open(c, OpenMode::kOpen, *h)).value();
  EXPECT_EQ(verify_tensor(*s, second), "");
  // From here on the pages are checked again.
  write_tensor(*s, first);
  flip_byte(*s, "t", 5000);
  EXPECT_NE(verify_tensor(*s, first).find("checksum mismatch"), std::string::npos);
}

// A crash after a commit stored new checksums but before its manifest was renamed into place
// (the optimizer's pattern: commit N rewrote slot "b" only): the old manifest still names b's
// old, intact checksum half, so the store opens, and "a", untouched since, reads back whole.
// Checksums written in place would fail the open here ("do not match the manifest").
TEST(SwapStoreChecksums, CrashBeforeTheManifestStillOpens) {
  TempDir dir;
  auto h = testing::make_handle();
  const Tensor a{"a", DType::kF32, 20000, 1}, b{"b", DType::kF32, 30000, 2};
  const std::string manifest_copy = dir.file("manifest.committed");
  {
    auto s = open_store(*h, {dir.path()}, OpenMode::kCreate);
    ASSERT_TRUE(s);
    write_tensor(*s, a);
    write_tensor(*s, b);
    ASSERT_TRUE(s->commit().is_ok());
    std::filesystem::copy_file(s->manifest_path(), manifest_copy);
    write_tensor(*s, Tensor{"b", DType::kF32, 30000, 3});
    ASSERT_TRUE(s->commit().is_ok());
    // The crash: the second commit's manifest never made it.
    std::filesystem::copy_file(manifest_copy, s->manifest_path(), std::filesystem::copy_options::overwrite_existing);
  }
  auto s = open_store(*h, {dir.path()}, OpenMode::kOpen);
  ASSERT_TRUE(s);
  EXPECT_EQ(verify_tensor(*s, a), "");
  // b was rewritten after the last commit: its bytes are not what that commit recorded.
  EXPECT_NE(verify_tensor(*s, b).find("checksum mismatch"), std::string::npos);
}

// The checksums themselves are checked when a store is opened.
TEST(SwapStoreChecksums, DamagedChecksumExtentIsRefusedAtOpen) {
  TempDir dir;
  auto h = testing::make_handle();
  const Tensor t{"optim/sg0/exp_avg.s0", DType::kF32, 20000, 4};
  Extent sums;
  std::uint64_t current = 0;
  std::string file;
  {
    auto s = open_store(*h, {dir.path()}, OpenMode::kCreate);
    ASSERT_TRUE(s);
    write_tensor(*s, t);
    ASSERT_TRUE(s->commit().is_ok());
    sums = s->find(t.key)->sums;
    current = sums.offset + s->find(t.key)->sums_half * (sums.length / 2);  // the committed half
    file = s->data_files()[sums.file];
  }
  ASSERT_GT(sums.length, 0u);
  const int fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const unsigned char junk = 0xEE;
  ASSERT_EQ(::pwrite(fd, &junk, 1, static_cast<off_t>(current + 3)), 1);
  ::close(fd);
  StoreConfig c;
  c.nvme_paths = {dir.path()};
  c.rank = 3;
  c.kind = StoreKind::kOptimizer;
  c.stripe_unit = 64 << 10;
  auto reopened = SwapStore::open(c, OpenMode::kOpen, *h);
  ASSERT_FALSE(reopened.is_ok());
  EXPECT_EQ(reopened.status().code(), ErrorCode::kCorruption);
  EXPECT_NE(reopened.status().message().find("page checksums of 'optim/sg0/exp_avg.s0'"), std::string::npos)
      << reopened.status().to_string();
}

// One owner per swap folder: a second store on the same folder (here: the same process) is
// refused at once, naming the folder and the holder's pid; once the first is gone it opens.
TEST(SwapStoreLock, SecondStoreOnAFolderIsRefused) {
  TempDir dir;
  auto h = testing::make_handle();
  auto first = open_store(*h, {dir.path()}, OpenMode::kCreate);
  ASSERT_TRUE(first);
  write_tensor(*first, Tensor{"t", DType::kF32, 1000, 8});
  StoreConfig c = first->config();
  auto second = SwapStore::open(c, OpenMode::kCreate, *h);
  ASSERT_FALSE(second.is_ok());
  const std::string msg = second.status().message();
  EXPECT_NE(msg.find("swap folder " + first->folder() + " is in use"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pid " + std::to_string(::getpid())), std::string::npos) << msg;
  // The refused open touched nothing: the first store's data is intact.
  EXPECT_EQ(verify_tensor(*first, Tensor{"t", DType::kF32, 1000, 8}), "");
  first.reset();
  EXPECT_TRUE(SwapStore::open(c, OpenMode::kOpenOrCreate, *h).is_ok());
}

constexpr const char* kLockChildEnv = "ZINF_SWAP_LOCK_CHILD_DIR";

TEST(SwapStoreLockChild, IsRefusedWhileTheParentHoldsTheFolder) {
  const char* dir = std::getenv(kLockChildEnv);
  if (dir == nullptr) GTEST_SKIP() << "runs only as the child of SwapStoreLock.AnotherProcessIsRefused";
  auto h = testing::make_handle();
  StoreConfig c;
  c.nvme_paths = {dir};
  c.rank = 3;
  c.kind = StoreKind::kOptimizer;
  c.stripe_unit = 64 << 10;
  auto s = SwapStore::open(c, OpenMode::kCreate, *h);
  ASSERT_FALSE(s.is_ok());
  std::ofstream(std::string(dir) + "/child_refused") << s.status().message();
}

TEST(SwapStoreLock, AnotherProcessIsRefused) {
  TempDir dir;
  auto h = testing::make_handle();
  auto s = open_store(*h, {dir.path()}, OpenMode::kCreate);
  ASSERT_TRUE(s);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv(kLockChildEnv, dir.path().c_str(), 1);
    const char* argv[] = {"swap_store_test", "--gtest_filter=SwapStoreLockChild.*", nullptr};
    execv("/proc/self/exe", const_cast<char* const*>(argv));
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::ifstream in(dir.path() + "/child_refused");
  std::string msg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(msg.find(s->folder()), std::string::npos) << msg;
  EXPECT_NE(msg.find("pid " + std::to_string(::getpid())), std::string::npos) << msg;
}

// Swap files are 0600 in 0700 folders, and a symbolic link planted at a swap file's name is
// refused, not written through.
TEST(SwapStorePermissions, PrivateModesAndNoFollow) {
  TempDir dir;
  auto h = testing::make_handle();
  std::string folder, data;
  {
    auto s = open_store(*h, {dir.path()}, OpenMode::kCreate);
    ASSERT_TRUE(s);
    write_tensor(*s, Tensor{"t", DType::kF32, 1000, 8});
    ASSERT_TRUE(s->commit().is_ok());
    folder = s->folder();
    data = s->data_files()[0];
    for (const std::string& f : {data, s->manifest_path()}) {
      EXPECT_EQ(std::filesystem::status(f).permissions() & std::filesystem::perms::all, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write) << f;
    }
    for (const std::string& d : {dir.path() + "/zinf_swap", dir.path() + "/zinf_swap/rank3", folder}) {
      EXPECT_EQ(std::filesystem::status(d).permissions() & std::filesystem::perms::all, std::filesystem::perms::owner_all) << d;
    }
  }
  const std::string victim = dir.write("victim", "precious");
  std::filesystem::remove(data);
  std::filesystem::create_symlink(victim, data);
  StoreConfig c;
  c.nvme_paths = {dir.path()};
  c.rank = 3;
  c.kind = StoreKind::kOptimizer;
  auto refused = SwapStore::open(c, OpenMode::kCreate, *h);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("symbolic link"), std::string::npos) << refused.status().to_string();
  EXPECT_NE(refused.status().message().find(data), std::string::npos) << refused.status().to_string();
  std::ifstream in(victim);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "precious");
  // A planted link in place of one of zinf's folders is refused too.
  TempDir other;
  std::filesystem::create_directories(other.path() + "/elsewhere");
  std::filesystem::create_symlink(other.path() + "/elsewhere", other.path() + "/zinf_swap");
  c.nvme_paths = {other.path()};
  auto linked = SwapStore::open(c, OpenMode::kCreate, *h);
  ASSERT_FALSE(linked.is_ok());
  EXPECT_NE(linked.status().message().find("symbolic link"), std::string::npos) << linked.status().to_string();
  EXPECT_TRUE(std::filesystem::is_empty(other.path() + "/elsewhere"));
}

// Reopening in a new process: the test binary runs itself with a filter selecting the child
// test below, which opens the store from its manifest and checks every tensor.
constexpr const char* kChildEnv = "ZINF_SWAP_REOPEN_CHILD_DIR";

TEST(SwapStoreReopenChild, VerifiesStoreWrittenByParent) {
  const char* dir = std::getenv(kChildEnv);
  if (dir == nullptr) GTEST_SKIP() << "runs only as the child of SwapStore.ReopensInANewProcess";
  auto h = testing::make_handle();
  auto s = open_store(*h, {std::string(dir) + "/a", std::string(dir) + "/b"}, OpenMode::kOpen);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->metadata("who"), "parent");
  for (const Tensor& t : sample_tensors()) ASSERT_EQ(verify_tensor(*s, t), "");
  std::ofstream(std::string(dir) + "/child_verified") << "ok";
}

TEST(SwapStore, ReopensInANewProcess) {
  TempDir dir;
  {
    auto h = testing::make_handle();
    auto s = open_store(*h, {dir.sub("a"), dir.sub("b")}, OpenMode::kCreate);
    ASSERT_TRUE(s);
    for (const Tensor& t : sample_tensors()) write_tensor(*s, t);
    s->set_metadata("who", "parent");
    ASSERT_TRUE(s->commit().is_ok());
  }
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv(kChildEnv, dir.path().c_str(), 1);
    const char* argv[] = {"swap_store_test", "--gtest_filter=SwapStoreReopenChild.*", nullptr};
    execv("/proc/self/exe", const_cast<char* const*>(argv));
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/child_verified"));
}

// locate() names, for any range of a tensor, the pieces of the data files that hold it: reading
// them from the files gives the tensor's bytes, in order, with nothing missing.
TEST(SwapStoreLocate, GivesTheFilePiecesOfAnyRange) {
  TempDir dir;
  auto h = testing::make_handle();
  auto s = open_store(*h, {dir.sub("a"), dir.sub("b")}, OpenMode::kCreate, 8192);
  ASSERT_TRUE(s);
  const Tensor t{"t", DType::kF32, 9000, 78};  // 36000 bytes: 5 units of 8 KiB over 2 files
  write_tensor(*s, t);
  for (const auto& [offset, nbytes] : std::vector<std::pair<std::uint64_t, std::uint64_t>>{
           {0, 36000}, {1000, 20000}, {8191, 2}, {35999, 1}, {36000, 0}}) {
    Result<std::vector<FileSpan>> spans = s->locate("t", offset, nbytes);
    ASSERT_TRUE(spans.is_ok()) << spans.status().to_string();
    std::uint64_t next = offset;
    for (const FileSpan& p : *spans) {
      ASSERT_EQ(p.tensor_offset, next) << "pieces in order, none missing";
      std::ifstream f(s->data_files()[p.file], std::ios::binary);
      f.seekg(static_cast<std::streamoff>(p.file_offset));
      std::vector<char> got(p.length);
      f.read(got.data(), static_cast<std::streamsize>(p.length));
      for (std::uint64_t i = 0; i < p.length; ++i) {
        ASSERT_EQ(static_cast<std::uint8_t>(got[i]), testing::pattern_byte(p.tensor_offset + i, t.seed))
            << "byte " << p.tensor_offset + i;
      }
      next += p.length;
    }
    EXPECT_EQ(next, offset + nbytes);
  }
  const auto past = s->locate("t", 30000, 6001);
  EXPECT_EQ(past.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(past.status().message().find("bytes [30000, 36001) of 't'"), std::string::npos) << past.status().message();
  EXPECT_NE(past.status().message().find("the tensor has 36000 bytes"), std::string::npos) << past.status().message();
  EXPECT_EQ(s->locate("absent", 0, 1).status().code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace zinf::swap
