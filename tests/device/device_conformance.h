// The device interface's contract (device/device.h), as tests that any implementation must pass:
// the host device on every machine (tests/device), the CUDA device where a GPU is (tests/gpu).
// An implementation supplies TestOps: a work item that computes on a block, and a gate that holds a
// stream until the test opens it, so ordering is checked without timing assumptions.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <functional>
#include <ostream>
#include <memory>
#include <string>
#include <vector>

#include "device/device.h"
#include "device/ops.h"
#include "zinf/aio/pinned.h"
#include "zinf/optim/grad_stats.h"
#include "zinf/optim/half.h"
#include "zinf/optim/optimizer.h"

namespace zinf::device::testing {

class TestOps {
 public:
  virtual ~TestOps() = default;
  // Work that sets p[i] = p[i] * mul + add for i < n, on the stream it runs on.
  virtual Work axpb(float* p, std::size_t n, float mul, float add) = 0;
  // Work that holds its stream until open(); one gate per test.
  virtual Work gate() = 0;
  virtual void open() = 0;
};

struct DeviceCase {
  std::string name;
  std::function<std::unique_ptr<Device>()> make_device;  // null: the test fails
  std::function<std::unique_ptr<TestOps>()> make_ops;
  // Non-empty: why the device cannot be used here, and the tests skip (optional).
  std::function<std::string()> skip_reason;
};

// A query's answer as 1 (complete), 0 (not yet) or -1 (an error), for EXPECT_EQ.
inline int query_state(const Result<bool>& r) { return r.is_ok() ? (r.value() ? 1 : 0) : -1; }

inline void PrintTo(const DeviceCase& c, std::ostream* os) { *os << c.name; }

inline std::string case_name(const ::testing::TestParamInfo<DeviceCase>& info) { return info.param.name; }

class DeviceConformance : public ::testing::TestWithParam<DeviceCase> {
 protected:
  void SetUp() override {
    if (GetParam().skip_reason) {
      const std::string why = GetParam().skip_reason();
      if (!why.empty()) {
        GTEST_SKIP() << why;
      }
    }
    dev_ = GetParam().make_device();
    ASSERT_NE(dev_, nullptr);
    ops_ = GetParam().make_ops();
  }
  void TearDown() override {
    if (ops_) ops_->open();  // never leave a stream held
    if (dev_) {
      EXPECT_TRUE(dev_->synchronize_all().is_ok());
    }
  }
  static aio::PinnedBuffer pinned(std::size_t bytes) {
    Result<aio::PinnedBuffer> b = aio::PinnedBuffer::allocate(bytes);
    EXPECT_TRUE(b.is_ok()) << b.status().to_string();
    return b.is_ok() ? std::move(b).value() : aio::PinnedBuffer();
  }
  static float* floats(const aio::PinnedBuffer& b) { return static_cast<float*>(b.data()); }

  // One round trip of `n` floats: host `in` -> device -> x * mul + add -> host `out`, with every
  // wait the contract asks for, or without the compute stream's wait for the upload.
  Status round_trip(const aio::PinnedBuffer& in, const aio::PinnedBuffer& out, std::size_t n, float mul, float add,
                    bool wait_for_upload, Event* done) {
    const std::size_t bytes = n * sizeof(float);
    // For the stream that writes it first; used on the others, declared before it is returned.
    ZINF_ASSIGN_OR_RETURN(DeviceBlock block, dev_->allocate(bytes, StreamRole::kH2D, "round trip"));
    ZINF_RETURN_IF_ERROR(dev_->copy_h2d(block.data(), in.data(), bytes, "upload"));
    ZINF_ASSIGN_OR_RETURN(Event uploaded, dev_->record(StreamRole::kH2D));
    if (wait_for_upload) ZINF_RETURN_IF_ERROR(dev_->wait(StreamRole::kCompute, uploaded));
    ZINF_RETURN_IF_ERROR(dev_->enqueue(StreamRole::kCompute, ops_->axpb(block.as<float>(), n, mul, add), "axpb"));
    block.record_use(dev_->stream_key(StreamRole::kCompute));
    ZINF_ASSIGN_OR_RETURN(Event computed, dev_->record(StreamRole::kCompute));
    ZINF_RETURN_IF_ERROR(dev_->wait(StreamRole::kD2H, computed));
    ZINF_RETURN_IF_ERROR(dev_->copy_d2h(out.data(), block.data(), bytes, "download"));
    block.record_use(dev_->stream_key(StreamRole::kD2H));
    ZINF_ASSIGN_OR_RETURN(*done, dev_->record(StreamRole::kD2H));
    return Status::ok();  // the block goes back to the cache here, fenced by both uses
  }

