// Throughput of aio Handle sync_pread/sync_pwrite (64 MiB, O_DIRECT) per backend and mode.
//
// Files go to $ZINF_BENCH_TMPDIR (default /tmp). Buffers are PinnedBuffers (pre-faulted, so
// first-touch page faults are not timed). Absolute figures on shared virtual disks are noise:
// compare runs interleaved, or use tools/aio_bench, which measures fio in the same run.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include "zinf/aio/handle.h"
#include "zinf/aio/pinned.h"

namespace zinf::aio {
namespace {

constexpr std::size_t kBytes = 64u << 20;

// One scratch folder and one pre-faulted buffer for the whole run.
struct Scratch {
  std::string dir;
  std::string file;
  PinnedBuffer buffer;

  Scratch() {
    const char* env = std::getenv("ZINF_BENCH_TMPDIR");
    std::string templ = std::string(env != nullptr && *env != '\0' ? env : "/tmp") + "/zinf-aio-bench-XXXXXX";
    if (::mkdtemp(templ.data()) != nullptr) dir = templ;
    file = dir + "/data.bin";
    auto allocated = PinnedBuffer::allocate(kBytes);
    if (allocated.is_ok()) buffer = std::move(allocated).value();
    for (std::size_t i = 0; i < buffer.size(); ++i) buffer.bytes()[i] = static_cast<std::byte>(i * 131 >> 7);
  }
  ~Scratch() {
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
};

Scratch& scratch() {
  static Scratch s;
  return s;
}

// Args: backend index, queue_depth, intra_op_parallelism, single_submit, overlap_events, fixed buffers.
std::unique_ptr<Handle> make_handle(benchmark::State& state) {
  constexpr Backend kBackends[] = {Backend::kIoUring, Backend::kLibaio, Backend::kThreads};
  AioConfig config;
  config.backend = kBackends[state.range(0)];
  config.queue_depth = static_cast<std::size_t>(state.range(1));
  config.intra_op_parallelism = static_cast<std::size_t>(state.range(2));
  config.single_submit = state.range(3) != 0;
  config.overlap_events = state.range(4) != 0;
  state.SetLabel(fmt::format("{} bs=1M qd={} p={}{}{}{}", backend_name(config.backend), config.queue_depth,
                             config.intra_op_parallelism, config.single_submit ? " single" : "",
                             config.overlap_events ? "" : " sequential", state.range(5) ? " fixed" : ""));
  if (!backend_available(config.backend)) {
    state.SkipWithError(fmt::format("{} is not available here", backend_name(config.backend)).c_str());
    return nullptr;
  }
  if (scratch().dir.empty() || scratch().buffer.size() != kBytes) {
    state.SkipWithError("no scratch folder or buffer");
    return nullptr;
  }
  auto handle = Handle::create(config);
  if (!handle.is_ok()) {
    state.SkipWithError(handle.status().to_string().c_str());
    return nullptr;
  }
  if (state.range(5) != 0) {
    const Status st = handle.value()->register_buffer(scratch().buffer.data(), kBytes);
    if (!st.is_ok()) state.SkipWithError(st.to_string().c_str());
  }
  return std::move(handle).value();
}

void BM_SyncWrite(benchmark::State& state) {
  auto handle = make_handle(state);
  if (!handle) return;
  for (auto _ : state) {
    const Status st = handle->sync_pwrite(scratch().buffer.data(), kBytes, scratch().file, 0);
    if (!st.is_ok()) {
      state.SkipWithError(st.to_string().c_str());
      break;
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBytes));
}

void BM_SyncRead(benchmark::State& state) {
  auto handle = make_handle(state);
  if (!handle) return;
  // The file must exist in full before it is read.
  if (!handle->sync_pwrite(scratch().buffer.data(), kBytes, scratch().file, 0).is_ok()) {
    state.SkipWithError("preparing the file failed");
    return;
  }
  for (auto _ : state) {
    const Status st = handle->sync_pread(scratch().buffer.data(), kBytes, scratch().file, 0);
    if (!st.is_ok()) {
      state.SkipWithError(st.to_string().c_str());
      break;
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBytes));
}

void modes(benchmark::internal::Benchmark* b) {
  // backend, qd, parallelism, single_submit, overlap, fixed
  for (int backend : {0, 1, 2}) {
    b->Args({backend, 8, 1, 0, 1, 0});
    b->Args({backend, 32, 1, 0, 1, 0});
    b->Args({backend, 8, 2, 0, 1, 0});
    b->Args({backend, 8, 1, 1, 0, 0});
  }
  b->Args({0, 8, 1, 0, 1, 1});  // io_uring with the buffer registered (fixed reads/writes)
  b->Args({0, 32, 1, 0, 1, 1});
  b->ArgNames({"backend", "qd", "p", "single", "overlap", "fixed"});
  b->UseRealTime();
  b->Unit(benchmark::kMillisecond);
  b->MinTime(0.5);
}

BENCHMARK(BM_SyncWrite)->Apply(modes);
BENCHMARK(BM_SyncRead)->Apply(modes);

}  // namespace
}  // namespace zinf::aio

BENCHMARK_MAIN();
