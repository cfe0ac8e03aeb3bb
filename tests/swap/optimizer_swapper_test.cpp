// Tests of the optimizer swapper: layout, bit-identity with the in-memory step, failure safety.
#include "zinf/swap/optimizer_swapper.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>

#include <gtest/gtest.h>

#include "optimizer_test_util.h"
#include "swap_test_util.h"
#include "zinf/optim/half.h"
#include "zinf/swap/param_sink.h"
#include "zinf/swap/param_swapper.h"

namespace zinf::swap {
namespace {

using testing::TempDir;
using namespace testing;  // the optimizer test helpers

TEST(PartitionLayout, PacksPartitionsIntoAlignedSubGroups) {
  const PartitionLayout l = PartitionLayout::build(kParams, 8000);
  // {wte, h.0.attn} reach 8000; {h.0.mlp} alone; {h.0.ln, h.1.attn} reach 7001 < 8000, then h.1.mlp...
  ASSERT_EQ(l.subgroups.size(), 4u);
  EXPECT_EQ(l.subgroups[0].param_count, 2u);
  EXPECT_EQ(l.offset_in_subgroup[1], 6144u);  // 5000 rounded up to 2048 elements
  EXPECT_EQ(l.subgroups[0].numel, 10240u);
  EXPECT_EQ(l.subgroups[1].first_param, 2u);
  EXPECT_EQ(l.subgroups[1].param_count, 1u);
  EXPECT_EQ(l.subgroups[2].param_count, 3u);  // h.0.ln + h.1.attn (7001) + h.1.mlp closes it
  EXPECT_EQ(l.subgroups[2].param_numel, 19001u);
  EXPECT_EQ(l.subgroups[3].first_param, 6u);
  for (std::size_t p = 0; p < kParams.size(); ++p) EXPECT_EQ(l.offset_in_subgroup[p] % PartitionLayout::kAlign, 0u);
  EXPECT_NE(l.fingerprint(), PartitionLayout::build(kParams, 9000).fingerprint());
}

// The same steps on in-memory arrays with the same kernels: the reference.
struct Case {
  const char* name;
  optim::OptimizerConfig opt;
  bool pipeline_read, pipeline_write, swap_gradients;
  DType grad_dtype;
  bool copies_to_swapper;
  DType copy_dtype = DType::kBF16;  // fp32: the sink takes the master weights
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// read_ahead: every step's first tiles are read ahead (as the engine does under the passes), and
// at step 2 the read-ahead is dropped by a read_state and started again.
class OptimizerSwapperSteps : public ::testing::TestWithParam<std::tuple<Case, bool>> {};

TEST_P(OptimizerSwapperSteps, MatchInMemoryStepsBitForBit) {
  const Case& c = std::get<0>(GetParam());
  const bool read_ahead = std::get<1>(GetParam());
  TempDir dir;
  auto h = testing::make_handle();
  OptimizerSwapConfig cfg = base_config(dir);
  cfg.pipeline_read = c.pipeline_read;
  cfg.pipeline_write = c.pipeline_write;
  cfg.swap_gradients = c.swap_gradients;
  cfg.gradient_dtype = c.grad_dtype;
  Result<std::unique_ptr<OptimizerSwapper>> created =
      OptimizerSwapper::create(cfg, kParams, optim::Optimizer(c.opt), *h);
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  OptimizerSwapper& sw = **created;
  EXPECT_LT(sw.tile_elements(), sw.layout().largest_subgroup());
  InMemory ref(sw.layout(), sw.optimizer());
  ref.copy_dtype = c.copy_dtype;
  ASSERT_TRUE(sw.init_master(initial_source()).is_ok());
  expect_state_equal(sw, ref);

  const std::size_t esize = dtype_size(c.copy_dtype);
  std::unique_ptr<ParamSwapper> params;
  std::vector<std::vector<std::byte>> copies;
  for (const SubGroup& g : sw.layout().subgroups) copies.emplace_back(g.numel * esize);
  std::unique_ptr<ParamSink> sink = std::make_unique<HostParamSink>(host_sink(copies, c.copy_dtype));
  if (c.copies_to_swapper) {
    ParamSwapConfig pc;
    pc.store.nvme_paths = {dir.sub("params")};
    pc.dtype = c.copy_dtype;
    pc.buffer_count = 2;
    pc.buffer_size = 16384;
    pc.max_in_cpu = 3000;  // a few partitions in the CPU tier, the rest on NVMe
    pc.pin_memory = false;
    params = std::move(ParamSwapper::create(pc, *h)).value();
    for (const ParamPartition& p : kParams) ASSERT_TRUE(params->add(p.key, p.numel).is_ok());
    Result<SwapperParamSink> made = SwapperParamSink::create(sw.layout(), *params);
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    sink = std::make_unique<SwapperParamSink>(std::move(made).value());
  }
  for (int step = 1; step <= 4; ++step) {
    const auto grads = make_grads(sw.layout(), c.grad_dtype, 100 + step);
    StepArgs in;
    in.ctx.step = step;
    in.ctx.lr = 1e-2 / step;
    in.grad_scale = 0.5;
    in.grads = views(grads, c.grad_dtype);
    if (read_ahead) {
      ASSERT_TRUE(sw.read_ahead().is_ok());
      const std::size_t ahead = sw.read_ahead_tiles();
      EXPECT_GT(ahead, 0u);
      if (step == 2) {  // the slots are read_state's bounce buffer: the read-ahead is dropped first
        std::vector<float> master(ref.master[0].size());
        ASSERT_TRUE(sw.read_state(0, 0, master).is_ok());
        EXPECT_EQ(std::memcmp(master.data(), ref.master[0].data(), master.size() * 4), 0);
        EXPECT_EQ(sw.read_ahead_tiles(), 0u);
        ASSERT_TRUE(sw.read_ahead().is_ok());
      }
      ASSERT_TRUE(sw.read_ahead().is_ok());  // a no-op while one is pending
      EXPECT_EQ(sw.read_ahead_tiles(), ahead);
    }
    ref.step(in);
    if (c.swap_gradients) {
      for (std::size_t g = 0; g < grads.size(); ++g) ASSERT_TRUE(sw.write_gradients(g, grads[g].data()).is_ok());
      in.grads.clear();
      if (read_ahead) {
        EXPECT_GT(sw.read_ahead_tiles(), 0u);  // gradient writes keep the read-ahead
      }
    }
    in.sink = sink.get();
    const Status st = sw.step(in);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(sw.committed_step(), step);
    EXPECT_EQ(sw.read_ahead_tiles(), 0u);
    EXPECT_GT(sw.last_stats().tiles, sw.layout().subgroups.size());
  }
  expect_state_equal(sw, ref);
  for (std::size_t p = 0; p < kParams.size(); ++p) {
    const std::size_t g = sw.layout().subgroup_of[p];
    const std::uint64_t at = sw.layout().offset_in_subgroup[p];
    const void* want = c.copy_dtype == DType::kF32 ? static_cast<const void*>(ref.master[g].data() + at)
                                                   : static_cast<const void*>(ref.copies[g].data() + at);
    std::vector<std::byte> got(kParams[p].numel * esize);
    if (c.copies_to_swapper) {
      ASSERT_TRUE(params->fetch_into(kParams[p].key, got.data()).wait().is_ok());
    } else {
      std::memcpy(got.data(), copies[g].data() + at * esize, got.size());
    }
    EXPECT_EQ(std::memcmp(got.data(), want, got.size()), 0) << kParams[p].key;
  }
  EXPECT_LE(sw.pool().high_water(), sw.pool().capacity());
}

optim::OptimizerConfig adam_l2() {
  optim::AdamParams p;
  p.weight_decay = 0.1;
  p.adam_w_mode = false;
  return optim::OptimizerConfig{p};
}

INSTANTIATE_TEST_SUITE_P(
    Configs, OptimizerSwapperSteps,
    ::testing::Combine(::testing::Values(Case{"adamw_serial", adamw(), false, false, false, DType::kF32, false},
                      Case{"adamw_pipelined", adamw(), true, true, false, DType::kF32, false},
                      Case{"adamw_read_only", adamw(), true, false, false, DType::kBF16, false},
                      Case{"adamw_write_only", adamw(), false, true, false, DType::kF32, true},
                      Case{"adam_l2_swapped_grads", adam_l2(), true, true, true, DType::kBF16, true},
                      Case{"adagrad", optim::OptimizerConfig{optim::AdagradParams{}}, true, true, true, DType::kF32,
                           false},
                      Case{"lion", optim::OptimizerConfig{optim::LionParams{}}, true, true, false, DType::kF16, true},
                      Case{"adamw_fp16_copies", adamw(), true, true, false, DType::kF32, true, DType::kF16},
                      Case{"adamw_fp32_copies_in_memory", adamw(), true, true, false, DType::kF32, false, DType::kF32},
                      Case{"adamw_fp32_copies_to_swapper", adamw(), true, true, false, DType::kF32, true, DType::kF32},
                      Case{"adamw_serial_fp32_copies_to_swapper", adamw(), false, false, false, DType::kF32, true,
                           DType::kF32}),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<Case, bool>>& info) {
      return std::string(std::get<0>(info.param).name) + (std::get<1>(info.param) ? "_read_ahead" : "");
    });

class OptimizerSwapperFault : public ::testing::TestWithParam<bool> {};

TEST_P(OptimizerSwapperFault, FailedStepLeavesThePreviousStateIntact) {
  const bool fail_write = GetParam();
  TempDir dir;
  auto faults = std::make_shared<aio::FaultInjector>();
  auto h = testing::make_handle(faults);
  OptimizerSwapConfig cfg = base_config(dir);
  cfg.pipeline_read = cfg.pipeline_write = true;
  auto sw = std::move(OptimizerSwapper::create(cfg, kParams, optim::Optimizer(adamw()), *h)).value();
  InMemory ref(sw->layout(), sw->optimizer());
  ASSERT_TRUE(sw->init_master(initial_source()).is_ok());
  std::vector<std::vector<std::uint16_t>> copies;
  for (const SubGroup& g : sw->layout().subgroups) copies.emplace_back(g.numel, 0);
  HostParamSink sink = host_sink(copies);
  auto inputs = [&](int step, const std::vector<std::vector<std::byte>>& grads) {
    StepArgs in;
    in.ctx.step = step;
    in.grads = views(grads, DType::kF32);
    in.sink = &sink;
    return in;
  };
  for (int step = 1; step <= 2; ++step) {
    const auto grads = make_grads(sw->layout(), DType::kF32, step);
    ref.step(inputs(step, grads));
    ASSERT_TRUE(sw->step(inputs(step, grads)).is_ok());
  }
  // Step 3 fails half way through its writes (or reads).
  const std::uint64_t half = writes_per_step(*sw) / 2;
  faults->add(fail_write ? testing::fail_writes(half) : testing::fail_reads(half));
  const auto grads3 = make_grads(sw->layout(), DType::kF32, 3);
  const Status st = sw->step(inputs(3, grads3));
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(faults->injected(), 1u);
  EXPECT_EQ(st.sys_errno(), 5) << st.to_string();
  EXPECT_NE(st.message().find("optimizer step 3 failed (the state of step 2 stays committed and intact)"),
            std::string::npos)
      << st.to_string();
  EXPECT_NE(st.message().find("sub-group"), std::string::npos) << st.to_string();
  EXPECT_EQ(sw->committed_step(), 2);
  expect_state_equal(*sw, ref);  // step 2's state, readable and intact

  // The 16-bit copies can be restored from the committed masters...
  ASSERT_TRUE(sw->write_param_copies(sink).is_ok());
  for (std::size_t g = 0; g < copies.size(); ++g) {
    std::vector<std::uint16_t> want(ref.master[g].size());
    ASSERT_TRUE(optim::convert_from_f32(ref.master[g], want.data(), DType::kBF16).is_ok());
    EXPECT_EQ(want, copies[g]);
  }
  // ... the step retried, and a new process (here: a new swapper) continues from the manifest.
  faults->clear();
  ref.step(inputs(3, grads3));
  ASSERT_TRUE(sw->step(inputs(3, grads3)).is_ok());
  sw.reset();
  Result<std::unique_ptr<OptimizerSwapper>> reopened =
      OptimizerSwapper::create(cfg, kParams, optim::Optimizer(adamw()), *h, OpenMode::kOpen);
  ASSERT_TRUE(reopened.is_ok()) << reopened.status().to_string();
  EXPECT_EQ((*reopened)->committed_step(), 3);
  const auto grads4 = make_grads((*reopened)->layout(), DType::kF32, 4);
  ref.step(inputs(4, grads4));
  ASSERT_TRUE((*reopened)->step(inputs(4, grads4)).is_ok());
  expect_state_equal(**reopened, ref);
}

INSTANTIATE_TEST_SUITE_P(ReadOrWrite, OptimizerSwapperFault, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "write" : "read"; });

// A sink that takes copies the way a device would: write() only queues the range; a worker
// copies it into its own memory after a random delay and only then completes the ticket. An
// optimizer that reused its buffer before the ticket was ready would hand over other values.
class DeferredSink final : public ParamSink {
 public:
  DeferredSink(const PartitionLayout& layout, DType dtype) : dtype_(dtype) {
    for (const SubGroup& g : layout.subgroups) copies.emplace_back(g.numel * dtype_size(dtype));
    worker_ = std::thread([this] { run(); });
  }
  ~DeferredSink() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  DType dtype() const override { return dtype_; }
  void* host_subgroup(std::size_t) override { return nullptr; }
  Status write(std::size_t sg, std::uint64_t first, std::uint64_t count, const void* src,
               std::vector<SwapTicket>& pending) override {
    if (first % PartitionLayout::kAlign != 0 || (first + count) % PartitionLayout::kAlign != 0) ++misaligned;
    SwapCompletion done;
    pending.push_back(done.ticket());
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(Item{sg, first, count, src, done});
    }
    cv_.notify_one();
    return Status::ok();
  }