  std::unique_ptr<Device> dev_;
  std::unique_ptr<TestOps> ops_;
};

// Many round trips in flight at once, each block returned as soon as its work is enqueued (so
// later round trips reuse blocks behind fences): every result exact.
TEST_P(DeviceConformance, RoundTripsInFlightAreExact) {
  constexpr std::size_t n = 3000;
  constexpr int kTrips = 24;
  std::vector<aio::PinnedBuffer> in, out;
  std::vector<Event> done(kTrips);
  for (int t = 0; t < kTrips; ++t) {
    in.push_back(pinned(n * sizeof(float)));
    out.push_back(pinned(n * sizeof(float)));
    for (std::size_t i = 0; i < n; ++i) floats(in.back())[i] = static_cast<float>((i * 7 + t) % 1000) * 0.25f;
    std::memset(out.back().data(), 0, n * sizeof(float));
  }
  for (int t = 0; t < kTrips; ++t) {
    ASSERT_TRUE(round_trip(in[t], out[t], n, 2.0f, static_cast<float>(t), true, &done[t]).is_ok());
  }
  for (int t = 0; t < kTrips; ++t) {
    ASSERT_TRUE(dev_->synchronize(done[t]).is_ok());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += floats(out[t])[i] != floats(in[t])[i] * 2.0f + static_cast<float>(t);
    EXPECT_EQ(bad, 0u) << "round trip " << t << " on " << dev_->describe();
  }
  const AllocatorStats s = dev_->allocator_stats();
  EXPECT_EQ(s.blocks_in_use, 0u);
  // Both devices time their copy streams (what the step report's GB/s divide by).
  for (StreamRole role : {StreamRole::kH2D, StreamRole::kD2H}) {
    Result<double> busy = dev_->copy_seconds(role);
    ASSERT_TRUE(busy.is_ok()) << busy.status().to_string();
    EXPECT_GT(busy.value(), 0.0) << stream_role_name(role);
  }
}

// fill_zero is ordered on its stream: after an upload it waits for, before a download that waits
// for it; only the bytes asked are zeroed.
TEST_P(DeviceConformance, FillZeroIsOrderedOnItsStream) {
  constexpr std::size_t n = 4096;
  aio::PinnedBuffer in = pinned(n * sizeof(float)), out = pinned(n * sizeof(float));
  for (std::size_t i = 0; i < n; ++i) floats(in)[i] = 1.0f + static_cast<float>(i);
  std::memset(out.data(), 0xFF, n * sizeof(float));
  Result<DeviceBlock> block = dev_->allocate(n * sizeof(float), StreamRole::kCompute, "fill_zero");
  ASSERT_TRUE(block.is_ok()) << block.status().to_string();
  float* d = block.value().as<float>();
  ASSERT_TRUE(dev_->wait(StreamRole::kH2D, dev_->record(StreamRole::kCompute).value()).is_ok());
  ASSERT_TRUE(dev_->copy_h2d(d, in.data(), n * sizeof(float), "upload").is_ok());
  block.value().record_use(dev_->stream_key(StreamRole::kH2D));
  ASSERT_TRUE(dev_->wait(StreamRole::kCompute, dev_->record(StreamRole::kH2D).value()).is_ok());
  ASSERT_TRUE(dev_->fill_zero(StreamRole::kCompute, d + 100, 1000 * sizeof(float), "middle").is_ok());
  ASSERT_TRUE(dev_->wait(StreamRole::kD2H, dev_->record(StreamRole::kCompute).value()).is_ok());
  ASSERT_TRUE(dev_->copy_d2h(out.data(), d, n * sizeof(float), "download").is_ok());
  block.value().record_use(dev_->stream_key(StreamRole::kD2H));
  Result<Event> done = dev_->record(StreamRole::kD2H);
  ASSERT_TRUE(done.is_ok());
  ASSERT_TRUE(dev_->synchronize(done.value()).is_ok());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float want = i >= 100 && i < 1100 ? 0.0f : floats(in)[i];
    bad += floats(out)[i] != want;
  }
  EXPECT_EQ(bad, 0u) << dev_->describe();
}

