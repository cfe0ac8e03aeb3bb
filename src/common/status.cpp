// Status formatting: turns error codes and errno values into messages with context.
#include "zinf/status.h"

#include <cstring>

#include <fmt/format.h>

namespace zinf {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "OK";
    case ErrorCode::kIoError: return "IoError";
    case ErrorCode::kInvalidArgument: return "InvalidArgument";
    case ErrorCode::kNotFound: return "NotFound";
    case ErrorCode::kOutOfRange: return "OutOfRange";
    case ErrorCode::kResourceExhausted: return "ResourceExhausted";
    case ErrorCode::kUnsupported: return "Unsupported";
    case ErrorCode::kCorruption: return "Corruption";
    case ErrorCode::kAborted: return "Aborted";
    case ErrorCode::kInternal: return "Internal";
  }
  return "Unknown";
}

namespace {
std::string errno_text(int sys_errno) {
  char buf[256];
  // GNU strerror_r returns a pointer that may or may not be buf.
  const char* text = strerror_r(sys_errno, buf, sizeof(buf));
  return text;
}
}  // namespace

Status Status::io_error(std::string_view op, std::string_view path, std::uint64_t offset,
                        std::uint64_t length, int sys_errno) {
  ErrorCode code = ErrorCode::kIoError;
  if (sys_errno == ENOSPC || sys_errno == EDQUOT) code = ErrorCode::kResourceExhausted;
  return Status(code,
                fmt::format("{} {} offset {} length {}: {}", op, path, offset, length,
                            errno_text(sys_errno)),
                sys_errno);
}

Status Status::sys_error(std::string_view what, int sys_errno) {
  ErrorCode code = ErrorCode::kIoError;
  if (sys_errno == ENOENT) code = ErrorCode::kNotFound;
  if (sys_errno == ENOSPC || sys_errno == EDQUOT) code = ErrorCode::kResourceExhausted;
  if (sys_errno == EINVAL) code = ErrorCode::kInvalidArgument;
  return Status(code, fmt::format("{}: {}", what, errno_text(sys_errno)), sys_errno);
}

std::string Status::to_string() const {
  if (is_ok()) return "OK";
  return fmt::format("{}: {}", error_code_name(code_), message_);
}

Status Status::with_context(std::string_view context) const {
  if (is_ok()) return *this;
  return Status(code_, fmt::format("{}: {}", context, message_), errno_);
}

}  // namespace zinf
