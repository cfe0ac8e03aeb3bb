// gpu_copy_bench: pinned H2D/D2H bandwidth through zinf's CopyEngine vs plain cudaMemcpyAsync from
// cudaMallocHost memory (the machine's copy peak), measured interleaved in one run.
//
// Not Google Benchmark: every (size, direction) runs both paths `--repeats` times, alternating
// which goes first (A B, B A, ...), and prints the medians and their ratio. The goal is
// zinf/cudaMemcpy >= 0.9 at the sizes the engine moves (a layer's parameters: MiBs to a GiB).
//   zinf path: aio::PinnedBuffer (posix_memalign + mlock + cudaHostRegister, the memory zinf's
//              staging and pinned pool use) -> CopyEngine::copy_h2d/copy_d2h (pointer checks, an
//              event per copy, two copy streams)
//   reference: cudaMallocHost -> cudaMemcpyAsync on two raw non-blocking streams
// Directions: h2d, d2h, and bidir (both at once, on both copy engines; GB/s counts both ways).
// Without a GPU it prints one line "gpu_copy_bench: no CUDA device: ..." and exits 2.
//
//   gpu_copy_bench [--min-size 1M] [--max-size 1G] [--repeats 5] [--bytes-per-run 2G] [--json FILE]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "gpu/copy_engine.h"
#include "gpu/cuda_error.h"
#include "gpu/device.h"
#include "gpu/device_buffer.h"
#include "gpu/stream.h"
#include "zinf/aio/pinned.h"

namespace zinf::gpu {
namespace {

enum class Dir { kH2D, kD2H, kBidir };
const char* dir_name(Dir d) { return d == Dir::kH2D ? "h2d" : d == Dir::kD2H ? "d2h" : "bidir"; }

// cudaMallocHost memory, freed with cudaFreeHost.
struct HostFree {
  void operator()(void* p) const { if (p != nullptr) cudaFreeHost(p); }
};
using CudaHostPtr = std::unique_ptr<void, HostFree>;

Result<CudaHostPtr> cuda_host_alloc(std::size_t bytes) {
  void* p = nullptr;
  ZINF_CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, bytes), fmt::format("cudaMallocHost {} bytes", bytes));
  // Touch every page before timing (docs/measuring.md: first touch costs).
  for (std::size_t i = 0; i < bytes; i += 4096) static_cast<volatile char*>(p)[i] = static_cast<char>(i >> 12);
  return CudaHostPtr(p);
}

struct Buffers {
  aio::PinnedBuffer zinf_up, zinf_down;  // zinf's pinned host memory, one per direction
  CudaHostPtr ref_up, ref_down;          // cudaMallocHost, one per direction
  DeviceBuffer dev_up, dev_down;         // device destinations/sources, one per direction
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

using Clock = std::chrono::steady_clock;

// `copies` copies of `size` bytes in each active direction through the engine; GB/s (1e9 B/s),
// counted over both directions for bidir. Wall time from the first enqueue to the last completion,
// so the engine's per-copy checks and events are included.
Result<double> run_engine(CopyEngine& engine, Buffers& b, Dir dir, std::size_t size, std::size_t copies) {
  const auto t0 = Clock::now();
  for (std::size_t i = 0; i < copies; ++i) {
    if (dir != Dir::kD2H) ZINF_RETURN_IF_ERROR(engine.copy_h2d(b.dev_up.data(), b.zinf_up.data(), size, nullptr, "bench h2d").status());
    if (dir != Dir::kH2D) ZINF_RETURN_IF_ERROR(engine.copy_d2h(b.zinf_down.data(), b.dev_down.data(), size, nullptr, "bench d2h").status());
  }
  ZINF_RETURN_IF_ERROR(engine.synchronize());
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double ways = dir == Dir::kBidir ? 2.0 : 1.0;
  return ways * static_cast<double>(size) * static_cast<double>(copies) / s / 1e9;
}

Result<double> run_reference(const Stream& up, const Stream& down, Buffers& b, Dir dir, std::size_t size,
                             std::size_t copies) {
  const auto t0 = Clock::now();
  for (std::size_t i = 0; i < copies; ++i) {
    if (dir != Dir::kD2H) {
      ZINF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.dev_up.data(), b.ref_up.get(), size, cudaMemcpyHostToDevice, up.get()),
                                "reference cudaMemcpyAsync H2D");
    }
    if (dir != Dir::kH2D) {
      ZINF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.ref_down.get(), b.dev_down.data(), size, cudaMemcpyDeviceToHost, down.get()),
                                "reference cudaMemcpyAsync D2H");
    }
  }
  ZINF_RETURN_IF_ERROR(up.synchronize());
  ZINF_RETURN_IF_ERROR(down.synchronize());
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double ways = dir == Dir::kBidir ? 2.0 : 1.0;
  return ways * static_cast<double>(size) * static_cast<double>(copies) / s / 1e9;
}

