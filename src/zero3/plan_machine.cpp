// The planner's view of the machine: memory, cores and drives, and the quick probes of its roofs.
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "zinf/aio/handle.h"
#include "zinf/aio/pinned.h"
#include "zinf/model/matmul.h"
#include "zinf/optim/half.h"
#include "zinf/topology.h"
#include "zinf/zero3/plan.h"

namespace zinf::zero3 {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// MemAvailable from /proc/meminfo (0 when unknown).
std::uint64_t meminfo_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

// Seconds per call of fn: the median of `rounds` rounds of at least min_s / rounds each, after
// one warm-up call. The median, not the best: on a shared machine a run sees the interference the
// probe saw, and a best-case rate predicted loaded runs up to twice too fast (docs/plan.md).
template <typename Fn>
double median_seconds(Fn&& fn, double min_s, int rounds) {
  fn();
  std::vector<double> per_call;
  for (int r = 0; r < rounds; ++r) {
    int reps = 0;
    const auto t0 = Clock::now();
    do {
      fn();
      ++reps;
    } while (since(t0) < min_s / rounds);
    per_call.push_back(since(t0) / reps);
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

}  // namespace

model::ComputePrecision compute_precision(config::Precision precision) {
  switch (precision) {
    case config::Precision::kBf16:
      return model::ComputePrecision::kBf16;
    case config::Precision::kFp16:
      return model::ComputePrecision::kFp16;
    case config::Precision::kFp32:
      break;
  }
  return model::ComputePrecision::kFp32;
}

Result<Machine> describe_machine(const std::vector<std::string>& nvme_paths) {
  Machine m;
  m.host_available = meminfo_available();
  if (m.host_available == 0) {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    m.host_available = pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
    m.host_source = "physical memory (no MemAvailable)";
  } else {
    m.host_source = "MemAvailable now";
  }
  m.cores = std::max(1, topology().cores);
  for (const std::string& path : nvme_paths) {
    struct statvfs st {};
    if (::statvfs(path.c_str(), &st) != 0) {
      return Status::sys_error(fmt::format("--nvme-path {}: cannot read its free space", path), errno);
    }
    m.drives.push_back({path, static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize});
  }
  m.aio_source = "zinf's defaults (no --aio-summary)";
  // Assumed drive figures until an aio_bench summary or the probe gives them: the middle of what
  // this project's machines measured (docs/plan.md, "Time").
  m.nvme_read_gbps = {1.5, "assumed (give --aio-summary or --probe-io)", false};
  m.nvme_write_gbps = {1.0, "assumed (give --aio-summary or --probe-io)", false};
  return m;
}

void probe_matmul(Machine& machine, config::Precision precision, int hidden) {
  model::Matmul mm;
  Result<model::MatmulKind> kind = model::resolve_matmul(compute_precision(precision));
  std::string kind_name = "fp32";
  if (kind.is_ok() && mm.use(kind.value()).is_ok()) kind_name = std::string(model::matmul_kind_name(kind.value()));
  // A transformer MLP layer (C -> 4C) forward and backward at the model's width, capped so that
  // the probe stays well under a second on two cores; small row counts run below the roof
  // (a micro-batch of one short row), so the rate is taken at three.
  const int C = std::clamp(hidden, 64, 512), OC = 4 * C;
  machine.matmul_by_rows.clear();
  for (const int N : {128, 1024}) {
    std::vector<float> inp(static_cast<std::size_t>(N) * C, 0.01f), w(static_cast<std::size_t>(OC) * C, 0.02f),
        out(static_cast<std::size_t>(N) * OC), dout(static_cast<std::size_t>(N) * OC, 0.001f),
        dinp(static_cast<std::size_t>(N) * C), dw(static_cast<std::size_t>(OC) * C);
    // bf16 products read the bf16 copies the models keep (activations written so by the kernels
    // that produce them, weights cast once per gather), as here: rounding the fp32 inputs in every
    // call would time work the models do not do (docs/plan.md).
    std::vector<std::uint16_t> inp16, w16, dout16;
    if (mm.reads_bf16_inputs()) {
      for (auto [from, to] : {std::pair{&inp, &inp16}, std::pair{&w, &w16}, std::pair{&dout, &dout16}}) {
        to->resize(from->size());
        std::transform(from->begin(), from->end(), to->begin(), optim::f32_to_bf16_bits);
      }
    }
    auto input = [](const std::vector<float>& v, const std::vector<std::uint16_t>& b) {
      return b.empty() ? model::MatmulInput(v.data()) : model::MatmulInput(v.data(), b.data());
    };
    const double s = median_seconds(
        [&] {
          mm.forward(out.data(), input(inp, inp16), input(w, w16), nullptr, N, C, OC);
          mm.backward(dinp.data(), dw.data(), nullptr, input(dout, dout16), input(inp, inp16), input(w, w16), N, C,
                      OC);
        },
        0.15, 5);
    // More rows never run slower per flop (the same kernels over longer panels): a smaller rate
    // at more rows is interference on a shared machine, so the rate is kept non-decreasing.
    const double gflops = 3.0 * 2.0 * N * C * OC / s / 1e9;
    machine.matmul_by_rows.emplace_back(
        N, machine.matmul_by_rows.empty() ? gflops : std::max(gflops, machine.matmul_by_rows.back().second));
  }
  machine.matmul_gflops = {machine.matmul_by_rows[1].second,
                           fmt::format("measured: {} products, 1024x{}x{} forward + backward ({:.1f} at 128 rows)",
                                       kind_name, C, OC, machine.matmul_by_rows[0].second),
                           true};
}

Roof probe_memory_gbps() {
  // A STREAM triad over every core, 3 x 16 MiB per thread (past the caches, small enough that a
  // `zinf train --plan` peak is the training's, not the probe's), counted at
  // STREAM's 12 bytes per element (docs/measuring.md).
  const int threads = std::max(1, topology().cores);
  const std::size_t n = std::size_t{4} << 20;
  std::vector<std::vector<float>> a(threads, std::vector<float>(n, 1.0f)), b = a, c = a;
  auto triad = [&] {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        float* x = a[t].data();
        const float* y = b[t].data();
        const float* z = c[t].data();
        for (std::size_t i = 0; i < n; ++i) x[i] = y[i] + 0.5f * z[i];
      });
    }
    for (std::thread& th : pool) th.join();
  };
  const double s = median_seconds(triad, 0.12, 3);
  return {12.0 * static_cast<double>(n) * threads / s / 1e9,
          fmt::format("measured: triad, {} threads x 3 x {} MiB", threads, n * 4 >> 20), true};
}

