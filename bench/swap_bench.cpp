// The optimizer step over state on NVMe, against its I/O-bound and compute-bound ideals.
//
// Sets up N parameters (default 400M: 4.8 GB of fp32 master + Adam moments per slot, 9.6 GB on
// disk with the two slots) with state in an OptimizerSwapper, gradients (fp32) and the bf16
// copies in memory, then runs interleaved rounds (order alternating) of:
//   - the aio engine alone on the same folder, same handle: write then read of a file in
//     requests of one tile, for the read and write bandwidth;
//   - the pipelined NVMe step (pipeline_read and pipeline_write);
//   - the same step with pipelining off;
//   - the same step in memory (the same kernel over in-memory arrays): the compute ideal;
//   - the pipelined NVMe step with the swap store's page checksums off (its own store, in
//     <nvme_path>/no_checksums), for the cost of the checksums (on by default).
// The I/O ideal is bytes_read / read_bw + bytes_written / write_bw of the step. Medians over the
// rounds give the last line:
//   step_s=X io_ideal_s=Y compute_ideal_s=Z ratio=X/max(Y,Z) unpipelined_s=U
//   no_checksums_step_s=N checksum_cost=median over rounds of (X / N) of the same round
// Figures on a virtual disk are noisy; compare ratios from one run, not absolute numbers.
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "swap/host_buffer.h"
#include "zinf/aio/handle.h"
#include "zinf/optim/optimizer.h"
#include "zinf/swap/optimizer_swapper.h"
#include "zinf/swap/param_sink.h"
#include "zinf/topology.h"