// The device's arithmetic (ops.h) gives the CPU's bits: the gradient norm over an array with
// several 8192-element blocks and a ragged end (and an inf: overflow is seen), an AdamW step with
// a bf16 copy, an addition, and the dtype conversions.
TEST_P(DeviceConformance, OpsGiveTheCpusBits) {
  DeviceOps* ops = dev_->ops();
  ASSERT_NE(ops, nullptr) << dev_->describe();
  constexpr std::size_t n = 3 * 8192 + 777;
  const std::size_t bytes = n * sizeof(float);
  std::vector<float> g(n), p(n), m(n), v(n), a(n);
  for (std::size_t i = 0; i < n; ++i) {
    g[i] = std::sin(0.37f * static_cast<float>(i)) * 1e-2f;
    p[i] = std::cos(0.11f * static_cast<float>(i));
    m[i] = g[i] * 0.5f;
    v[i] = g[i] * g[i] * 2.0f;
    a[i] = static_cast<float>(i % 97) * 0.125f;
  }
  // Device arrays: g, p, m, v, a, then a bf16 copy and an fp32 round trip.
  std::vector<Result<DeviceBlock>> blocks;
  for (int k = 0; k < 7; ++k) blocks.push_back(dev_->allocate(bytes, StreamRole::kCompute, "ops"));
  for (auto& b : blocks) ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  auto ptr = [&](int k) { return blocks[static_cast<std::size_t>(k)].value().as<float>(); };
  aio::PinnedBuffer staging = pinned(bytes);
  auto upload = [&](int k, const std::vector<float>& host) {
    std::memcpy(staging.data(), host.data(), bytes);
    ASSERT_TRUE(dev_->wait(StreamRole::kH2D, dev_->record(StreamRole::kCompute).value()).is_ok());
    ASSERT_TRUE(dev_->copy_h2d(ptr(k), staging.data(), bytes, "up").is_ok());
    ASSERT_TRUE(dev_->synchronize(dev_->record(StreamRole::kH2D).value()).is_ok());
    ASSERT_TRUE(dev_->wait(StreamRole::kCompute, dev_->record(StreamRole::kH2D).value()).is_ok());
  };
  auto download = [&](const void* src, std::size_t nbytes) {
    std::vector<char> out(nbytes);
    EXPECT_TRUE(dev_->wait(StreamRole::kD2H, dev_->record(StreamRole::kCompute).value()).is_ok());
    EXPECT_TRUE(dev_->copy_d2h(staging.data(), src, nbytes, "down").is_ok());
    EXPECT_TRUE(dev_->synchronize(dev_->record(StreamRole::kD2H).value()).is_ok());
    std::memcpy(out.data(), staging.data(), nbytes);
    return out;
  };
  upload(0, g);
  upload(1, p);
  upload(2, m);
  upload(3, v);
  upload(4, a);

  // The norm, bit for bit.
  const optim::GradStats want = optim::grad_stats(optim::GradView{g.data(), optim::DType::kF32, n, 1.0}).value();
  Result<optim::GradStats> got = ops->grad_stats(StreamRole::kCompute, ptr(0), n);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(std::memcmp(&got->sq_norm, &want.sq_norm, sizeof(double)), 0) << got->sq_norm << " vs " << want.sq_norm;
  EXPECT_EQ(got->elements, n);

  // AdamW with a bf16 copy, against optim on the host.
  auto adamw = optim::OptimizerConfig::parse("AdamW", {});
  ASSERT_TRUE(adamw.is_ok());
  const optim::Optimizer opt(adamw.value());
  ASSERT_TRUE(ops->steps(opt));
  optim::StepContext ctx;
  ctx.step = 3;
  ctx.lr = 1e-3;
  std::vector<std::uint16_t> copy(n);
  std::vector<float> hp = p, hm = m, hv = v;
  const std::vector<std::span<float>> hstate = {hm, hv};
  const optim::GradView hgrad{g.data(), optim::DType::kF32, n, 0.5};
  ASSERT_TRUE(opt.step(ctx, hp, hstate, hgrad, optim::HalfCopy{copy.data(), optim::DType::kBF16}).is_ok());
  Result<DeviceBlock> dcopy = dev_->allocate(n * 2, StreamRole::kCompute, "copy");
  ASSERT_TRUE(dcopy.is_ok());
  const std::vector<std::span<float>> dstate = {std::span<float>(ptr(2), n), std::span<float>(ptr(3), n)};
  ASSERT_TRUE(ops->optimizer_step(StreamRole::kCompute, opt, ctx, std::span<float>(ptr(1), n), dstate,
                                  optim::GradView{ptr(0), optim::DType::kF32, n, 0.5},
                                  optim::HalfCopy{dcopy.value().data(), optim::DType::kBF16})
                  .is_ok());
  EXPECT_EQ(std::memcmp(download(ptr(1), bytes).data(), hp.data(), bytes), 0) << "parameters";
  EXPECT_EQ(std::memcmp(download(ptr(2), bytes).data(), hm.data(), bytes), 0) << "exp_avg";
  EXPECT_EQ(std::memcmp(download(ptr(3), bytes).data(), hv.data(), bytes), 0) << "exp_avg_sq";
  EXPECT_EQ(std::memcmp(download(dcopy.value().data(), n * 2).data(), copy.data(), n * 2), 0) << "bf16 copy";

  // acc += in; fp32 -> bf16 -> fp32; a copy.
  ASSERT_TRUE(ops->add(StreamRole::kCompute, ptr(4), ptr(0), n).is_ok());
  std::vector<float> sum = a;
  for (std::size_t i = 0; i < n; ++i) sum[i] += g[i];
  EXPECT_EQ(std::memcmp(download(ptr(4), bytes).data(), sum.data(), bytes), 0) << "add";
  ASSERT_TRUE(ops->convert(StreamRole::kCompute, dcopy.value().data(), optim::DType::kBF16, ptr(0), optim::DType::kF32, n).is_ok());
  ASSERT_TRUE(ops->convert(StreamRole::kCompute, ptr(5), optim::DType::kF32, dcopy.value().data(), optim::DType::kBF16, n).is_ok());
  ASSERT_TRUE(ops->convert(StreamRole::kCompute, ptr(6), optim::DType::kF32, ptr(5), optim::DType::kF32, n).is_ok());
  std::vector<float> rounded(n);
  for (std::size_t i = 0; i < n; ++i) rounded[i] = optim::bf16_bits_to_f32(optim::f32_to_bf16_bits(g[i]));
  EXPECT_EQ(std::memcmp(download(ptr(6), bytes).data(), rounded.data(), bytes), 0) << "conversions";

  // An inf anywhere is an overflow.
  g[n - 5] = std::numeric_limits<float>::infinity();
  upload(0, g);
  got = ops->grad_stats(StreamRole::kCompute, ptr(0), n);
  ASSERT_TRUE(got.is_ok());
  EXPECT_FALSE(got->finite());
}

