// aio_bench --gpu / --gds: NVMe file <-> GPU memory through the bounce path (aio into pinned host
// memory, then H2D; D2H, then aio write) and through GPUDirect Storage (cuFile, no bounce).
#include "gpu_mode.h"

#include <cuda_runtime_api.h>
#include <fcntl.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/file_io.h"
#include "gpu/copy_engine.h"
#include "gpu/cuda_error.h"
#include "gpu/device.h"
#include "gpu/device_buffer.h"
#include "gpu/gds.h"
#include "zinf/aio/handle.h"
#include "zinf/aio/pinned.h"

namespace zinf::aio_bench {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Whole-file transfers repeated for the ramp (not counted), then for at least the runtime; GB/s.
Result<double> timed(const std::function<Status()>& transfer, std::size_t bytes, const Timing& timing) {
  const auto ramp_start = Clock::now();
  do {
    ZINF_RETURN_IF_ERROR(transfer());
  } while (seconds_since(ramp_start) < timing.ramp_s);
  std::size_t moved = 0;
  const auto start = Clock::now();
  while (moved == 0 || seconds_since(start) < timing.runtime_s) {
    ZINF_RETURN_IF_ERROR(transfer());
    moved += bytes;
  }
  return static_cast<double>(moved) / seconds_since(start) / 1e9;
}

enum class Mode { kBounce, kGds };
const char* mode_name(Mode m) { return m == Mode::kBounce ? "bounce" : "gds"; }

class GpuBench {
 public:
  static Result<std::unique_ptr<GpuBench>> create(const GpuModeOptions& o, Bench files) {
    auto b = std::unique_ptr<GpuBench>(new GpuBench(o, std::move(files)));
    const std::size_t n = o.file_bytes;
    ZINF_ASSIGN_OR_RETURN(b->host_, aio::PinnedBuffer::allocate(n));
    if (!b->host_.cuda_registered()) {
      return Status::unsupported("the pinned host buffer was not registered with CUDA (cudaHostRegister refused)");
    }
    ZINF_ASSIGN_OR_RETURN(b->dev_, gpu::DeviceBuffer::allocate(0, n, "aio_bench device buffer"));
    ZINF_ASSIGN_OR_RETURN(b->engine_, gpu::CopyEngine::create(0));
    aio::AioConfig c;
    c.backend = o.point.backend;
    c.block_size = o.point.block_size;
    c.queue_depth = o.point.queue_depth;
    c.intra_op_parallelism = o.point.parallelism;
    c.single_submit = o.point.single_submit;
    c.overlap_events = o.point.overlap_events;
    ZINF_ASSIGN_OR_RETURN(b->handle_, aio::Handle::create(c));
    ZINF_RETURN_IF_ERROR(b->handle_->register_buffer(b->host_.data(), n));
    return b;
  }

  // Opens libcufile and registers the device buffer; kUnsupported naming why when it cannot.
  Status open_gds() {
    ZINF_ASSIGN_OR_RETURN(driver_, gpu::CuFileDriver::open());
    ZINF_ASSIGN_OR_RETURN(reg_, gpu::GdsBufferRegistration::create(driver_, dev_.data(), dev_.size()));
    return Status::ok();
  }

  Result<double> run(Mode mode, Op op, const Timing& timing) {
    const bool write = op == Op::kWrite;
    if (write) ZINF_RETURN_IF_ERROR(files_.fresh_write_file());
    const std::string& path = write ? files_.write_path() : files_.read_path();
    const std::size_t n = files_.file_bytes();
    if (mode == Mode::kGds) {
      ZINF_ASSIGN_OR_RETURN(gpu::GdsFile f, gpu::GdsFile::open(driver_, path, {.write = write, .create = false}));
      return timed([&] { return write ? f.write(dev_.data(), n, 0) : f.read(dev_.data(), n, 0); }, n, timing);
    }
    ZINF_ASSIGN_OR_RETURN(fileio::OpenedFile file, fileio::open_direct_or_buffered(path, write ? O_WRONLY : O_RDONLY, 0,
                                                                                   true, write ? "writing" : "reading"));
    const int fd = file.fd.get();
    return timed(
        [&]() -> Status {
          if (write) {
            ZINF_ASSIGN_OR_RETURN(gpu::Event e, engine_->copy_d2h(host_.data(), dev_.data(), n, nullptr, "D2H before the write"));
            ZINF_RETURN_IF_ERROR(e.synchronize());
            return handle_->sync_pwrite(host_.data(), n, fd, 0);
          }
          ZINF_RETURN_IF_ERROR(handle_->sync_pread(host_.data(), n, fd, 0));
          ZINF_ASSIGN_OR_RETURN(gpu::Event e, engine_->copy_h2d(dev_.data(), host_.data(), n, nullptr, "H2D after the read"));
          return e.synchronize();
        },
        n, timing);
  }

