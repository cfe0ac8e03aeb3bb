// The GPUDirect Storage layer: loading libcufile at run time, files and buffers registered with it,
// short transfers and errors, against a fake libcufile on host memory (no GPU needed); and, where
// a GPU and the real libcufile are present, a round trip through device memory.
#include "gpu/gds.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/device_buffer.h"
#include "gpu_test_util.h"
#include "temp_dir.h"

namespace zinf::gpu {
namespace {

// The fake's path comes from meson (ZINF_FAKE_CUFILE); its knobs are environment variables.
using testing::ScopedEnv;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class FakeCuFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* fake = std::getenv("ZINF_FAKE_CUFILE");
    if (fake == nullptr || *fake == '\0') GTEST_SKIP() << "ZINF_FAKE_CUFILE is not set (run through meson test)";
    fake_ = fake;
    log_ = dir_.file("calls.log");
    ::setenv("FAKE_CUFILE_LOG", log_.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("FAKE_CUFILE_LOG");
  }
  std::shared_ptr<CuFileDriver> driver() {
    auto d = CuFileDriver::open(fake_);
    EXPECT_TRUE(d.is_ok()) << d.status().to_string();
    return d.is_ok() ? std::move(d).value() : nullptr;
  }
  static std::vector<unsigned char> pattern(std::size_t n) {
    std::vector<unsigned char> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * 37) ^ (i >> 8));
    return v;
  }
  std::string fake_;
  ::zinf::testing::TempDir dir_{"gds_"};
  std::string log_;
};