// Without the compute stream's wait for the upload (one wait removed), the harness sees it: with
// the upload held at a gate, the work reads the block's old contents. With the wait, it is right.
TEST_P(DeviceConformance, AMissingWaitIsCaught) {
  constexpr std::size_t n = 1024;
  aio::PinnedBuffer in = pinned(n * sizeof(float)), out = pinned(n * sizeof(float));
  for (bool with_wait : {true, false}) {
    SCOPED_TRACE(with_wait ? "with the wait" : "without the wait");
    for (std::size_t i = 0; i < n; ++i) floats(in)[i] = 3.0f;
    std::memset(out.data(), 0, n * sizeof(float));
    std::unique_ptr<TestOps> ops = GetParam().make_ops();
    std::swap(ops, ops_);  // a fresh gate for each variant
    ASSERT_TRUE(dev_->enqueue(StreamRole::kH2D, ops_->gate(), "gate").is_ok());
    Event done;
    ASSERT_TRUE(round_trip(in, out, n, 2.0f, 1.0f, with_wait, &done).is_ok());
    if (!with_wait) {
      // The download waits only for the work, which did not wait for the held upload.
      ASSERT_TRUE(dev_->synchronize(done).is_ok());
      EXPECT_NE(floats(out)[0], 7.0f) << "the work read the upload although nothing ordered it after the upload";
      ops_->open();
    } else {
      EXPECT_EQ(query_state(dev_->query(done)), 0) << "the download finished while the upload was held";
      ops_->open();
      ASSERT_TRUE(dev_->synchronize(done).is_ok());
      EXPECT_EQ(floats(out)[0], 7.0f);
      EXPECT_EQ(floats(out)[n - 1], 7.0f);
    }
    ASSERT_TRUE(dev_->synchronize_all().is_ok());
  }
}

