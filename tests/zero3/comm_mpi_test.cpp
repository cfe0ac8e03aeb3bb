// MPI communicator tests, run by meson under `mpirun -np 2` and `-np 3`: every rank runs them.
#include <chrono>
#include <cstddef>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "mpi_test_env.h"
#include "zinf/zero3/comm_mpi.h"

namespace zinf::zero3 {
namespace {

using testing::comm;

TEST(MpiCommTest, AllGatherPutsEveryRankInOrder) {
  const int w = comm().world_size(), r = comm().rank();
  ASSERT_GE(w, 2) << "run under mpirun -np 2 or more";
  const std::size_t n = 5;
  std::vector<float> send(n), recv(n * w, -1.0f);
  for (std::size_t i = 0; i < n; ++i) send[i] = static_cast<float>(r * 100 + static_cast<int>(i));
  ASSERT_TRUE(comm().all_gather(send, recv).is_ok());
  for (int k = 0; k < w; ++k) {
    for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(recv[k * n + i], static_cast<float>(k * 100 + static_cast<int>(i)));
  }
  // In place: this rank's block of recv is the send buffer.
  std::vector<float> buf(n * w, 0.0f);
  for (std::size_t i = 0; i < n; ++i) buf[r * n + i] = static_cast<float>(r + 1);
  ASSERT_TRUE(comm().all_gather(std::span<const float>(buf.data() + r * n, n), buf).is_ok());
  for (int k = 0; k < w; ++k) EXPECT_EQ(buf[k * n], static_cast<float>(k + 1));
}

TEST(MpiCommTest, ReduceScatterSumsInRankOrder) {
  const int w = comm().world_size(), r = comm().rank();
  const std::size_t n = 7;
  // Values whose float sum depends on the order: the result must be the rank-order sum.
  auto value = [](int rank, std::size_t j) {
    return (rank % 2 == 0 ? 1.0e8f : 1.0f) * (1.0f + 0.1f * static_cast<float>(j)) * (rank == 1 ? -1.0f : 1.0f);
  };
  std::vector<float> send(n * w), recv(n);
  for (std::size_t j = 0; j < send.size(); ++j) send[j] = value(r, j);
  ASSERT_TRUE(comm().reduce_scatter(send, recv).is_ok());
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t j = static_cast<std::size_t>(r) * n + i;
    float expected = value(0, j);
    for (int k = 1; k < w; ++k) expected += value(k, j);
    EXPECT_EQ(recv[i], expected) << "element " << i;
  }
}

TEST(MpiCommTest, AllReduceAndBroadcast) {
  const int w = comm().world_size(), r = comm().rank();
  std::vector<double> v = {static_cast<double>(r), 1.0, r == w - 1 ? 1.0 : 0.0};
  ASSERT_TRUE(comm().all_reduce_sum(v).is_ok());
  EXPECT_EQ(v[0], w * (w - 1) / 2.0);
  EXPECT_EQ(v[1], static_cast<double>(w));
  EXPECT_EQ(v[2], 1.0);
  std::vector<std::byte> bytes(16, std::byte{0});
  if (r == 1) bytes.assign(16, std::byte{0x5A});
  ASSERT_TRUE(comm().broadcast(bytes, 1).is_ok());
  for (std::byte b : bytes) EXPECT_EQ(b, std::byte{0x5A});
  EXPECT_EQ(comm().broadcast(bytes, w).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(comm().barrier().is_ok());
}

// Bytes and 64-bit integers pass whole: no value goes through a double.
TEST(MpiCommTest, ByteAndIntegerCollectivesAreExact) {
  const int w = comm().world_size(), r = comm().rank();
  std::vector<std::byte> send(3), recv(3 * static_cast<std::size_t>(w));
  for (std::size_t i = 0; i < send.size(); ++i) send[i] = static_cast<std::byte>(r * 16 + static_cast<int>(i));
  ASSERT_TRUE(comm().all_gather_bytes(send, recv).is_ok());
  for (int k = 0; k < w; ++k) {
    for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(recv[k * 3 + i], static_cast<std::byte>(k * 16 + static_cast<int>(i)));
  }
  const std::uint64_t big = 0xFFFF'FFFF'FFFF'FFF0u;  // not exact in a double
  const std::vector<std::uint64_t> mine = {big + static_cast<std::uint64_t>(r), static_cast<std::uint64_t>(r)};
  std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(w));
  ASSERT_TRUE(comm().all_gather_u64(mine, all).is_ok());
  for (int k = 0; k < w; ++k) {
    EXPECT_EQ(all[k * 2], big + static_cast<std::uint64_t>(k));
    EXPECT_EQ(all[k * 2 + 1], static_cast<std::uint64_t>(k));
  }
  std::vector<std::uint64_t> sum = {std::uint64_t{1} << 62, (std::uint64_t{1} << 53) + 1};
  ASSERT_TRUE(comm().all_reduce_sum_u64(sum).is_ok());
  EXPECT_EQ(sum[0], static_cast<std::uint64_t>(w) << 62);  // modulo 2^64
  EXPECT_EQ(sum[1], static_cast<std::uint64_t>(w) * ((std::uint64_t{1} << 53) + 1));
  std::vector<std::uint64_t> short_recv(1);
  EXPECT_EQ(comm().all_gather_u64(mine, short_recv).code(), ErrorCode::kInternal);
}

TEST(MpiCommTest, AMissingRankIsAnErrorNotAHang) {
  auto impatient = make_mpi_communicator(std::chrono::seconds(2));
  ASSERT_TRUE(impatient.is_ok());
  if (comm().rank() == 0) {
    // Rank 0 stays away past the others' deadline, then joins the barrier they abandoned.
    std::this_thread::sleep_for(std::chrono::seconds(4));
    EXPECT_TRUE((*impatient)->barrier().is_ok());
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    Status s = (*impatient)->barrier();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(s.code(), ErrorCode::kAborted) << s.to_string();
    EXPECT_NE(s.message().find("barrier"), std::string::npos) << s.message();
    EXPECT_LT(waited, 30.0);
  }
  EXPECT_TRUE(comm().barrier().is_ok());
}

}  // namespace
}  // namespace zinf::zero3
