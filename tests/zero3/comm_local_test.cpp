// The world-size-1 communicator, and the byte and 64-bit integer collectives every communicator has.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "zinf/zero3/comm.h"

namespace zinf::zero3 {
namespace {

TEST(LocalCommTest, ByteAndIntegerCollectivesCopyExactly) {
  std::unique_ptr<Communicator> comm = make_local_communicator();
  std::vector<std::byte> send = {std::byte{1}, std::byte{0xFF}, std::byte{0}}, recv(3);
  ASSERT_TRUE(comm->all_gather_bytes(send, recv).is_ok());
  EXPECT_EQ(recv, send);
  const std::vector<std::uint64_t> mine = {0xFFFF'FFFF'FFFF'FFF1u, (std::uint64_t{1} << 53) + 1};  // not exact in a double
  std::vector<std::uint64_t> all(2);
  ASSERT_TRUE(comm->all_gather_u64(mine, all).is_ok());
  EXPECT_EQ(all, mine);
  std::vector<std::uint64_t> sum = mine;
  ASSERT_TRUE(comm->all_reduce_sum_u64(sum).is_ok());
  EXPECT_EQ(sum, mine);
}

TEST(LocalCommTest, SizeMismatchIsAnError) {
  std::unique_ptr<Communicator> comm = make_local_communicator();
  std::vector<std::byte> send(4), recv(5);
  EXPECT_EQ(comm->all_gather_bytes(send, recv).code(), ErrorCode::kInternal);
  const std::vector<std::uint64_t> mine(2);
  std::vector<std::uint64_t> all(3);
  const Status s = comm->all_gather_u64(mine, all);
  EXPECT_EQ(s.code(), ErrorCode::kInternal);
  EXPECT_NE(s.message().find("all_gather_u64"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace zinf::zero3
