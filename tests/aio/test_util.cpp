// Shared helpers for the aio tests (see test_util.h).
#include "test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace zinf::aio::testing {

namespace {

// The 8 pattern bytes of the aligned 8-byte group `group` (positions 8*group .. 8*group+7).
std::uint64_t pattern_group(std::uint64_t group, std::uint32_t seed) {
  std::uint64_t x = group * 0x9E3779B97F4A7C15ULL + seed * 0xD1B54A32D192ED03ULL;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 32;
  return x;
}

void group_bytes(std::uint64_t group, std::uint32_t seed, std::byte out[8]) {
  const std::uint64_t x = pattern_group(group, seed);
  for (int k = 0; k < 8; ++k) out[k] = static_cast<std::byte>(x >> (8 * k));
}

}  // namespace

std::uint8_t pattern_byte(std::uint64_t pos, std::uint32_t seed) {
  return static_cast<std::uint8_t>(pattern_group(pos >> 3, seed) >> (8 * (pos & 7)));
}

void fill_pattern(std::byte* p, std::size_t n, std::uint64_t file_pos, std::uint32_t seed) {
  std::size_t i = 0;
  for (; i < n && (file_pos + i) % 8 != 0; ++i) p[i] = static_cast<std::byte>(pattern_byte(file_pos + i, seed));
  std::byte group[8];
  for (; i + 8 <= n; i += 8) {
    group_bytes((file_pos + i) >> 3, seed, group);
    std::memcpy(p + i, group, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<std::byte>(pattern_byte(file_pos + i, seed));
}

std::int64_t first_mismatch(const std::byte* p, std::size_t n, std::uint64_t file_pos, std::uint32_t seed) {
  std::size_t i = 0;
  for (; i < n && (file_pos + i) % 8 != 0; ++i) {
    if (p[i] != static_cast<std::byte>(pattern_byte(file_pos + i, seed))) return static_cast<std::int64_t>(i);
  }
  std::byte group[8];
  for (; i + 8 <= n; i += 8) {
    group_bytes((file_pos + i) >> 3, seed, group);
    if (std::memcmp(p + i, group, 8) != 0) break;  // the byte loop below finds which one
  }
  for (; i < n; ++i) {
    if (p[i] != static_cast<std::byte>(pattern_byte(file_pos + i, seed))) return static_cast<std::int64_t>(i);
  }
  return -1;
}

void write_plain(const std::string& path, const std::vector<std::byte>& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  if (!out) throw std::runtime_error("writing " + path + " failed");
}

std::vector<std::byte> read_plain(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("opening " + path + " failed");
  in.seekg(0, std::ios::end);
  std::vector<std::byte> data(static_cast<std::size_t>(in.tellg()));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(data.size()));
  return data;
}

GuardedBuffer::GuardedBuffer(std::size_t size, std::size_t misalign)
    : storage_(size + 2 * kGuard + 4096), size_(size) {
  const auto base = reinterpret_cast<std::uintptr_t>(storage_.data());
  const std::size_t to_aligned = (4096 - base % 4096) % 4096;
  start_ = to_aligned + kGuard + misalign;
  std::memset(storage_.data(), 0xA5, storage_.size());
}

bool GuardedBuffer::guards_intact() const {
  for (std::size_t i = 0; i < start_; ++i) {
    if (storage_[i] != std::byte{0xA5}) return false;
  }
  for (std::size_t i = start_ + size_; i < storage_.size(); ++i) {
    if (storage_[i] != std::byte{0xA5}) return false;
  }
  return true;
}

std::string run_in_child(const std::function<std::string()>& body) {
  int fds[2];
  if (::pipe(fds) != 0) return std::string("pipe: ") + std::strerror(errno);
  const pid_t pid = ::fork();
  if (pid < 0) return std::string("fork: ") + std::strerror(errno);
  if (pid == 0) {
    ::close(fds[0]);
    const std::string result = body();
    std::size_t off = 0;
    while (off < result.size()) {
      const ssize_t n = ::write(fds[1], result.data() + off, result.size() - off);
      if (n <= 0) break;
      off += static_cast<std::size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[512];
  ssize_t n = 0;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int wstatus = 0;
  ::waitpid(pid, &wstatus, 0);
  if (!WIFEXITED(wstatus)) return "child died with signal " + std::to_string(WTERMSIG(wstatus)) + "; said: " + out;
  return out;
}

std::vector<Backend> all_backends() { return {Backend::kIoUring, Backend::kLibaio, Backend::kThreads}; }

}  // namespace zinf::aio::testing
