// SPDX-License-Identifier: Apache-2.0
// Status and Result<T>: how every fallible fastpersist call reports failure.
//
// A Status is either OK or carries an error code, the errno that caused it (0 when none), and
// the context a user needs to act on it: a message, the file path, and the byte range. Errors
// are values inside the C++ core; the Python layer turns them into exceptions in one place.
// Status and Result are plain values: copyable, movable, not synchronized.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace fastpersist {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // caller's mistake: bad size, bad option, buffer too small
  kIoError = 2,          // the operating system refused or failed an I/O (errno says why)
  kNotFound = 3,         // a file or directory does not exist
  kUnavailable = 4,      // a feature this machine or build lacks (backend, CUDA, ...)
  kOutOfRange = 5,       // e.g. a read past the end of a file
  kInternal = 6,         // a broken invariant inside fastpersist
  kDataLoss = 7,         // stored bytes are damaged: checksum mismatch, truncated or bad format
  kAlreadyExists = 8,    // e.g. a checkpoint tag that is already committed
  kBusy = 9,             // a resource held by someone else (another manager's lock)
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message, int sys_errno = 0)
      : code_(code), errno_(sys_errno), message_(std::move(message)) {}

  static Status ok() { return {}; }
  // An OS error from `sys_errno` (e.g. errno or -cqe->res), classified by code.
  static Status from_errno(int sys_errno, std::string message);

  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  int sys_errno() const { return errno_; }
  const std::string& message() const { return message_; }
  const std::string& path() const { return path_; }
  std::optional<uint64_t> offset() const { return offset_; }
  std::optional<uint64_t> length() const { return length_; }

  // Attach context; returns *this so calls chain: st.with_path(p).with_range(off, len).
  Status& with_path(std::string path) &;
  Status&& with_path(std::string path) &&;
  Status& with_range(uint64_t offset, uint64_t length) &;
  Status&& with_range(uint64_t offset, uint64_t length) &&;

  // "io error: short write ... [errno 28: No space left on device] (path /x, offset 0, length
  // 4096)"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  int errno_ = 0;
  std::string message_;
  std::string path_;
  std::optional<uint64_t> offset_;
  std::optional<uint64_t> length_;
};

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}  // NOLINT(google-explicit-constructor)

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace fastpersist

// Propagate a non-OK Status from an expression returning Status.
#define FP_RETURN_IF_ERROR(expr)           \
  do {                                     \
    ::fastpersist::Status fp_st_ = (expr); \
    if (!fp_st_.is_ok()) return fp_st_;    \
  } while (0)

#define FP_CONCAT_INNER_(a, b) a##b
#define FP_CONCAT_(a, b) FP_CONCAT_INNER_(a, b)
// `FP_ASSIGN_OR_RETURN(auto x, make_x());` binds the value or returns the error.
#define FP_ASSIGN_OR_RETURN(lhs, expr) \
  FP_ASSIGN_OR_RETURN_IMPL_(FP_CONCAT_(fp_res_, __LINE__), lhs, expr)
#define FP_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.is_ok()) return tmp.status();          \
  lhs = std::move(tmp).value()