  // One read through `mode` into a device buffer filled with 0xff, then checks every 4 KiB page's
  // first byte against the pattern the read file was written with (Bench::create).
  Status verify_read(Mode mode) {
    const std::size_t n = files_.file_bytes();
    ZINF_CUDA_RETURN_IF_ERROR(cudaMemset(dev_.data(), 0xff, n), "cudaMemset before the check");
    // The fill runs on the legacy stream, which neither the copy engine's non-blocking streams nor
    // cuFile wait for: finish it before the read lands in the buffer.
    ZINF_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the fill");
    ZINF_RETURN_IF_ERROR(run(mode, Op::kRead, Timing{0.0, 0.0}).status());
    ZINF_ASSIGN_OR_RETURN(gpu::Event e, engine_->copy_d2h(host_.data(), dev_.data(), n, nullptr, "D2H for the check"));
    ZINF_RETURN_IF_ERROR(e.synchronize());
    for (std::size_t i = 0; i < n; i += 4096) {
      if (host_.bytes()[i] != std::byte(i >> 12)) {
        return Status::corruption(fmt::format("{} read: byte {} of {} is 0x{:02x}, the file has 0x{:02x}", mode_name(mode),
                                              i, files_.read_path(), static_cast<unsigned>(host_.bytes()[i]),
                                              static_cast<unsigned>(std::byte(i >> 12))));
      }
    }
    return Status::ok();
  }

 private:
  GpuBench(const GpuModeOptions& o, Bench files) : options_(o), files_(std::move(files)) {}
  GpuModeOptions options_;
  Bench files_;
  aio::PinnedBuffer host_;
  gpu::DeviceBuffer dev_;
  std::unique_ptr<gpu::CopyEngine> engine_;
  std::unique_ptr<aio::Handle> handle_;
  std::shared_ptr<gpu::CuFileDriver> driver_;
  gpu::GdsBufferRegistration reg_;  // after driver_: deregistered first
};

const char* flag_of(const GpuModeOptions& o) { return o.bounce ? "--gpu" : "--gds"; }

}  // namespace