TEST(CuFileDriver, AMissingLibraryIsUnsupportedNamingIt) {
  auto d = CuFileDriver::open("libcufile-not-installed.so.0");
  ASSERT_FALSE(d.is_ok());
  EXPECT_EQ(d.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(d.status().message().find("GPUDirect Storage unavailable: cannot load libcufile-not-installed.so.0"),
            std::string::npos)
      << d.status().message();
}

TEST(CuFileDriver, TheDefaultLibraryEitherOpensOrSaysWhyNot) {
  // On the build machine libcufile is absent; on a GPU machine it may be present. Either way,
  // never a crash and never another error code.
  auto d = CuFileDriver::open();
  if (d.is_ok()) {
    EXPECT_EQ(d.value()->library(), "libcufile.so.0");
  } else {
    EXPECT_EQ(d.status().code(), ErrorCode::kUnsupported) << d.status().to_string();
  }
}

TEST(CuFileDriver, ALibraryWithoutTheEntryPointsIsUnsupported) {
  // libm is loadable everywhere and is no cuFile library.
  auto d = CuFileDriver::open("libm.so.6");
  ASSERT_FALSE(d.is_ok());
  EXPECT_EQ(d.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(d.status().message().find("libm.so.6 has no cuFile"), std::string::npos) << d.status().message();
}

TEST_F(FakeCuFileTest, ADriverThatDoesNotOpenIsUnsupportedWithItsCode) {
  ScopedEnv fail("FAKE_CUFILE_OPEN_FAIL", "5007");
  auto d = CuFileDriver::open(fake_);
  ASSERT_FALSE(d.is_ok());
  EXPECT_EQ(d.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(d.status().message().find("cuFileDriverOpen"), std::string::npos) << d.status().message();
  EXPECT_NE(d.status().message().find("cuFile error 5007 CU_FILE_PLATFORM_NOT_SUPPORTED"), std::string::npos) << d.status().message();
  EXPECT_EQ(read_text(log_).find("driver_close"), std::string::npos) << "closed a driver that never opened";
}

TEST_F(FakeCuFileTest, WriteThenReadBackWithShortTransfers) {
  auto drv = driver();
  ASSERT_NE(drv, nullptr);
  const std::string path = dir_.file("tensor.bin");
  const std::size_t n = 3 * 4096 + 123;  // not a multiple of the short-transfer size
  const std::vector<unsigned char> data = pattern(n);
  {
    ScopedEnv cap("FAKE_CUFILE_MAX_TRANSFER", "1000");
    auto f = GdsFile::open(drv, path, GdsFileOptions{.write = true, .create = true, .direct = false});
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    ASSERT_TRUE(f->write(data.data(), n, 0).is_ok());
    ASSERT_TRUE(f->write(data.data(), 100, n).is_ok());  // appended at the end
    std::vector<unsigned char> back(n + 100, 0);
    const Status st = f->read(back.data(), n + 100, 0);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_TRUE(std::equal(data.begin(), data.end(), back.begin()));
    EXPECT_TRUE(std::equal(data.begin(), data.begin() + 100, back.begin() + n));
    // An offset into the file and the destination's own start.
    std::vector<unsigned char> middle(500, 0);
    ASSERT_TRUE(f->read(middle.data(), 500, 4000).is_ok());
    EXPECT_TRUE(std::equal(middle.begin(), middle.end(), data.begin() + 4000));
  }
  const std::string log = read_text(log_);
  EXPECT_NE(log.find("handle_register\nhandle_deregister"), std::string::npos) << log;
  drv.reset();
  EXPECT_NE(read_text(log_).find("driver_close"), std::string::npos) << "the last owner closes the driver";
}

TEST_F(FakeCuFileTest, ReadingPastTheEndIsOutOfRange) {
  auto drv = driver();
  ASSERT_NE(drv, nullptr);
  const std::string path = dir_.write("short.bin", std::string(1000, 'x'));
  auto f = GdsFile::open(drv, path, GdsFileOptions{.direct = false});
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  std::vector<unsigned char> buf(2000);
  const Status st = f->read(buf.data(), 2000, 0);
  EXPECT_EQ(st.code(), ErrorCode::kOutOfRange) << st.to_string();
  EXPECT_NE(st.message().find("ends at 1000"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(path), std::string::npos) << st.message();
}

TEST_F(FakeCuFileTest, ErrorsNameThePathOffsetLengthAndCause) {
  auto drv = driver();
  ASSERT_NE(drv, nullptr);
  const std::string path = dir_.write("data.bin", std::string(8192, 'y'));
  auto f = GdsFile::open(drv, path, GdsFileOptions{.write = true, .direct = false});
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  std::vector<unsigned char> buf(4096);
  {
    ScopedEnv fail("FAKE_CUFILE_FAIL", "eio");
    const Status st = f->read(buf.data(), 4096, 4096);
    EXPECT_EQ(st.code(), ErrorCode::kIoError);
    EXPECT_NE(st.message().find("cuFileRead " + path + " offset 4096 length 4096"), std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("Input/output error"), std::string::npos) << st.message();
  }
  {
    ScopedEnv fail("FAKE_CUFILE_FAIL", "5011");
    const Status st = f->write(buf.data(), 4096, 0);
    EXPECT_EQ(st.code(), ErrorCode::kIoError);
    EXPECT_NE(st.message().find("cuFileWrite " + path + " offset 0 length 4096: cuFile error 5011"),
              std::string::npos)
        << st.message();
  }
  EXPECT_EQ(f->read(nullptr, 16, 0).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(f->read(nullptr, 0, 0).is_ok());
  // The file still works after the failures.
  EXPECT_TRUE(f->read(buf.data(), 4096, 0).is_ok());
  EXPECT_EQ(buf[0], 'y');
}

TEST_F(FakeCuFileTest, OpeningAMissingFileNamesIt) {
  auto drv = driver();
  ASSERT_NE(drv, nullptr);
  const std::string path = dir_.file("absent.bin");
  auto f = GdsFile::open(drv, path);
  ASSERT_FALSE(f.is_ok());
  EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status().message();
}

TEST_F(FakeCuFileTest, BufferRegistrationsAreUndoneOnceAndKeepTheDriverOpen) {
  auto drv = driver();
  ASSERT_NE(drv, nullptr);
  std::vector<unsigned char> mem(4096);
  {
    auto reg = GdsBufferRegistration::create(drv, mem.data(), mem.size());
    ASSERT_TRUE(reg.is_ok()) << reg.status().to_string();
    GdsBufferRegistration moved = std::move(reg).value();
    drv.reset();  // the registration keeps the driver
    EXPECT_EQ(read_text(log_).find("driver_close"), std::string::npos);
  }
  const std::string log = read_text(log_);
  EXPECT_NE(log.find("buf_register\nbuf_deregister\ndriver_close"), std::string::npos) << log;
}

TEST(GdsOnGpu, RoundTripThroughDeviceMemory) {
  ZINF_REQUIRE_GPU();
  auto drv = CuFileDriver::open();
  if (!drv.is_ok()) GTEST_SKIP() << drv.status().message();
  ::zinf::testing::TempDir dir("gds_gpu_");
  const std::size_t n = 4u << 20;
  std::vector<unsigned char> host(n), back(n, 0);
  for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<unsigned char>(i * 13 + (i >> 12));
  auto dev = DeviceBuffer::allocate(0, n, "GDS test buffer");
  ASSERT_TRUE(dev.is_ok()) << dev.status().to_string();
  ASSERT_EQ(cudaMemcpy(dev->data(), host.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  // cuFile's DMA is not ordered after legacy-stream work: a pageable cudaMemcpy may return before
  // its DMA lands, and cudaMemset is asynchronous. Wait for both before cuFile touches the buffer.
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto reg = GdsBufferRegistration::create(drv.value(), dev->data(), n);
  ASSERT_TRUE(reg.is_ok()) << reg.status().to_string();
  auto f = GdsFile::open(drv.value(), dir.file("gds.bin"), GdsFileOptions{.write = true, .create = true});
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  ASSERT_TRUE(f->write(dev->data(), n, 0).is_ok());
  ASSERT_EQ(cudaMemset(dev->data(), 0, n), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const Status st = f->read(dev->data(), n, 0);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  ASSERT_EQ(cudaMemcpy(back.data(), dev->data(), n, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
}

}  // namespace
}  // namespace zinf::gpu
