// fio runner: builds the fio command for a point, runs it, and reads its JSON bandwidth.
#include "fio_runner.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

extern char** environ;

namespace zinf::aio_bench {
namespace {

// Runs argv[0] from PATH and returns its stdout; stderr is discarded unless it fails.
Result<std::string> run_capture(const std::vector<std::string>& args) {
  int out_pipe[2];
  if (::pipe(out_pipe) != 0) return Status::sys_error("pipe", errno);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, out_pipe[0]);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out_pipe[1]);
  if (rc != 0) {
    ::close(out_pipe[0]);
    return Status::sys_error(fmt::format("run {}", args[0]), rc);
  }
  std::string output;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(out_pipe[0], buf, sizeof(buf));
    if (n > 0) {
      output.append(buf, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(out_pipe[0]);
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    return Status(ErrorCode::kIoError,
                  fmt::format("{} failed (status {}): {}", args[0], wstatus, output.substr(0, 2000)));
  }
  return output;
}

std::string millis(double seconds) {
  return fmt::format("{}ms", static_cast<long>(std::lround(seconds * 1000.0)));
}

}  // namespace

std::string fio_version() {
  auto out = run_capture({"fio", "--version"});
  if (!out.is_ok()) return "";
  std::string v = out.value();
  while (!v.empty() && (v.back() == '\n' || v.back() == '\r')) v.pop_back();
  return v;
}

const char* fio_engine_for(aio::Backend backend) {
  switch (backend) {
    case aio::Backend::kIoUring: return "io_uring";
    case aio::Backend::kLibaio: return "libaio";
    case aio::Backend::kThreads: return "psync";
    case aio::Backend::kAuto: return fio_engine_for(aio::resolve_auto_backend());
  }
  return "psync";
}

Result<double> run_fio(const Point& point, Op op, const Bench& bench, const Timing& timing) {
  const bool is_write = op == Op::kWrite;
  if (is_write) ZINF_RETURN_IF_ERROR(bench.fresh_write_file());
  const aio::Backend backend =
      point.backend == aio::Backend::kAuto ? aio::resolve_auto_backend() : point.backend;
  const std::size_t slice = bench.file_bytes() / point.parallelism / 4096 * 4096;
  std::vector<std::string> args = {
      "fio",
      "--name=zinf_vs_fio",
      "--filename=" + (is_write ? bench.write_path() : bench.read_path()),
      std::string("--rw=") + (is_write ? "write" : "read"),
      fmt::format("--bs={}", point.block_size),
      fmt::format("--iodepth={}", point.queue_depth),
      "--direct=1",
      std::string("--ioengine=") + fio_engine_for(backend),
      fmt::format("--numjobs={}", point.parallelism),
      fmt::format("--size={}", slice),
      fmt::format("--offset_increment={}", slice),
      "--group_reporting",
      "--thread",
      "--time_based",
      "--runtime=" + millis(timing.runtime_s),
      "--ramp_time=" + millis(timing.ramp_s),
      "--output-format=json",
  };
  if (backend == aio::Backend::kIoUring) args.push_back("--fixedbufs");
  if (point.single_submit) args.push_back("--iodepth_batch_submit=1");
  if (!point.overlap_events) args.push_back(fmt::format("--iodepth_batch_complete_min={}", point.queue_depth));
  ZINF_ASSIGN_OR_RETURN(std::string out, run_capture(args));
  const std::size_t brace = out.find('{');
  if (brace == std::string::npos) return Status::corruption("fio printed no JSON: " + out.substr(0, 500));
  const auto doc = nlohmann::json::parse(out.substr(brace), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.contains("jobs") || doc["jobs"].empty()) {
    return Status::corruption("cannot read fio's JSON output: " + out.substr(0, 500));
  }
  const auto& job = doc["jobs"][0][is_write ? "write" : "read"];
  const double bw = job.value("bw_bytes", 0.0);
  if (bw <= 0.0) return Status::corruption("fio reported no bandwidth for " + describe(point));
  return bw / 1e9;
}

}  // namespace zinf::aio_bench
