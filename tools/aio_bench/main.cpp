// aio_bench: sweeps the aio knobs on a folder, prints the best point and a ready-to-paste "aio" block.
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "fio_runner.h"
#include "gpu_mode.h"
#include "report.h"
#include "sweep.h"
#include "zinf/topology.h"

namespace zinf::aio_bench {
namespace {

struct Options {
  std::string dir;
  bool quick = false;
  bool vs_fio = false;
  std::string size = "1G";
  int repeats = 3;
  std::vector<std::string> block_sizes = {"256K", "1M", "4M", "8M"};
  std::vector<std::size_t> queue_depths = {8, 32, 128};
  std::vector<std::size_t> parallelism = {1, 2, 4};
  std::vector<std::string> single_submit = {"false", "true"};
  std::vector<std::string> overlap_events = {"true", "false"};
  std::vector<std::string> backends = {"auto"};
  double ramp_s = 0.25;
  double runtime_s = 1.0;
  std::string json_path;
  std::string out_dir = "aio_bench_results";
  bool gpu = false;  // --gpu: file <-> GPU memory through pinned host memory (gpu_mode.h)
  bool gds = false;  // --gds: file <-> GPU memory through GPUDirect Storage
};

Result<std::size_t> parse_bytes(const std::string& text, const std::string& option) {
  std::size_t pos = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &pos);
  } catch (...) {
    return Status::invalid_argument(fmt::format("{} {}: expected a byte count like 4096, 256K, 1M or 1G", option, text));
  }
  const std::string suffix = text.substr(pos);
  if (suffix == "K" || suffix == "k") value <<= 10;
  else if (suffix == "M" || suffix == "m") value <<= 20;
  else if (suffix == "G" || suffix == "g") value <<= 30;
  else if (!suffix.empty()) {
    return Status::invalid_argument(fmt::format("{} {}: unknown suffix '{}' (use K, M or G)", option, text, suffix));
  }
  return static_cast<std::size_t>(value);
}

Result<std::vector<bool>> parse_bools(const std::vector<std::string>& items, const std::string& option) {
  std::vector<bool> out;
  for (const std::string& s : items) {
    if (s == "true" || s == "1") out.push_back(true);
    else if (s == "false" || s == "0") out.push_back(false);
    else return Status::invalid_argument(fmt::format("{} {}: expected true or false", option, s));
  }
  return out;
}

Result<std::vector<aio::Backend>> parse_backends(const std::vector<std::string>& items) {
  std::vector<aio::Backend> out;
  for (const std::string& s : items) {
    if (s == "all") {
      for (aio::Backend b : {aio::Backend::kIoUring, aio::Backend::kLibaio, aio::Backend::kThreads}) {
        if (aio::backend_available(b)) out.push_back(b);
      }
      continue;
    }
    ZINF_ASSIGN_OR_RETURN(aio::Backend b, aio::parse_backend(s));
    if (b == aio::Backend::kAuto) b = aio::resolve_auto_backend();
    if (!aio::backend_available(b)) {
      return Status::unsupported(fmt::format("--backends {}: not available in this build or kernel", s));
    }
    out.push_back(b);
  }
  return out;
}

Result<std::vector<Point>> make_grid(const Options& o) {
  ZINF_ASSIGN_OR_RETURN(std::vector<aio::Backend> backends, parse_backends(o.backends));
  ZINF_ASSIGN_OR_RETURN(std::vector<bool> singles, parse_bools(o.single_submit, "--single-submit"));
  ZINF_ASSIGN_OR_RETURN(std::vector<bool> overlaps, parse_bools(o.overlap_events, "--overlap-events"));
  std::vector<std::size_t> blocks;
  for (const std::string& s : o.block_sizes) {
    ZINF_ASSIGN_OR_RETURN(std::size_t b, parse_bytes(s, "--block-sizes"));
    blocks.push_back(b);
  }
  std::vector<Point> grid;
  for (aio::Backend backend : backends)
    for (std::size_t par : o.parallelism)
      for (std::size_t bs : blocks)
        for (std::size_t qd : o.queue_depths)
          for (bool single : singles)
            for (bool overlap : overlaps) {
              Point p{backend, bs, qd, par, single, overlap};
              aio::AioConfig c;
              c.block_size = bs;
              c.queue_depth = qd;
              c.intra_op_parallelism = par;
              ZINF_RETURN_IF_ERROR(c.validate());
              grid.push_back(p);
            }
  return grid;
}

