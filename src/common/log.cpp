// Logging sink, level filter and once-only notices.
#include "zinf/log.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

namespace zinf {
namespace {

std::mutex g_mutex;
LogSink g_sink;
std::set<std::string, std::less<>> g_seen;

LogLevel level_from_env() {
  const char* env = std::getenv("ZINF_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  std::string_view v(env);
  if (v == "debug") return LogLevel::kDebug;
  if (v == "notice") return LogLevel::kNotice;
  if (v == "warning") return LogLevel::kWarning;
  if (v == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}

LogLevel& level_ref() {
  static LogLevel level = level_from_env();
  return level;
}

const char* prefix(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "zinf debug: ";
    case LogLevel::kInfo: return "zinf: ";
    case LogLevel::kNotice: return "zinf notice: ";
    case LogLevel::kWarning: return "zinf warning: ";
    case LogLevel::kError: return "zinf error: ";
  }
  return "zinf: ";
}

}  // namespace

void set_log_level(LogLevel level) {
  std::lock_guard lock(g_mutex);
  level_ref() = level;
}

LogLevel log_level() {
  std::lock_guard lock(g_mutex);
  return level_ref();
}

void set_log_sink(LogSink sink) {
  std::lock_guard lock(g_mutex);
  g_sink = std::move(sink);
}

void log(LogLevel level, std::string_view message) {
  std::lock_guard lock(g_mutex);
  if (level < level_ref()) return;
  if (g_sink) {
    g_sink(level, message);
    return;
  }
  std::fprintf(stderr, "%s%.*s\n", prefix(level), static_cast<int>(message.size()), message.data());
}

void log_once(LogLevel level, std::string_view key, std::string_view message) {
  {
    std::lock_guard lock(g_mutex);
    if (!g_seen.emplace(key).second) return;
  }
  log(level, message);
}

}  // namespace zinf