struct Row {
  std::size_t size;
  Dir dir;
  double zinf_gbps, ref_gbps;
};

std::string size_text(std::size_t b) {
  return b >= (1u << 30) ? fmt::format("{} GiB", b >> 30) : fmt::format("{} MiB", b >> 20);
}

struct Options {
  std::size_t min_size = 1u << 20, max_size = 1u << 30;
  std::size_t bytes_per_run = 2ull << 30;
  int repeats = 5;
  std::string json_path;
};

int run(const Options& o) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "gpu_copy_bench: %s\n", s.message().c_str());
    return 2;
  };
  // "no CUDA device: ..." before anything else.
  Result<DeviceInfo> info = select_device(0);
  if (!info.is_ok()) return fail(info.status());
  Result<std::unique_ptr<CopyEngine>> engine = CopyEngine::create(0);
  if (!engine.is_ok()) return fail(engine.status());
  auto up = Stream::create(0, "reference H2D");
  auto down = Stream::create(0, "reference D2H");
  if (!up.is_ok()) return fail(up.status());
  if (!down.is_ok()) return fail(down.status());
  Buffers b;
  const std::size_t max = o.max_size;
  for (aio::PinnedBuffer* p : {&b.zinf_up, &b.zinf_down}) {
    auto buf = aio::PinnedBuffer::allocate(max);
    if (!buf.is_ok()) return fail(buf.status());
    *p = std::move(buf).value();
  }
  if (!b.zinf_up.cuda_registered() || !b.zinf_down.cuda_registered()) {
    return fail(Status::unsupported(
        "PinnedBuffer memory was not registered with CUDA (cudaHostRegister refused; see the notice above)"));
  }
  for (CudaHostPtr* p : {&b.ref_up, &b.ref_down}) {
    auto h = cuda_host_alloc(max);
    if (!h.is_ok()) return fail(h.status());
    *p = std::move(h).value();
  }
  for (DeviceBuffer* p : {&b.dev_up, &b.dev_down}) {
    auto d = DeviceBuffer::allocate(0, max, "gpu_copy_bench device buffer");
    if (!d.is_ok()) return fail(d.status());
    *p = std::move(d).value();
  }

  std::cout << fmt::format("zinf gpu_copy_bench | {} | copy engines {} | {} repeats per point, interleaved, "
                           "~{} MiB per timed run\n",
                           info->to_string(), info->async_engine_count, o.repeats, o.bytes_per_run >> 20);
  std::cout << fmt::format("{:>9} {:>6} {:>12} {:>16} {:>8}\n", "size", "dir", "zinf GB/s", "cudaMemcpy GB/s",
                           "ratio");
  std::vector<Row> rows;
  for (std::size_t size = o.min_size; size <= max; size *= 4) {
    const std::size_t copies = std::max<std::size_t>(3, o.bytes_per_run / size);
    for (Dir dir : {Dir::kH2D, Dir::kD2H, Dir::kBidir}) {
      // One untimed pass of each path first (first-use costs of the streams and the memory).
      auto warm = run_engine(**engine, b, dir, size, 1);
      if (!warm.is_ok()) return fail(warm.status());
      warm = run_reference(*up, *down, b, dir, size, 1);
      if (!warm.is_ok()) return fail(warm.status());
      std::vector<double> mine, ref;
      for (int rep = 0; rep < o.repeats; ++rep) {
        for (int k = 0; k < 2; ++k) {
          const bool engine_turn = (k == 0) == (rep % 2 == 0);
          auto r = engine_turn ? run_engine(**engine, b, dir, size, copies)
                               : run_reference(*up, *down, b, dir, size, copies);
          if (!r.is_ok()) return fail(r.status().with_context(fmt::format("{} {}", dir_name(dir), size_text(size))));
          (engine_turn ? mine : ref).push_back(r.value());
        }
      }
      const Row row{size, dir, median(mine), median(ref)};
      rows.push_back(row);
      std::cout << fmt::format("{:>9} {:>6} {:>12.2f} {:>16.2f} {:>8.3f}\n", size_text(size), dir_name(dir),
                               row.zinf_gbps, row.ref_gbps, row.zinf_gbps / row.ref_gbps)
                << std::flush;
    }
  }
  // The peak of each direction: the best median over sizes, for each path.
  std::string json = "{\n  \"device\": \"" + info->name + "\",\n  \"rows\": [\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    json += fmt::format("    {{\"bytes\": {}, \"dir\": \"{}\", \"zinf_gbps\": {:.3f}, \"cudamemcpy_gbps\": {:.3f}}}{}\n",
                        rows[i].size, dir_name(rows[i].dir), rows[i].zinf_gbps, rows[i].ref_gbps,
                        i + 1 < rows.size() ? "," : "");
  }
  json += "  ],\n  \"peak\": {";
  std::cout << "\n";
  for (Dir dir : {Dir::kH2D, Dir::kD2H, Dir::kBidir}) {
    double zinf = 0, ref = 0;
    for (const Row& r : rows) {
      if (r.dir != dir) continue;
      zinf = std::max(zinf, r.zinf_gbps);
      ref = std::max(ref, r.ref_gbps);
    }
    std::cout << fmt::format("peak {:<5}: zinf {:.2f} GB/s, cudaMemcpy {:.2f} GB/s, ratio {:.3f} (goal >= 0.9)\n",
                             dir_name(dir), zinf, ref, zinf / ref);
    json += fmt::format("{}\"{}\": {{\"zinf_gbps\": {:.3f}, \"cudamemcpy_gbps\": {:.3f}, \"ratio\": {:.3f}}}",
                        dir == Dir::kH2D ? "" : ", ", dir_name(dir), zinf, ref, zinf / ref);
  }
  json += "}\n}\n";
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    f << json;
    if (!f) return fail(Status::sys_error(fmt::format("write --json {}", o.json_path), errno));
  }
  return 0;
}

}  // namespace
}  // namespace zinf::gpu

int main(int argc, char** argv) {
  zinf::gpu::Options o;
  CLI::App app{"gpu_copy_bench: pinned H2D/D2H through zinf's CopyEngine vs cudaMemcpyAsync from cudaMallocHost"};
  app.add_option("--min-size", o.min_size, "smallest copy (1M, 1G, ...; sizes grow x4)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--max-size", o.max_size, "largest copy (host and device buffers of this size, two of each)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--bytes-per-run", o.bytes_per_run, "bytes per direction per timed run (at least 3 copies)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--repeats", o.repeats, "timed runs per path and point")->check(CLI::Range(1, 100));
  app.add_option("--json", o.json_path, "write the rows and peaks as JSON here");
  CLI11_PARSE(app, argc, argv);
  if (o.min_size > o.max_size) {
    std::fprintf(stderr, "gpu_copy_bench: --min-size is larger than --max-size\n");
    return 2;
  }
  return zinf::gpu::run(o);
}