std::string fs_type(const std::string& dir) {
  struct statfs s {};
  if (::statfs(dir.c_str(), &s) != 0) return "unknown";
  switch (static_cast<unsigned long>(s.f_type)) {
    case 0xEF53: return "ext4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0x794C7630: return "overlayfs";
    default: return fmt::format("0x{:x}", static_cast<unsigned long>(s.f_type));
  }
}

// `fio` is fio's version with --vs-fio and empty without: then the header does not mention fio.
std::string header(const Options& o, std::size_t file_bytes, const std::string& fio) {
  std::string backends;
  for (aio::Backend b : {aio::Backend::kIoUring, aio::Backend::kLibaio, aio::Backend::kThreads}) {
    backends += fmt::format("{}{}={}", backends.empty() ? "" : " ", aio::backend_name(b),
                            aio::backend_available(b) ? "yes" : "no");
  }
  return fmt::format("zinf aio_bench | {} | dir {} ({}) | file {} MiB | backends: {} (auto -> {}){}",
                     topology().summary(), o.dir, fs_type(o.dir), file_bytes >> 20, backends,
                     aio::backend_name(aio::resolve_auto_backend()), fio.empty() ? "" : " | " + fio);
}

void progress(std::size_t done, std::size_t total, const Point& p, Op op, double gbps, const char* who) {
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  const std::string line = fmt::format("[{}/{}] {:<5} {:<4} {} -> {:.2f} GB/s", done, total, op_name(op), who,
                                       describe(p), gbps);
  if (tty) std::fprintf(stderr, "\r%-120s", line.c_str());
  else std::fprintf(stderr, "%s\n", line.c_str());
}

// Measures every point: for each op, `repeats` runs, interleaved with fio (A B, then B A).
Status sweep(Bench& bench, const std::vector<Point>& grid, const Options& o, std::vector<PointResult>* results) {
  const Timing timing{o.ramp_s, o.runtime_s};
  std::size_t done = 0;
  const std::size_t total = grid.size() * 2;
  for (const Point& p : grid) {
    PointResult r{p, {}, {}, {}, {}};
    for (Op op : {Op::kRead, Op::kWrite}) {
      Samples& mine = op == Op::kRead ? r.read : r.write;
      Samples& theirs = op == Op::kRead ? r.fio_read : r.fio_write;
      for (int rep = 0; rep < o.repeats; ++rep) {
        const bool fio_first = o.vs_fio && rep % 2 == 1;
        if (fio_first) {
          ZINF_ASSIGN_OR_RETURN(double f, run_fio(p, op, bench, timing));
          theirs.gbps.push_back(f);
        }
        ZINF_ASSIGN_OR_RETURN(double z, bench.run(p, op, timing));
        mine.gbps.push_back(z);
        if (o.vs_fio && !fio_first) {
          ZINF_ASSIGN_OR_RETURN(double f, run_fio(p, op, bench, timing));
          theirs.gbps.push_back(f);
        }
      }
      progress(++done, total, p, op, mine.median(), "zinf");
    }
    results->push_back(std::move(r));
  }
  if (::isatty(STDERR_FILENO) != 0) std::fprintf(stderr, "\n");
  return Status::ok();
}

