// SPDX-License-Identifier: Apache-2.0
#include "stream/writer_files.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace fastpersist::stream {

std::string dir_of(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_of(const std::string& path) {
  auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

Result<UniqueFd> create_temp_beside(const std::string& target, std::string* temp_path) {
  std::string base = base_of(target);
  if (base.empty() || base == "." || base == "..") {
    return Status(StatusCode::kInvalidArgument, "not a file path").with_path(target);
  }
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return Status(StatusCode::kIoError, "target is a directory", EISDIR).with_path(target);
  }
  std::string templ = dir_of(target) + "/." + base + ".fp-tmp-XXXXXX";
  int fd = ::mkostemp(templ.data(), O_CLOEXEC);
  if (fd < 0) {
    return Status::from_errno(errno, "cannot create a temporary file next to the target").with_path(target);
  }
  ::fchmod(fd, 0644);  // mkostemp makes 0600; a checkpoint is an ordinary file
  *temp_path = templ;
  return UniqueFd(fd);
}

Status fsync_parent_dir(const std::string& path) {
  std::string dir = dir_of(path);
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return Status::from_errno(errno, "cannot open directory to fsync it").with_path(dir);
  if (::fsync(fd.get()) != 0) return Status::from_errno(errno, "fsync of directory failed").with_path(dir);
  return Status::ok();
}

Status commit_rename(const std::string& from, const std::string& to, bool durable) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return Status::from_errno(errno, "cannot rename " + from + " onto the target").with_path(to);
  }
  return durable ? fsync_parent_dir(to) : Status::ok();
}

}  // namespace fastpersist::stream
