// SPDX-License-Identifier: Apache-2.0
#include "fastpersist/status.h"

#include <cerrno>
#include <cstring>

namespace fastpersist {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kIoError:
      return "io error";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kOutOfRange:
      return "out of range";
    case StatusCode::kInternal:
      return "internal error";
    case StatusCode::kDataLoss:
      return "data loss";
    case StatusCode::kAlreadyExists:
      return "already exists";
    case StatusCode::kBusy:
      return "busy";
  }
  return "unknown";
}

Status Status::from_errno(int sys_errno, std::string message) {
  StatusCode code = StatusCode::kIoError;
  if (sys_errno == ENOENT) code = StatusCode::kNotFound;
  if (sys_errno == ENOSYS || sys_errno == EOPNOTSUPP) code = StatusCode::kUnavailable;
  return Status(code, std::move(message), sys_errno);
}

Status& Status::with_path(std::string path) & {
  path_ = std::move(path);
  return *this;
}
Status&& Status::with_path(std::string path) && {
  path_ = std::move(path);
  return std::move(*this);
}
Status& Status::with_range(uint64_t offset, uint64_t length) & {
  offset_ = offset;
  length_ = length;
  return *this;
}
Status&& Status::with_range(uint64_t offset, uint64_t length) && {
  offset_ = offset;
  length_ = length;
  return std::move(*this);
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  std::string s = std::string(status_code_name(code_)) + ": " + message_;
  if (errno_ != 0) {
    s += " [errno " + std::to_string(errno_) + ": " + std::strerror(errno_) + "]";
  }
  if (!path_.empty() || offset_) {
    s += " (";
    if (!path_.empty()) s += "path " + path_;
    if (offset_) {
      if (!path_.empty()) s += ", ";
      s += "offset " + std::to_string(*offset_) + ", length " + std::to_string(*length_);
    }
    s += ")";
  }
  return s;
}

}  // namespace fastpersist