Status read_aio_summary(const std::string& path, Machine& machine) {
  std::ifstream in(path);
  if (!in) return Status::sys_error(fmt::format("--aio-summary {}: cannot open", path), errno);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    return Status::invalid_argument(fmt::format("--aio-summary {}: not JSON ({})", path, e.what()));
  }
  auto number = [&](const char* key) -> Result<double> {
    if (!j.contains("best") || !j["best"].contains(key) || !j["best"][key].is_number() || j["best"][key] <= 0) {
      return Status::invalid_argument(fmt::format(
          "--aio-summary {}: best.{} is missing or not a positive number (expected aio_bench's summary.json)", path,
          key));
    }
    return j["best"][key].get<double>();
  };
  ZINF_ASSIGN_OR_RETURN(const double read, number("read_gbps"));
  ZINF_ASSIGN_OR_RETURN(const double write, number("write_gbps"));
  machine.nvme_read_gbps = {read, "from " + path + " (aio_bench)", true};
  machine.nvme_write_gbps = {write, "from " + path + " (aio_bench)", true};
  if (j.contains("aio") && j["aio"].is_object()) {
    const nlohmann::json& a = j["aio"];
    config::AioSection& s = machine.aio;
    try {
      s.block_size = a.value("block_size", s.block_size);
      s.queue_depth = a.value("queue_depth", s.queue_depth);
      s.intra_op_parallelism = a.value("intra_op_parallelism", s.intra_op_parallelism);
      s.single_submit = a.value("single_submit", s.single_submit);
      s.overlap_events = a.value("overlap_events", s.overlap_events);
    } catch (const nlohmann::json::exception& e) {
      return Status::invalid_argument(fmt::format("--aio-summary {}: the aio block: {}", path, e.what()));
    }
    machine.aio_source = "from " + path;
  }
  return Status::ok();
}

Status probe_drive(Machine& machine, std::uint64_t bytes) {
  if (machine.drives.empty()) return Status::invalid_argument("--probe-io needs an --nvme-path");
  const std::string file = machine.drives.front().path + fmt::format("/.zinf_plan_probe.{}", ::getpid());
  aio::AioConfig ac;
  ac.block_size = static_cast<std::size_t>(machine.aio.block_size);
  ac.queue_depth = static_cast<std::size_t>(machine.aio.queue_depth);
  ac.intra_op_parallelism = static_cast<std::size_t>(machine.aio.intra_op_parallelism);
  ac.single_submit = machine.aio.single_submit;
  ac.overlap_events = machine.aio.overlap_events;
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<aio::Handle> h, aio::Handle::create(ac));
  const std::size_t chunk = std::size_t{64} << 20;
  ZINF_ASSIGN_OR_RETURN(aio::PinnedBuffer buf, aio::PinnedBuffer::allocate(chunk));
  std::fill(buf.bytes(), buf.bytes() + chunk, std::byte{1});  // faulted in before timing (docs/measuring.md)
  const std::uint64_t total = std::max<std::uint64_t>(chunk, bytes / chunk * chunk);
  // The median of the chunks' rates: one chunk that met a stall (the file's first allocation, a
  // burst on a shared disk) does not set the figure, as it would set a total's.
  auto pass = [&](bool write) -> Result<double> {
    std::vector<double> rates;
    for (std::uint64_t off = 0; off < total; off += chunk) {
      const auto t0 = Clock::now();
      Status s = write ? h->sync_pwrite(buf.bytes(), chunk, file, off) : h->sync_pread(buf.bytes(), chunk, file, off);
      if (!s.is_ok()) return s;
      rates.push_back(static_cast<double>(chunk) / since(t0) / 1e9);
    }
    std::sort(rates.begin(), rates.end());
    return rates[rates.size() / 2];
  };
  // The file is laid out first and the timed pass writes over it: the engine's swap files are
  // written over from the second step on, and aio_bench times writes the same way (a first
  // write of new blocks can be much slower, docs/plan.md).
  Result<double> w = pass(true);
  if (w.is_ok()) w = pass(true);
  Result<double> r = w.is_ok() ? pass(false) : w;
  std::remove(file.c_str());
  if (!w.is_ok()) return w.status().with_context("--probe-io write");
  if (!r.is_ok()) return r.status().with_context("--probe-io read");
  const std::string src =
      fmt::format("measured: quick probe, {} MiB O_DIRECT in {} (written over), the median 64 MiB request",
                  total >> 20, machine.drives.front().path);
  machine.nvme_read_gbps = {r.value(), src, true};
  machine.nvme_write_gbps = {w.value(), src + " (writes may be absorbed by a host cache)", true};
  return Status::ok();
}

}  // namespace zinf::zero3
