// Tests of the parameter swapper: config budget, fetch/release, streaming large partitions, reopen.
#include "zinf/swap/param_swapper.h"

#include <cstring>

#include <gtest/gtest.h>

#include "swap_test_util.h"

namespace zinf::swap {
namespace {

using testing::TempDir;

ParamSwapConfig small_config(const TempDir& dir) {
  ParamSwapConfig c;
  c.store.nvme_paths = {dir.sub("nvme0"), dir.sub("nvme1")};
  c.buffer_count = 3;
  c.buffer_size = 16384;  // bf16: 32 KiB buffers, 96 KiB in all, 64 KiB for whole partitions
  c.max_in_cpu = 1500;
  c.pin_memory = false;
  c.store.stripe_unit = 8192;
  return c;
}

TEST(ParamSwapper, BudgetComesFromTheConfig) {
  TempDir dir;
  auto h = testing::make_handle();
  Result<std::unique_ptr<ParamSwapper>> p = ParamSwapper::create(small_config(dir), *h);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ((*p)->pool().capacity(), 3u * 32768u);
  EXPECT_EQ((*p)->pool().resident_capacity(), 2u * 32768u);
}

TEST(ParamSwapper, FetchGetReleaseAndStreamLargePartitions) {
  TempDir dir;
  auto h = testing::make_handle();
  auto p = std::move(ParamSwapper::create(small_config(dir), *h)).value();
  const std::vector<std::byte> tiny = testing::pattern(1000 * 2, 1), mid = testing::pattern(20000 * 2, 2),
                               big = testing::pattern(100000 * 2, 3);
  ASSERT_TRUE(p->add("ln.bias", 1000, tiny.data()).is_ok());
  ASSERT_TRUE(p->add("attn.weight", 20000, mid.data()).is_ok());
  ASSERT_TRUE(p->add("mlp.weight", 100000, big.data()).is_ok());  // larger than every buffer together
  EXPECT_EQ(p->info("ln.bias")->home, Tier::kCpu);
  EXPECT_EQ(p->info("attn.weight")->home, Tier::kNvme);

  ASSERT_TRUE(p->fetch("attn.weight").wait().is_ok());
  Result<TensorView> v = p->get("attn.weight");
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_TRUE(std::memcmp(v->data(), mid.data(), mid.size()) == 0);
  v->reset();
  ASSERT_TRUE(p->release("attn.weight").wait().is_ok());
  EXPECT_EQ(p->pool().in_use(), 0u);

  const Status whole = p->fetch("mlp.weight").wait();
  EXPECT_EQ(whole.code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(whole.message().find("offload_param.buffer_size"), std::string::npos) << whole.to_string();
  std::vector<std::byte> out(big.size());
  ASSERT_TRUE(p->fetch_into("mlp.weight", out.data()).wait().is_ok());
  EXPECT_TRUE(out == big);
  EXPECT_LE(p->pool().high_water(), p->pool().capacity());
}

TEST(ParamSwapper, WriteRangeUpdatesPartOfAPartition) {
  TempDir dir;
  auto h = testing::make_handle();
  auto p = std::move(ParamSwapper::create(small_config(dir), *h)).value();
  std::vector<std::byte> data = testing::pattern(10000 * 2, 4);
  ASSERT_TRUE(p->add("w", 10000, data.data()).is_ok());
  const std::vector<std::byte> update = testing::pattern((10000 - 4096) * 2, 5);
  ASSERT_TRUE(p->write_range("w", 4096, 10000 - 4096, update.data()).wait().is_ok());
  std::memcpy(data.data() + 4096 * 2, update.data(), update.size());
  std::vector<std::byte> out(data.size());
  ASSERT_TRUE(p->fetch_into("w", out.data()).wait().is_ok());
  EXPECT_TRUE(out == data);
  EXPECT_EQ(p->write_range("w", 100, 10, update.data()).wait().code(), ErrorCode::kInvalidArgument);
}

TEST(ParamSwapper, ReopensPartitionsForResume) {
  TempDir dir;
  auto h = testing::make_handle();
  const std::vector<std::byte> a = testing::pattern(30000 * 2, 6), b = testing::pattern(700 * 2, 7);
  {
    auto p = std::move(ParamSwapper::create(small_config(dir), *h)).value();
    ASSERT_TRUE(p->add("a", 30000, a.data()).is_ok());
    ASSERT_TRUE(p->add("b", 700, b.data()).is_ok());
    ASSERT_TRUE(p->flush().is_ok());
  }
  auto p = std::move(ParamSwapper::create(small_config(dir), *h, OpenMode::kOpen)).value();
  ASSERT_TRUE(p->add("a", 30000).is_ok());
  ASSERT_TRUE(p->add("b", 700).is_ok());
  std::vector<std::byte> out_a(a.size()), out_b(b.size());
  ASSERT_TRUE(p->fetch_into("a", out_a.data()).wait().is_ok());
  ASSERT_TRUE(p->fetch_into("b", out_b.data()).wait().is_ok());
  EXPECT_TRUE(out_a == a);
  EXPECT_TRUE(out_b == b);
}

}  // namespace
}  // namespace zinf::swap