TEST_P(DeviceConformance, EventsCompleteAfterTheirStreamsWork) {
  ASSERT_TRUE(dev_->enqueue(StreamRole::kCompute, ops_->gate(), "gate").is_ok());
  Result<Event> e = dev_->record(StreamRole::kCompute);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  Result<Event> other = dev_->record(StreamRole::kD2H);
  ASSERT_TRUE(other.is_ok());
  ASSERT_TRUE(dev_->synchronize(*other).is_ok()) << "another stream is not held by the gate";
  EXPECT_EQ(query_state(dev_->query(*e)), 0);
  // A stream that waits on the held event is held too.
  ASSERT_TRUE(dev_->wait(StreamRole::kH2D, *e).is_ok());
  Result<Event> behind = dev_->record(StreamRole::kH2D);
  ASSERT_TRUE(behind.is_ok());
  EXPECT_EQ(query_state(dev_->query(*behind)), 0);
  ops_->open();
  ASSERT_TRUE(dev_->synchronize(*behind).is_ok());
  EXPECT_EQ(query_state(dev_->query(*e)), 1);
  EXPECT_EQ(query_state(dev_->query(Event())), 1) << "an empty event is complete";
}

// A block that work on another stream still uses is not handed out again until that work is done.
TEST_P(DeviceConformance, ABlockIsNotReusedWhileAnotherStreamUsesIt) {
  constexpr std::size_t bytes = 1 << 20;
  ASSERT_TRUE(dev_->enqueue(StreamRole::kCompute, ops_->gate(), "gate").is_ok());
  void* first = nullptr;
  {
    Result<DeviceBlock> b = dev_->allocate(bytes, StreamRole::kH2D, "first");
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    ASSERT_TRUE(dev_->enqueue(StreamRole::kCompute, ops_->axpb(b->as<float>(), bytes / 4, 1.0f, 0.0f), "reader").is_ok());
    b->record_use(dev_->stream_key(StreamRole::kCompute));
    first = b->data();
  }
  Result<DeviceBlock> during = dev_->allocate(bytes, StreamRole::kH2D, "during");
  ASSERT_TRUE(during.is_ok());
  EXPECT_NE(during->data(), first) << "handed out while a held stream may still use it";
  ops_->open();
  ASSERT_TRUE(dev_->synchronize_all().is_ok());
  Result<DeviceBlock> after = dev_->allocate(bytes, StreamRole::kH2D, "after");
  ASSERT_TRUE(after.is_ok());
  EXPECT_EQ(after->data(), first) << "the only idle block of that size";
}

TEST_P(DeviceConformance, BadArgumentsAreErrorsNamingTheCall) {
  const Status st = dev_->copy_h2d(nullptr, nullptr, 16, "layer 3 weights");
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("layer 3 weights"), std::string::npos) << st.message();
  EXPECT_FALSE(dev_->enqueue(StreamRole::kCompute, Work(), "nothing").is_ok());
  EXPECT_TRUE(dev_->copy_h2d(nullptr, nullptr, 0, "empty").is_ok());
}

}  // namespace zinf::device::testing