Status write_outputs(const Options& o, const std::vector<PointResult>& results, const Best& best,
                     const std::string& head) {
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) return Status::sys_error(fmt::format("create --out-dir {}", o.out_dir), ec.value());
  ZINF_RETURN_IF_ERROR(write_csv(o.out_dir + "/points.csv", results));
  ZINF_RETURN_IF_ERROR(write_points_json(o.out_dir + "/points.json", results));
  char date[32] = "";
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  if (::gmtime_r(&now, &utc) != nullptr) std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", &utc);
  ZINF_RETURN_IF_ERROR(write_svg(o.out_dir + "/heatmap.svg", results, best, HeatmapFacts{o.dir, fs_type(o.dir), date}));
  ZINF_RETURN_IF_ERROR(write_summary_json(o.out_dir + "/summary.json", best, head, o.vs_fio));
  if (!o.json_path.empty()) ZINF_RETURN_IF_ERROR(write_summary_json(o.json_path, best, head, o.vs_fio));
  std::cout << fmt::format("\nWrote {0}/points.csv, {0}/points.json, {0}/heatmap.svg, {0}/summary.json{1}\n",
                           o.out_dir, o.json_path.empty() ? "" : " and " + o.json_path);
  return Status::ok();
}

void apply_quick(Options& o) {
  o.size = "256M";
  o.block_sizes = {"256K", "1M", "4M"};
  o.queue_depths = {8, 32};
  o.parallelism = {1, 2};
  o.single_submit = {"false"};
  o.overlap_events = {"true"};
  o.ramp_s = 0.1;
  o.runtime_s = 0.25;
}

// --gpu / --gds: one point (the first value of each knob list) instead of the sweep.
int run_gpu(const Options& o) {
  auto bytes = parse_bytes(o.size, "--size");
  if (!bytes.is_ok()) {
    std::cerr << "aio_bench: " << bytes.status().message() << "\n";
    return 1;
  }
  auto grid = make_grid(o);
  if (!grid.is_ok() || grid->empty()) {
    std::cerr << "aio_bench: " << (grid.is_ok() ? "no aio point to measure" : grid.status().message()) << "\n";
    return 1;
  }
  GpuModeOptions g;
  g.bounce = o.gpu;
  g.gds = o.gds;
  g.dir = o.dir;
  g.file_bytes = bytes.value() / (1 << 20) * (1 << 20);
  g.point = grid->front();
  g.timing = Timing{o.ramp_s, o.runtime_s};
  g.repeats = o.repeats;
  g.json_path = o.json_path;
  if (g.file_bytes == 0) {
    std::cerr << "aio_bench: --size must be at least 1M\n";
    return 1;
  }
  return run_gpu_modes(g);
}

int run(Options o, bool made_tmp) {
  if (o.gpu || o.gds) {
    const int rc = run_gpu(o);
    if (made_tmp) std::filesystem::remove_all(o.dir);
    return rc;
  }
  auto cleanup = [&] {
    if (made_tmp) std::filesystem::remove_all(o.dir);
  };
  auto fail = [&](const Status& s) {
    std::cerr << "aio_bench: " << s.message() << "\n";
    cleanup();
    return 1;
  };
  auto bytes = parse_bytes(o.size, "--size");
  if (!bytes.is_ok()) return fail(bytes.status());
  const std::size_t file_bytes = bytes.value() / (1 << 20) * (1 << 20);
  if (file_bytes == 0) return fail(Status::invalid_argument("--size must be at least 1M"));
  auto grid = make_grid(o);
  if (!grid.is_ok()) return fail(grid.status());
  std::string fio;
  if (o.vs_fio) {
    fio = fio_version();
    if (fio.empty()) return fail(Status::not_found("--vs-fio: fio is not installed (apt-get install fio)"));
  }
  const std::string head = header(o, file_bytes, fio);
  std::cout << head << "\n"
            << fmt::format("{} points x read/write x {} repeats, {:.2f}s ramp + {:.2f}s per run{}\n\n",
                           grid->size(), o.repeats, o.ramp_s, o.runtime_s,
                           o.vs_fio ? ", interleaved with fio" : "")
            << std::flush;
  auto bench = Bench::create(o.dir, file_bytes);
  if (!bench.is_ok()) return fail(bench.status());
  std::vector<PointResult> results;
  results.reserve(grid->size());
  Status s = sweep(bench.value(), grid.value(), o, &results);
  if (!s.is_ok()) return fail(s);
  print_table(std::cout, results, o.vs_fio);
  const Best best = find_best(results);
  print_best(std::cout, best, o.vs_fio);
  s = write_outputs(o, results, best, head);
  if (!s.is_ok()) return fail(s);
  cleanup();
  return 0;
}

}  // namespace
}  // namespace zinf::aio_bench