namespace {

using namespace zinf;
using namespace zinf::swap;
using Clock = std::chrono::steady_clock;

struct Options {
  std::uint64_t params = 400'000'000;
  std::uint64_t partition = 50'000'000;  // elements per parameter partition
  std::uint64_t sub_group_size = 1'000'000'000;
  std::size_t buffer_count = 4;
  std::size_t buffer_size = 64 << 20;  // fp32 elements per pinned buffer (1 GiB in all)
  std::vector<std::string> nvme_paths;
  std::size_t block_size = 1 << 20;
  std::size_t queue_depth = 32;
  std::size_t intra_op = 1;
  std::string backend = "auto";
  int rounds = 3;
  bool keep = false;
  bool checksums = true;  // the store's page checksums (the no-checksum comparison turns them off)
  bool compare_checksums = true;
};

double secs(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

[[noreturn]] void die(const Status& st) {
  std::fprintf(stderr, "swap_bench: %s\n", st.to_string().c_str());
  std::exit(1);
}

template <typename T>
T check(Result<T> r) {
  if (!r.is_ok()) die(r.status());
  return std::move(r).value();
}

void check(const Status& st) {
  if (!st.is_ok()) die(st);
}

optim::Optimizer make_adamw() {
  optim::AdamParams p;
  p.weight_decay = 0.01;
  return optim::Optimizer(optim::OptimizerConfig{p});
}

// Every in-memory array, allocated and written before anything is timed.
struct Memory {
  std::vector<std::uint64_t> numel;                             // per sub-group
  std::vector<detail::HostBuffer> grads, copies, master, m, v;  // per sub-group
  std::unique_ptr<HostParamSink> sink;                          // over copies (bf16)
};

Memory allocate_memory(const PartitionLayout& layout) {
  Memory mem;
  std::uint32_t x = 12345;
  for (const SubGroup& g : layout.subgroups) {
    mem.numel.push_back(g.numel);
    mem.grads.push_back(check(detail::HostBuffer::allocate(g.numel * 4, false)));
    mem.copies.push_back(check(detail::HostBuffer::allocate(g.numel * 2, false)));
    mem.master.push_back(check(detail::HostBuffer::allocate(g.numel * 4, false)));
    mem.m.push_back(check(detail::HostBuffer::allocate(g.numel * 4, false)));
    mem.v.push_back(check(detail::HostBuffer::allocate(g.numel * 4, false)));
    auto* grad = reinterpret_cast<float*>(mem.grads.back().data());
    auto* master = reinterpret_cast<float*>(mem.master.back().data());
    for (std::uint64_t i = 0; i < g.numel; ++i) {
      x = x * 1664525u + 1013904223u;
      grad[i] = static_cast<float>(static_cast<std::int32_t>(x >> 8) - (1 << 23)) * 1e-9f;
      master[i] = grad[i] * 100.0f;
    }
  }
  std::vector<void*> copies;
  for (detail::HostBuffer& c : mem.copies) copies.push_back(c.data());
  mem.sink = std::make_unique<HostParamSink>(std::move(copies), DType::kBF16);
  return mem;
}

StepArgs inputs(const Memory& mem, std::int64_t step) {
  StepArgs in;
  in.ctx.step = step;
  for (std::size_t g = 0; g < mem.grads.size(); ++g) {
    in.grads.push_back(optim::GradView{mem.grads[g].data(), DType::kF32, mem.numel[g], 1.0});
  }
  in.sink = mem.sink.get();
  return in;
}

// The same step in memory: the compute-bound ideal.
double memory_step(const PartitionLayout& layout, const optim::Optimizer& opt, Memory& mem, std::int64_t step) {
  const auto t0 = Clock::now();
  for (std::size_t g = 0; g < layout.subgroups.size(); ++g) {
    const std::size_t n = layout.subgroups[g].numel;
    std::span<float> state[2] = {{reinterpret_cast<float*>(mem.m[g].data()), n},
                                 {reinterpret_cast<float*>(mem.v[g].data()), n}};
    optim::StepContext ctx;
    ctx.step = step;
    check(opt.step(ctx, {reinterpret_cast<float*>(mem.master[g].data()), n}, state,
                   optim::GradView{mem.grads[g].data(), DType::kF32, n, 1.0},
                   optim::HalfCopy{mem.copies[g].data(), DType::kBF16}));
  }
  return secs(t0);
}

OptimizerSwapConfig swap_config(const Options& o, bool pipelined) {
  OptimizerSwapConfig c;
  c.store.nvme_paths = o.nvme_paths;
  c.buffer_count = o.buffer_count;
  c.buffer_size = o.buffer_size;
  c.sub_group_size = o.sub_group_size;
  c.pipeline_read = c.pipeline_write = pipelined;
  c.pin_memory = true;
  c.store.checksums = o.checksums;
  return c;
}

std::vector<ParamPartition> partitions(const Options& o) {
  std::vector<ParamPartition> p;
  for (std::uint64_t done = 0, i = 0; done < o.params; ++i) {
    const std::uint64_t n = std::min(o.partition, o.params - done);
    p.push_back(ParamPartition{fmt::format("layer{}.weight", i), n});
    done += n;
  }
  return p;
}

struct Bandwidth {
  double read_bps = 0, write_bps = 0;
};

// A file in the swap folder for the aio engine alone, written once before timing so that the
// timed passes, like the steps, run on allocated, already written blocks (steady state).
class BandwidthFile {
 public:
  BandwidthFile(aio::Handle& h, std::string path, std::size_t request, std::uint64_t total)
      : h_(h), path_(std::move(path)), request_(request), total_(total / request * request) {
    buf_ = check(detail::HostBuffer::allocate(request * 3, true));
    std::memset(buf_.data(), 0x5a, buf_.size());
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
    if (fd_ < 0) die(Status::sys_error("open " + path_, errno));
    if (::fallocate(fd_, 0, 0, static_cast<off_t>(total_)) != 0) die(Status::sys_error("fallocate " + path_, errno));
    (void)pass(true);
  }
  ~BandwidthFile() {
    ::close(fd_);
    std::filesystem::remove(path_);
  }
  // Timed passes, write and read, the order alternating with `round`.
  Bandwidth measure(int round) {
    Bandwidth bw;
    for (int k = 0; k < 2; ++k) {
      const bool write = (k + round) % 2 == 0;
      (write ? bw.write_bps : bw.read_bps) = static_cast<double>(total_) / pass(write);
    }
    return bw;
  }

 private:
  // The whole file in `request`-byte requests, three in flight (a tile has three state tensors).
  double pass(bool write) {
    std::vector<aio::RequestId> inflight;
    const auto t0 = Clock::now();
    for (std::uint64_t off = 0, i = 0; off < total_; off += request_, ++i) {
      if (inflight.size() == 3) {
        check(h_.wait(inflight.front()));
        inflight.erase(inflight.begin());
      }
      std::byte* p = buf_.data() + (i % 3) * request_;
      inflight.push_back(check(write ? h_.async_pwrite(p, request_, fd_, off) : h_.async_pread(p, request_, fd_, off)));
    }
    for (aio::RequestId id : inflight) check(h_.wait(id));
    if (write && ::fdatasync(fd_) != 0) die(Status::sys_error("fdatasync " + path_, errno));  // as a step's commit
    return secs(t0);
  }

  aio::Handle& h_;
  std::string path_;
  std::size_t request_;
  std::uint64_t total_;
  detail::HostBuffer buf_;
  int fd_ = -1;
};

StepStats nvme_step(const Options& o, aio::Handle& h, const Memory& mem, bool pipelined, std::int64_t step) {
  auto sw = check(OptimizerSwapper::create(swap_config(o, pipelined), partitions(o), make_adamw(), h, OpenMode::kOpen));
  check(sw->step(inputs(mem, step)));
  return sw->last_stats();
}

void require_space(const std::string& folder, std::uint64_t bytes) {
  struct statvfs s {};
  if (::statvfs(folder.c_str(), &s) != 0) die(Status::sys_error("statvfs " + folder, errno));
  const std::uint64_t free = static_cast<std::uint64_t>(s.f_bavail) * s.f_frsize;
  if (free < bytes) {
    die(Status::resource_exhausted(fmt::format("{} has {:.1f} GB free; this run needs {:.1f} GB (lower --params)",
                                               folder, free / 1e9, bytes / 1e9)));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"swap_bench: the pipelined NVMe optimizer step against its I/O and compute ideals"};
  app.add_option("--params", o.params, "parameters (elements)");
  app.add_option("--partition", o.partition, "elements per parameter partition");
  app.add_option("--sub-group-size", o.sub_group_size, "sub_group_size (elements)");
  app.add_option("--buffer-count", o.buffer_count, "offload_optimizer.buffer_count");
  app.add_option("--buffer-size", o.buffer_size, "fp32 elements per pinned buffer");
  app.add_option("--nvme-path", o.nvme_paths, "folder(s) for the swap files (default ./swap_bench_data)");
  app.add_option("--block-size", o.block_size, "aio.block_size");
  app.add_option("--queue-depth", o.queue_depth, "aio.queue_depth");
  app.add_option("--intra-op", o.intra_op, "aio.intra_op_parallelism");
  app.add_option("--backend", o.backend, "aio backend: auto, io_uring, libaio, threads");
  app.add_option("--rounds", o.rounds, "interleaved rounds (medians)")->check(CLI::Range(1, 50));
  app.add_flag("--keep", o.keep, "keep the swap files");
  app.add_flag("!--no-checksum-compare", o.compare_checksums,
               "skip the pipelined step without page checksums (it needs a second store, as much disk again)");
  CLI11_PARSE(app, argc, argv);
  if (o.nvme_paths.empty()) o.nvme_paths.push_back("swap_bench_data");
  for (const std::string& p : o.nvme_paths) std::filesystem::create_directories(p);
  // The same step without checksums, on its own store: a store written without checksums has
  // none, so sharing one would leave the checksummed step nothing to verify.
  Options off = o;
  off.checksums = false;
  for (std::string& p : off.nvme_paths) p = (std::filesystem::path(p) / "no_checksums").string();
  if (o.compare_checksums) {
    for (const std::string& p : off.nvme_paths) std::filesystem::create_directories(p);
  }

  aio::AioConfig ac;
  ac.block_size = o.block_size;
  ac.queue_depth = o.queue_depth;
  ac.intra_op_parallelism = o.intra_op;
  ac.backend = check(aio::parse_backend(o.backend));
  auto handle = check(aio::Handle::create(ac));
  std::printf("%s\naio: %s, block_size %zu, queue_depth %zu, intra_op_parallelism %zu\n", topology().summary().c_str(),
              std::string(aio::backend_name(handle->backend())).c_str(), o.block_size, o.queue_depth, o.intra_op);
  require_space(o.nvme_paths[0],
                (o.compare_checksums ? 2 : 1) * o.params * 24 * 11 / 10 / o.nvme_paths.size() + (4ull << 30));

  // Set up: master weights streamed in, then one untimed step creates the moments.
  auto sw = check(OptimizerSwapper::create(swap_config(o, true), partitions(o), make_adamw(), *handle));
  const PartitionLayout layout = sw->layout();
  const std::uint64_t tile = sw->tile_elements();
  std::printf("params %llu in %zu sub-group(s); pinned budget %.2f GB; tile %llu elements (pipelined)\n",
              static_cast<unsigned long long>(o.params), layout.subgroups.size(), sw->pool().capacity() / 1e9,
              static_cast<unsigned long long>(tile));
  Memory mem = allocate_memory(layout);
  auto t0 = Clock::now();
  check(sw->init_master([](std::size_t, std::uint64_t offset, std::span<float> out) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>((offset + i) % 1000) * 1e-3f;
    return Status::ok();
  }));
  std::printf("init_master: %.2f s\n", secs(t0));
  t0 = Clock::now();
  check(sw->step(inputs(mem, 1)));
  std::printf("first step (creates the moments): %.2f s\n", secs(t0));
  sw.reset();
  if (o.compare_checksums) {
    auto sw_off = check(OptimizerSwapper::create(swap_config(off, true), partitions(off), make_adamw(), *handle));
    check(sw_off->init_master([](std::size_t, std::uint64_t offset, std::span<float> out) {
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>((offset + i) % 1000) * 1e-3f;
      return Status::ok();
    }));
    check(sw_off->step(inputs(mem, 1)));
  }

  const std::string bw_path = (std::filesystem::path(o.nvme_paths[0]) / "swap_bench_bandwidth.bin").string();
  const std::size_t request = static_cast<std::size_t>(tile * 4);
  BandwidthFile bw_file(*handle, bw_path, request, std::max<std::uint64_t>(std::min<std::uint64_t>(o.params * 6, 3ull << 30), request));
  const optim::Optimizer opt = make_adamw();
  std::vector<double> piped, unpiped, io_ideal, compute, piped_off, checksum_cost;
  std::int64_t step = 2;
  const int cases = o.compare_checksums ? 5 : 4;
  for (int r = 0; r < o.rounds; ++r) {
    StepStats p{}, u{}, n{};
    Bandwidth bw{};
    double c = 0;
    for (int k = 0; k < cases; ++k) {
      switch ((k + r) % cases) {  // the order rotates from round to round
        case 0: bw = bw_file.measure(r); break;
        case 1: p = nvme_step(o, *handle, mem, true, step++); break;
        case 2: u = nvme_step(o, *handle, mem, false, step++); break;
        case 3: c = memory_step(layout, opt, mem, step++); break;
        case 4: n = nvme_step(off, *handle, mem, true, step++); break;
      }
    }
    const double read_s = p.bytes_read / bw.read_bps, write_s = p.bytes_written / bw.write_bps;
    const double ideal = read_s + write_s;
    std::printf("round %d: pipelined %.2f s (compute %.2f, read wait %.2f, write wait %.2f; %.2f GB read, %.2f GB "
                "written), unpipelined %.2f s, in memory %.3f s, aio read %.2f GB/s write %.2f GB/s, I/O ideal %.2f s "
                "(reads alone %.2f s, writes alone %.2f s)\n",
                r, p.seconds, p.compute_seconds, p.read_wait_seconds, p.write_wait_seconds, p.bytes_read / 1e9,
                p.bytes_written / 1e9, u.seconds, c, bw.read_bps / 1e9, bw.write_bps / 1e9, ideal, read_s, write_s);
    if (o.compare_checksums) {
      std::printf("round %d: pipelined without checksums %.2f s (compute %.2f, read wait %.2f, write wait %.2f): "
                  "checksums cost x%.3f\n",
                  r, n.seconds, n.compute_seconds, n.read_wait_seconds, n.write_wait_seconds, p.seconds / n.seconds);
      piped_off.push_back(n.seconds);
      checksum_cost.push_back(p.seconds / n.seconds);
    }
    std::fflush(stdout);
    piped.push_back(p.seconds);
    unpiped.push_back(u.seconds);
    io_ideal.push_back(ideal);
    compute.push_back(c);
  }
  if (!o.keep) {
    for (const std::string& p : o.nvme_paths) std::filesystem::remove_all(std::filesystem::path(p) / "zinf_swap");
    for (const std::string& p : off.nvme_paths) std::filesystem::remove_all(p);
  }
  const double x = median(piped), y = median(io_ideal), z = median(compute), u = median(unpiped);
  std::printf("(write figures include what the host's cache absorbs; the disk is virtual)\n");
  std::printf("step_s=%.3f io_ideal_s=%.3f compute_ideal_s=%.3f ratio=%.3f unpipelined_s=%.3f", x, y, z,
              x / std::max(y, z), u);
  if (o.compare_checksums) {
    std::printf(" no_checksums_step_s=%.3f checksum_cost=%.3f", median(piped_off), median(checksum_cost));
  }
  std::printf("\n");
  return 0;
}
