// Config text is untrusted: size, nesting and key-length caps give a fast error with bounded memory.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "sanitizers.h"
#include "test_util.h"
#include "zinf/config/ds_config.h"

namespace zinf::config {
namespace {

using testing::error_of;
using testing::TempDir;

using zinf::testing::kAsan;

// Runs `check` in a child limited to `cpu_s` seconds of CPU and (outside ASan, which reserves
// terabytes of address space) `extra_mb` MiB of address space more than it starts with. The
// test passes only if the child returns true within the limits: the code before the caps took
// 1.2 GB (deep array) and 20 s (long key), and dies here.
void expect_within_limits(int cpu_s, long extra_mb, const std::function<bool()>& check) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    rlimit cpu{static_cast<rlim_t>(cpu_s), static_cast<rlim_t>(cpu_s)};
    ::setrlimit(RLIMIT_CPU, &cpu);
    if (!kAsan) {
      long pages = 0;
      if (std::ifstream statm("/proc/self/statm"); statm) statm >> pages;
      const rlim_t limit = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) +
                           static_cast<rlim_t>(extra_mb) * (1 << 20);
      rlimit as{limit, limit};
      ::setrlimit(RLIMIT_AS, &as);
    }
    bool ok = false;
    try {
      ok = check();
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0)
                                 << " (SIGXCPU = CPU limit, SIGSEGV/SIGABRT = out of memory)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: wrong message; 2: an exception escaped";
}

TEST(UntrustedConfigText, DeepArrayIsAFastErrorWithBoundedMemory) {
  const std::string text = "{\"train_batch_size\": 1, \"x\": " + std::string(20000, '[') + std::string(20000, ']') + "}";
  expect_within_limits(5, 256, [&] {
    const std::string m = error_of(text);
    return m.rfind("ds_config.json:1:", 0) == 0 &&
           m.find("arrays and objects nested deeper than 64 levels") != std::string::npos;
  });
  // At the cap itself it parses as far as the unknown key.
  const std::string ok = "{\"train_batch_size\": 1, \"x\": " + std::string(63, '[') + std::string(63, ']') + "}";
  EXPECT_NE(error_of(ok).find("x: unknown key"), std::string::npos) << error_of(ok);
}

TEST(UntrustedConfigText, HugeKeyIsAFastError) {
  const std::string text = "{\"train_batch_size\": 1, \"" + std::string(2 << 20, 'k') + "\": 1}";
  expect_within_limits(5, 256, [&] {
    const std::string m = error_of(text);
    return m.rfind("ds_config.json:1:25: a key of 2097152 bytes; keys may be at most 256 bytes", 0) == 0;
  });
  // A long string value is not a key; comparing it with the choices is skipped by length.
  const std::string value = R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "offload_param": {"device": ")" +
                            std::string(2 << 20, 'c') + "\"}}}";
  expect_within_limits(5, 256, [&] {
    return error_of(value).find("expected one of \"none\", \"cpu\", \"nvme\"") != std::string::npos;
  });
}

// Found by the config_text fuzzer: nlohmann stops at a NUL, so "0<NUL>..." parsed as 0 and the
// key index then looped forever on a '/' that starts no comment.
TEST(UntrustedConfigText, NulByteIsAnErrorNotAHang) {
  static constexpr char kText[] = "0\0\0\0\"a\": /1";  // NUL bytes inside: the length from sizeof
  const std::string text(kText, sizeof(kText) - 1);
  expect_within_limits(5, 256, [&] {
    return error_of(text) == "ds_config.json:1:2: a NUL byte; a config is text";
  });
}

TEST(UntrustedConfigText, BigFileIsRefusedBeforeItIsRead) {
  TempDir dir;
  const std::string path = dir.path() + "/big.json";
  {
    std::ofstream out(path);
    out << "{\"train_batch_size\": 1, \"pad\": \"" << std::string((16 << 20) + 1, ' ') << "\"}";
  }
  auto r = load_ds_config(path, {});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), path + ": more than 16777216 bytes; a config may hold at most 16777216 bytes (16 MiB)");
  // parse_ds_config keeps the same cap on text given directly.
  const std::string text(16 << 20 | 1, ' ');
  auto p = parse_ds_config(text, "big.json", {});
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.status().message(), "big.json: 16777217 bytes; a config may hold at most 16777216 bytes (16 MiB)");
}

}  // namespace
}  // namespace zinf::config