int main(int argc, char** argv) {
  using zinf::aio_bench::Options;
  Options o;
  CLI::App app{"aio_bench: find the best aio block_size / queue_depth / intra_op_parallelism for a folder"};
  app.add_option("--dir", o.dir, "folder to test (default: a new temporary folder, removed at exit)");
  app.add_flag("--quick", o.quick, "a small sweep that finishes in about a minute");
  app.add_flag("--vs-fio", o.vs_fio, "run fio at every point, interleaved, and report zinf/fio ratios");
  app.add_option("--size", o.size, "bytes per request and file (K/M/G suffixes)");
  app.add_option("--repeats", o.repeats, "timed runs per point and op (median and spread)")->check(CLI::Range(1, 100));
  app.add_option("--block-sizes", o.block_sizes, "block_size values")->delimiter(',');
  app.add_option("--queue-depths", o.queue_depths, "queue_depth values")->delimiter(',');
  app.add_option("--parallelism", o.parallelism, "intra_op_parallelism values")->delimiter(',');
  app.add_option("--single-submit", o.single_submit, "single_submit values (true,false)")->delimiter(',');
  app.add_option("--overlap-events", o.overlap_events, "overlap_events values (true,false)")->delimiter(',');
  app.add_option("--backends", o.backends, "auto, io_uring, libaio, threads or all")->delimiter(',');
  app.add_option("--ramp", o.ramp_s, "seconds of unmeasured transfers before each timed run");
  app.add_option("--runtime", o.runtime_s, "seconds measured per run");
  app.add_option("--json", o.json_path, "write the summary JSON here too");
  app.add_flag("--gpu", o.gpu,
               "measure file <-> GPU memory through pinned host memory (aio then H2D; D2H then aio), as ds_io "
               "does, at the first value of each knob list; no sweep");
  app.add_flag("--gds", o.gds,
               "measure file <-> GPU memory through GPUDirect Storage (cuFile); with --gpu also the bounce path "
               "and the GDS/bounce ratio. Without libcufile: says why, measures the bounce path, exits 3");
  app.add_option("--out-dir", o.out_dir, "folder for points.csv, points.json, heatmap.svg, summary.json");
  CLI11_PARSE(app, argc, argv);
  // --quick sets the grid; explicit options given with it still win.
  if (o.quick) {
    Options q = o;
    zinf::aio_bench::apply_quick(q);
    if (app.count("--size") == 0) o.size = q.size;
    if (app.count("--block-sizes") == 0) o.block_sizes = q.block_sizes;
    if (app.count("--queue-depths") == 0) o.queue_depths = q.queue_depths;
    if (app.count("--parallelism") == 0) o.parallelism = q.parallelism;
    if (app.count("--single-submit") == 0) o.single_submit = q.single_submit;
    if (app.count("--overlap-events") == 0) o.overlap_events = q.overlap_events;
    if (app.count("--ramp") == 0) o.ramp_s = q.ramp_s;
    if (app.count("--runtime") == 0) o.runtime_s = q.runtime_s;
  }
  bool made_tmp = false;
  if (o.dir.empty()) {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base != nullptr ? base : "/tmp") + "/zinf_aio_bench.XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) {
      std::cerr << "aio_bench: cannot create a temporary folder " << templ << ": " << std::strerror(errno) << "\n";
      return 1;
    }
    o.dir = templ;
    made_tmp = true;
  } else if (!std::filesystem::is_directory(o.dir)) {
    std::cerr << "aio_bench: --dir " << o.dir << ": not an existing folder\n";
    return 1;
  }
  return zinf::aio_bench::run(o, made_tmp);
}
