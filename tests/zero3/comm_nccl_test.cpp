// NCCL communicator tests at world size 1 (local bootstrap); they skip when no CUDA device is
// visible (and fail instead under ZINF_EXPECT_GPU=1, as the other GPU tests).
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../gpu/gpu_test_util.h"
#include "zinf/zero3/comm_nccl.h"

namespace zinf::zero3 {
namespace {

TEST(NcclCommWithoutGpu, SetupIsAnErrorNotACrash) {
  ZINF_REQUIRE_NO_GPU();
  ASSERT_TRUE(nccl_available());
  auto c = make_nccl_communicator(make_local_communicator(), std::chrono::seconds(10));
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kUnsupported) << c.status().to_string();
  EXPECT_NE(c.status().message().find("no CUDA device"), std::string::npos) << c.status().message();
}

class NcclCommTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ZINF_REQUIRE_GPU();
    auto c = make_nccl_communicator(make_local_communicator(), std::chrono::seconds(30));
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    comm_ = std::move(c).value();
  }
  std::unique_ptr<Communicator> comm_;
};

TEST_F(NcclCommTest, IdentityComesFromTheBootstrap) {
  EXPECT_EQ(comm_->name(), "nccl");
  EXPECT_EQ(comm_->rank(), 0);
  EXPECT_EQ(comm_->world_size(), 1);
  EXPECT_EQ(comm_->local_rank(), 0);
  EXPECT_EQ(comm_->local_size(), 1);
}

TEST_F(NcclCommTest, AllGatherCopiesAndWorksInPlace) {
  const std::size_t n = 1000;
  std::vector<float> send(n), recv(n, -1.0f);
  for (std::size_t i = 0; i < n; ++i) send[i] = 0.5f * static_cast<float>(i);
  ASSERT_TRUE(comm_->all_gather(send, recv).is_ok());
  EXPECT_EQ(recv, send);
  // In place: send is recv's own block (rank 0: all of it).
  std::vector<float> buf = send;
  ASSERT_TRUE(comm_->all_gather(std::span<const float>(buf.data(), n), buf).is_ok());
  EXPECT_EQ(buf, send);
}

TEST_F(NcclCommTest, ReduceScatterAndAllReduceAtWorldSizeOne) {
  std::vector<float> send = {1.0e8f, -3.25f, 7.0f}, recv(3, 0.0f);
  ASSERT_TRUE(comm_->reduce_scatter(send, recv).is_ok());
  EXPECT_EQ(recv, send);
  std::vector<double> v = {1.0, -2.5, 1.0e300};
  const std::vector<double> before = v;
  ASSERT_TRUE(comm_->all_reduce_sum(v).is_ok());
  EXPECT_EQ(v, before);
}

TEST_F(NcclCommTest, ByteAndIntegerCollectivesAtWorldSizeOne) {
  std::vector<std::byte> send(37, std::byte{0x3C}), recv(37);
  ASSERT_TRUE(comm_->all_gather_bytes(send, recv).is_ok());
  EXPECT_EQ(recv, send);
  const std::vector<std::uint64_t> mine = {0xFFFF'FFFF'FFFF'FFF1u, 7};
  std::vector<std::uint64_t> all(2);
  ASSERT_TRUE(comm_->all_gather_u64(mine, all).is_ok());
  EXPECT_EQ(all, mine);
  std::vector<std::uint64_t> sum = mine;
  ASSERT_TRUE(comm_->all_reduce_sum_u64(sum).is_ok());
  EXPECT_EQ(sum, mine);
}

TEST_F(NcclCommTest, BroadcastAndBarrier) {
  std::vector<std::byte> bytes(37, std::byte{0x5A});
  ASSERT_TRUE(comm_->broadcast(bytes, 0).is_ok());
  for (std::byte b : bytes) EXPECT_EQ(b, std::byte{0x5A});
  EXPECT_EQ(comm_->broadcast(bytes, 1).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(comm_->barrier().is_ok());
}

TEST_F(NcclCommTest, SizeMismatchIsAnError) {
  std::vector<float> send(4), recv(5);
  const Status s = comm_->all_gather(send, recv);
  EXPECT_EQ(s.code(), ErrorCode::kInternal) << s.to_string();
  EXPECT_NE(s.message().find("all_gather"), std::string::npos) << s.message();
  EXPECT_EQ(comm_->reduce_scatter(send, recv).code(), ErrorCode::kInternal);
  // The communicator still works after a rejected call.
  std::vector<float> ok(4, 2.0f), out(4);
  EXPECT_TRUE(comm_->all_gather(ok, out).is_ok());
  EXPECT_EQ(out, ok);
}

}  // namespace
}  // namespace zinf::zero3