  std::vector<std::vector<std::byte>> copies;  // per sub-group, padded layout
  std::atomic<int> misaligned{0};

 private:
  struct Item {
    std::size_t sg;
    std::uint64_t first, count;
    const void* src;
    SwapCompletion done;
  };
  void run() {
    std::mt19937 rng(7);
    for (;;) {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      const Item item = queue_.front();
      queue_.pop_front();
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
      const std::size_t esize = dtype_size(dtype_);
      std::memcpy(copies[item.sg].data() + item.first * esize, item.src, item.count * esize);
      item.done.complete(Status::ok());
    }
  }
  DType dtype_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  std::thread worker_;
};

class OptimizerSwapperDeferredSink : public ::testing::TestWithParam<DType> {};

// The pipelined step and write_param_copies keep each slot's copy area (16-bit) or master tile
// (fp32) unchanged until the sink's tickets are ready: the copies equal the in-memory step's.
TEST_P(OptimizerSwapperDeferredSink, WaitsForEveryTicketBeforeReusingItsBuffers) {
  const DType dtype = GetParam();
  TempDir dir;
  auto h = testing::make_handle();
  OptimizerSwapConfig cfg = base_config(dir);
  cfg.pipeline_read = cfg.pipeline_write = true;
  auto sw = std::move(OptimizerSwapper::create(cfg, kParams, optim::Optimizer(adamw()), *h)).value();
  ASSERT_GT(sw->layout().largest_subgroup(), 3 * sw->tile_elements()) << "every slot must be reused in a step";
  InMemory ref(sw->layout(), sw->optimizer());
  ref.copy_dtype = dtype;
  ASSERT_TRUE(sw->init_master(initial_source()).is_ok());
  DeferredSink sink(sw->layout(), dtype);
  const std::size_t esize = dtype_size(dtype);
  auto expect_copies = [&](const char* when) {
    for (std::size_t p = 0; p < kParams.size(); ++p) {
      const std::size_t g = sw->layout().subgroup_of[p];
      const std::uint64_t at = sw->layout().offset_in_subgroup[p];
      const void* want = dtype == DType::kF32 ? static_cast<const void*>(ref.master[g].data() + at)
                                              : static_cast<const void*>(ref.copies[g].data() + at);
      EXPECT_EQ(std::memcmp(sink.copies[g].data() + at * esize, want, kParams[p].numel * esize), 0)
          << kParams[p].key << " " << when;
    }
  };
  ASSERT_TRUE(sw->write_param_copies(sink).is_ok());
  if (dtype != DType::kF32) {
    for (std::size_t g = 0; g < ref.master.size(); ++g) {
      ASSERT_TRUE(optim::convert_from_f32(ref.master[g], ref.copies[g].data(), dtype).is_ok());
    }
  }
  expect_copies("after write_param_copies");
  for (int step = 1; step <= 3; ++step) {
    const auto grads = make_grads(sw->layout(), DType::kF32, 70 + step);
    StepArgs in;
    in.ctx.step = step;
    in.grads = views(grads, DType::kF32);
    ref.step(in);
    in.sink = &sink;
    ASSERT_TRUE(sw->step(in).is_ok());
    expect_copies(("after step " + std::to_string(step)).c_str());
  }
  EXPECT_EQ(sink.misaligned.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(CopyDtypes, OptimizerSwapperDeferredSink, ::testing::Values(DType::kBF16, DType::kF32),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

TEST(OptimizerSwapper, LoadStateRestoresACheckpointAsAWhole) {
  TempDir dir_a, dir_b;
  auto h = testing::make_handle();
  OptimizerSwapConfig cfg_a = base_config(dir_a), cfg_b = base_config(dir_b);
  cfg_a.pipeline_read = cfg_a.pipeline_write = true;
  auto a = std::move(OptimizerSwapper::create(cfg_a, kParams, optim::Optimizer(adamw()), *h)).value();
  auto b = std::move(OptimizerSwapper::create(cfg_b, kParams, optim::Optimizer(adamw()), *h)).value();
  ASSERT_TRUE(a->init_master(initial_source()).is_ok());
  ASSERT_TRUE(b->init_master(initial_source()).is_ok());
  auto step = [&](OptimizerSwapper& sw, int t) {
    const auto grads = make_grads(sw.layout(), DType::kF32, 40 + t);
    StepArgs in;
    in.ctx.step = t;
    in.grads = views(grads, DType::kF32);
    return sw.step(in);
  };
  ASSERT_TRUE(step(*a, 1).is_ok());
  ASSERT_TRUE(step(*a, 2).is_ok());
  // "Checkpoint" a, and load it into b tensor by tensor.
  const std::size_t tensors = 1 + a->optimizer().state_count();
  std::vector<std::vector<std::vector<float>>> saved(a->layout().subgroups.size());
  for (std::size_t g = 0; g < saved.size(); ++g) {
    for (std::size_t w = 0; w < tensors; ++w) {
      saved[g].emplace_back(a->layout().subgroups[g].numel);
      ASSERT_TRUE(a->read_state(g, w, saved[g][w]).is_ok());
    }
  }
  std::vector<float> before(b->layout().subgroups[0].numel), got(before.size());
  ASSERT_TRUE(b->read_state(0, 0, before).is_ok());
  for (std::size_t g = 0; g < saved.size(); ++g) {
    for (std::size_t w = 0; w < tensors; ++w) {
      if (g + 1 == saved.size() && w + 1 == tensors) continue;  // all but the last one
      ASSERT_TRUE(b->load_state(g, w, saved[g][w]).is_ok());
    }
  }
  ASSERT_TRUE(b->read_state(0, 0, got).is_ok());
  EXPECT_EQ(got, before) << "a partial load must not replace the committed state";
  ASSERT_TRUE(b->load_state(saved.size() - 1, tensors - 1, saved.back().back()).is_ok());
  for (std::size_t g = 0; g < saved.size(); ++g) {
    for (std::size_t w = 0; w < tensors; ++w) {
      std::vector<float> out(saved[g][w].size());
      ASSERT_TRUE(b->read_state(g, w, out).is_ok());
      EXPECT_EQ(std::memcmp(out.data(), saved[g][w].data(), out.size() * 4), 0) << g << " " << w;
    }
  }
  ASSERT_TRUE(step(*a, 3).is_ok());
  ASSERT_TRUE(step(*b, 3).is_ok());
  for (std::size_t g = 0; g < saved.size(); ++g) {
    for (std::size_t w = 0; w < tensors; ++w) {
      std::vector<float> x(saved[g][w].size()), y(x.size());
      ASSERT_TRUE(a->read_state(g, w, x).is_ok());
      ASSERT_TRUE(b->read_state(g, w, y).is_ok());
      EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0) << g << " " << w;
    }
  }
  EXPECT_EQ(b->load_state(0, tensors, saved[0][0]).code(), ErrorCode::kInvalidArgument);
}

TEST(OptimizerSwapper, RefusesMismatchedReopenAndTooSmallBudgets) {
  TempDir dir;
  auto h = testing::make_handle();
  OptimizerSwapConfig cfg = base_config(dir);
  {
    auto sw = std::move(OptimizerSwapper::create(cfg, kParams, optim::Optimizer(adamw()), *h)).value();
    ASSERT_TRUE(sw->init_master(initial_source()).is_ok());
  }
  std::vector<ParamPartition> other = kParams;
  other[2].numel += 1;
  Result<std::unique_ptr<OptimizerSwapper>> bad =
      OptimizerSwapper::create(cfg, other, optim::Optimizer(adamw()), *h, OpenMode::kOpen);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("another layout"), std::string::npos) << bad.status().to_string();
  cfg.buffer_size = 1000;
  cfg.pipeline_read = cfg.pipeline_write = true;
  Result<std::unique_ptr<OptimizerSwapper>> tiny =
      OptimizerSwapper::create(cfg, kParams, optim::Optimizer(adamw()), *h, OpenMode::kCreate);
  ASSERT_FALSE(tiny.is_ok());
  EXPECT_EQ(tiny.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(tiny.status().message().find("raise offload_optimizer.buffer_size"), std::string::npos);
  cfg.buffer_size = 8192;
  auto fresh = std::move(OptimizerSwapper::create(cfg, kParams, optim::Optimizer(adamw()), *h)).value();
  StepArgs in;
  in.ctx.step = 1;
  EXPECT_EQ(fresh->step(in).code(), ErrorCode::kInvalidArgument);  // no gradients, no master weights
}

// Damaged state on NVMe stops the step with a Corruption error naming the tensor, instead of
// feeding flipped bits into the update.
TEST(OptimizerSwapper, DamagedStateIsCorruptionNotNaN) {
  TempDir dir;
  auto h = testing::make_handle();
  OptimizerSwapConfig cfg = base_config(dir);
  cfg.pipeline_read = cfg.pipeline_write = true;
  auto sw = std::move(OptimizerSwapper::create(cfg, kParams, optim::Optimizer(adamw()), *h)).value();
  ASSERT_TRUE(sw->init_master(initial_source()).is_ok());
  std::vector<std::vector<std::uint16_t>> copies;
  for (const SubGroup& g : sw->layout().subgroups) copies.emplace_back(g.numel, 0);
  HostParamSink sink = host_sink(copies);
  auto inputs = [&](int step, const std::vector<std::vector<std::byte>>& grads) {
    StepArgs in;
    in.ctx.step = step;
    in.grads = views(grads, DType::kF32);
    in.sink = &sink;
    return in;
  };
  const auto grads1 = make_grads(sw->layout(), DType::kF32, 1);
  ASSERT_TRUE(sw->step(inputs(1, grads1)).is_ok());
  // Set the exponent bits of the first element of every tensor: a NaN if it were used.
  for (const std::string& key : sw->store().keys()) {
    Result<TensorRecord> r = sw->store().find(key);
    ASSERT_TRUE(r.is_ok());
    const Extent& e = r->extents[0];
    const int fd = ::open(sw->store().data_files()[e.file].c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const unsigned char nan_bytes[4] = {0xff, 0xff, 0xff, 0x7f};
    ASSERT_EQ(::pwrite(fd, nan_bytes, 4, static_cast<off_t>(e.offset)), 4);
    ::close(fd);
  }
  const auto grads2 = make_grads(sw->layout(), DType::kF32, 2);
  const Status st = sw->step(inputs(2, grads2));
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), ErrorCode::kCorruption) << st.to_string();
  EXPECT_NE(st.message().find("checksum mismatch in tensor 'sg0/"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("stripe0.swp offset"), std::string::npos) << st.to_string();
  EXPECT_EQ(sw->committed_step(), 1);
}

}  // namespace
}  // namespace zinf::swap