int run_gpu_modes(const GpuModeOptions& o) {
  auto fail = [&](const Status& s) {
    std::fprintf(stderr, "aio_bench %s: %s\n", flag_of(o), s.message().c_str());
    return s.code() == ErrorCode::kUnsupported ? 2 : 1;
  };
  // "no CUDA device: ..." before any file is written.
  Result<gpu::DeviceInfo> info = gpu::select_device(0);
  if (!info.is_ok()) return fail(info.status());
  auto files = Bench::create(o.dir, o.file_bytes);
  if (!files.is_ok()) return fail(files.status());
  auto made = GpuBench::create(o, std::move(files).value());
  if (!made.is_ok()) return fail(made.status());
  GpuBench& bench = *made.value();

  bool bounce = o.bounce;
  bool gds = o.gds;
  std::string gds_unavailable;
  if (gds) {
    Status s = bench.open_gds();
    if (!s.is_ok()) {
      gds_unavailable = s.message();
      gds = false;
      bounce = true;
      std::fprintf(stderr, "aio_bench --gds: %s\n", gds_unavailable.c_str());
      std::cout << fmt::format("NOTICE: --gds: {}; measuring the bounce path only (NOT GPUDirect Storage)\n",
                               gds_unavailable);
    }
  }
  std::cout << fmt::format("zinf aio_bench --gpu | {} | dir {} | file {} MiB | bounce: {} | {} repeats, {:.2f}s ramp "
                           "+ {:.2f}s per run\n",
                           info->to_string(), o.dir, o.file_bytes >> 20, describe(o.point), o.repeats, o.timing.ramp_s,
                           o.timing.runtime_s)
            << std::flush;
  // The checks read the file once per path. A GDS path that cannot move data at all here (cuFile
  // refusing the file: seen on an H100 VM with CU_FILE_HANDLE_NOT_REGISTERED) is unavailable, as
  // when the driver cannot open: said, and the bounce path is measured (exit 3). Wrong bytes from
  // either path are a failure.
  if (gds) {
    Status s = bench.verify_read(Mode::kGds);
    if (!s.is_ok() && s.code() != ErrorCode::kCorruption) {
      gds_unavailable = fmt::format("GPUDirect Storage could not read a file here: {}", s.message());
      gds = false;
      bounce = true;
      std::fprintf(stderr, "aio_bench --gds: %s\n", gds_unavailable.c_str());
      std::cout << fmt::format("NOTICE: --gds: {}; measuring the bounce path only (NOT GPUDirect Storage)\n",
                               gds_unavailable);
    } else if (!s.is_ok()) {
      return fail(s.with_context("checking a gds read"));
    }
  }
  std::vector<Mode> modes;
  if (bounce) modes.push_back(Mode::kBounce);
  if (gds) modes.push_back(Mode::kGds);
  if (bounce) {
    Status s = bench.verify_read(Mode::kBounce);
    if (!s.is_ok()) return fail(s.with_context("checking a bounce read"));
  }
  // [mode][op] samples; modes alternate which goes first at each repeat.
  Samples samples[2][2];
  for (Op op : {Op::kRead, Op::kWrite}) {
    for (int rep = 0; rep < o.repeats; ++rep) {
      for (std::size_t k = 0; k < modes.size(); ++k) {
        const Mode m = modes[rep % 2 == 0 ? k : modes.size() - 1 - k];
        Result<double> r = bench.run(m, op, o.timing);
        if (!r.is_ok()) return fail(r.status().with_context(fmt::format("{} {}", mode_name(m), op_name(op))));
        samples[static_cast<int>(m)][static_cast<int>(op)].gbps.push_back(r.value());
      }
    }
  }
  std::cout << fmt::format("\n{:<7} {:<6} {:>8} {:>8} {:>8}\n", "path", "op", "GB/s", "min", "max");
  for (Mode m : modes) {
    for (Op op : {Op::kRead, Op::kWrite}) {
      const Samples& s = samples[static_cast<int>(m)][static_cast<int>(op)];
      std::cout << fmt::format("{:<7} {:<6} {:>8.2f} {:>8.2f} {:>8.2f}\n", mode_name(m), op_name(op), s.median(), s.min(),
                               s.max());
    }
  }
  auto med = [&](Mode m, Op op) { return samples[static_cast<int>(m)][static_cast<int>(op)].median(); };
  if (bounce && gds) {
    std::cout << fmt::format("gds/bounce: read {:.3f}x, write {:.3f}x (DeepNVMe reports GDS up to 1.37x)\n",
                             med(Mode::kGds, Op::kRead) / med(Mode::kBounce, Op::kRead),
                             med(Mode::kGds, Op::kWrite) / med(Mode::kBounce, Op::kWrite));
  }
  if (!o.json_path.empty()) {
    nlohmann::json j = {{"device", info->name}, {"file_bytes", o.file_bytes}, {"bounce", describe(o.point)}};
    for (Mode m : modes) {
      j[fmt::format("{}_read_gbps", mode_name(m))] = med(m, Op::kRead);
      j[fmt::format("{}_write_gbps", mode_name(m))] = med(m, Op::kWrite);
    }
    if (!gds_unavailable.empty()) j["gds_unavailable"] = gds_unavailable;
    std::ofstream f(o.json_path);
    f << j.dump(2) << "\n";
    if (!f) return fail(Status::sys_error("write --json " + o.json_path, errno));
  }
  return gds_unavailable.empty() ? 0 : 3;
}

}  // namespace zinf::aio_bench
