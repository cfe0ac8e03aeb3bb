// Status and Result<T>: how every zinf layer reports a runtime failure, with its context.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace zinf {

enum class ErrorCode {
  kOk = 0,
  kIoError,            // a system call on a file failed (errno is set)
  kInvalidArgument,    // the caller or the user gave a bad value
  kNotFound,           // a file, key or tensor that should exist does not
  kOutOfRange,         // e.g. a read past the end of a file
  kResourceExhausted,  // a budget (pinned bytes, disk space) is too small
  kUnsupported,        // the kernel, file system or build lacks a feature
  kCorruption,         // stored data does not match what was written
  kAborted,            // cancelled because an earlier request failed
  kInternal,           // a broken invariant inside zinf
};

std::string_view error_code_name(ErrorCode code);

// A success or an error with a human-readable message that already carries its
// context (operation, path, offset, length, errno text, config key...).
// Cheap to copy when ok. Never ignore one: the type is [[nodiscard]].
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message, int sys_errno = 0)
      : code_(code), errno_(sys_errno), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  // A failed system call on a file: "pwrite /nvme/x.swp offset 4096 length 8192: No space left on device".
  static Status io_error(std::string_view op, std::string_view path, std::uint64_t offset,
                         std::uint64_t length, int sys_errno);
  // A failed system call with no file extent: "open /nvme/x.swp: Permission denied".
  static Status sys_error(std::string_view what, int sys_errno);
  static Status invalid_argument(std::string message) {
    return Status(ErrorCode::kInvalidArgument, std::move(message));
  }
  static Status not_found(std::string message) { return Status(ErrorCode::kNotFound, std::move(message)); }
  static Status out_of_range(std::string message) {
    return Status(ErrorCode::kOutOfRange, std::move(message));
  }
  static Status resource_exhausted(std::string message) {
    return Status(ErrorCode::kResourceExhausted, std::move(message));
  }
  static Status unsupported(std::string message) {
    return Status(ErrorCode::kUnsupported, std::move(message));
  }
  static Status corruption(std::string message) {
    return Status(ErrorCode::kCorruption, std::move(message));
  }
  static Status aborted(std::string message) { return Status(ErrorCode::kAborted, std::move(message)); }
  static Status internal(std::string message) { return Status(ErrorCode::kInternal, std::move(message)); }

  bool is_ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  int sys_errno() const { return errno_; }
  const std::string& message() const { return message_; }
  // "IoError: pwrite /x offset 0 length 10: Input/output error", or "OK".
  std::string to_string() const;

  // The same error with "context: " put in front of the message; ok stays ok.
  Status with_context(std::string_view context) const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  int errno_ = 0;
  std::string message_;
};

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT: must not be ok

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return is_ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace zinf

// Return early from a function returning Status (or Result<T>) when `expr` fails.
#define ZINF_RETURN_IF_ERROR(expr)              \
  do {                                          \
    ::zinf::Status zinf_status_ = (expr);       \
    if (!zinf_status_.is_ok()) return zinf_status_; \
  } while (0)

#define ZINF_CONCAT_INNER_(a, b) a##b
#define ZINF_CONCAT_(a, b) ZINF_CONCAT_INNER_(a, b)
// `ZINF_ASSIGN_OR_RETURN(auto x, make_x());` declares x from a Result or returns its Status.
#define ZINF_ASSIGN_OR_RETURN(lhs, expr) \
  ZINF_ASSIGN_OR_RETURN_IMPL_(ZINF_CONCAT_(zinf_result_, __LINE__), lhs, expr)
#define ZINF_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.is_ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
