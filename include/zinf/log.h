// Logging for library notices: one line per message to a replaceable sink (stderr by default).
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace zinf {

enum class LogLevel { kDebug = 0, kInfo = 1, kNotice = 2, kWarning = 3, kError = 4 };

// Messages below this level are dropped. Default kInfo; ZINF_LOG_LEVEL=debug|info|notice|warning|error
// in the environment overrides it at first use.
void set_log_level(LogLevel level);
LogLevel log_level();

// The sink receives every message that passes the level filter. Thread-safe to call log();
// set_log_sink must not race with logging. Passing nullptr restores the stderr sink.
using LogSink = std::function<void(LogLevel, std::string_view)>;
void set_log_sink(LogSink sink);

void log(LogLevel level, std::string_view message);
// Logs `message` only the first time `key` is seen in this process (e.g. "O_DIRECT refused on /dev/shm").
void log_once(LogLevel level, std::string_view key, std::string_view message);

}  // namespace zinf
