// SPDX-License-Identifier: Apache-2.0
#include "stream/writer_files.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
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
  // A remover of dead writers' temporaries (stale_files.cc) may take a fresh temporary's lock
  // before we do and delete it; then we simply make another one. Each round needs a remover to
  // win that race again, so a handful of rounds is plenty.
  for (int attempt = 0; attempt < 16; ++attempt) {
    std::string templ =
        dir_of(target) + "/." + base + std::string(kTempInfix) + std::string(kTempRandomChars, 'X');
    UniqueFd fd(::mkostemp(templ.data(), O_CLOEXEC));
    if (!fd.valid()) {
      return Status::from_errno(errno, "cannot create a temporary file next to the target")
          .with_path(target);
    }
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) continue;  // a remover holds it and is deleting it
      // A filesystem without flock (some FUSE mounts): write unlocked. A remover cannot lock
      // such a file either, so it never takes it for debris.
    }
    if (::fstat(fd.get(), &st) != 0)
      return Status::from_errno(errno, "fstat failed").with_path(templ);
    if (st.st_nlink == 0) continue;  // deleted by a remover before we locked it
    ::fchmod(fd.get(), 0644);        // mkostemp makes 0600; a checkpoint is an ordinary file
    *temp_path = templ;
    return fd;
  }
  return Status(StatusCode::kIoError,
                "cannot keep a temporary file next to the target: something "
                "keeps deleting it")
      .with_path(target);
}

Status fsync_parent_dir(const std::string& path) {
  std::string dir = dir_of(path);
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid())
    return Status::from_errno(errno, "cannot open directory to fsync it").with_path(dir);
  if (::fsync(fd.get()) != 0)
    return Status::from_errno(errno, "fsync of directory failed").with_path(dir);
  return Status::ok();
}

Status commit_rename(const std::string& from, const std::string& to, bool durable) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return Status::from_errno(errno, "cannot rename " + from + " onto the target").with_path(to);
  }
  return durable ? fsync_parent_dir(to) : Status::ok();
}

}  // namespace fastpersist::stream
