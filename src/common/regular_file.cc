// SPDX-License-Identifier: Apache-2.0
#include "common/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <new>

namespace fastpersist {
namespace {

const char* kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a plain file";
}

Status not_regular(mode_t mode, const std::string& path, const std::string& what) {
  return Status(StatusCode::kDataLoss, what + " is " + kind_of(mode) + ", not a regular file")
      .with_path(path);
}

}  // namespace

Status check_regular_file(int fd, const std::string& path, const std::string& what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::from_errno(errno, "fstat failed").with_path(path);
  if (!S_ISREG(st.st_mode)) return not_regular(st.st_mode, path, what);
  return Status::ok();
}

Result<UniqueFd> open_or_create_regular_file(const std::string& path, int access,
                                             const std::string& what) {
  UniqueFd fd(::open(path.c_str(), access | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    int err = errno;
    if (err == ELOOP) {
      return Status(StatusCode::kDataLoss, what +
                                               " is a symbolic link; fastpersist never "
                                               "follows one there (remove it)")
          .with_path(path);
    }
    return Status::from_errno(err, "cannot open " + what).with_path(path);
  }
  FP_RETURN_IF_ERROR(check_regular_file(fd.get(), path, what));
  return fd;
}

Result<RegularFile> open_regular_file(const std::string& path, Symlinks symlinks,
                                      const std::string& what) {
  int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC;
  if (symlinks == Symlinks::kRefuse) flags |= O_NOFOLLOW;
  RegularFile f;
  f.fd.reset(::open(path.c_str(), flags));
  if (!f.fd.valid()) {
    int err = errno;
    struct stat st {};
    if (err == ELOOP && symlinks == Symlinks::kRefuse && ::lstat(path.c_str(), &st) == 0 &&
        S_ISLNK(st.st_mode)) {
      return Status(StatusCode::kDataLoss,
                    what +
                        " is a symbolic link, which a checkpoint never holds (refused: it "
                        "could lead out of the checkpoint root)")
          .with_path(path);
    }
    return Status::from_errno(err, "cannot open " + what).with_path(path);
  }
  if (::fstat(f.fd.get(), &f.st) != 0)
    return Status::from_errno(errno, "fstat failed").with_path(path);
  if (!S_ISREG(f.st.st_mode)) return not_regular(f.st.st_mode, path, what);
  f.size = static_cast<uint64_t>(f.st.st_size);
  return f;
}

Result<std::string> read_small_regular_file(const std::string& path, size_t max_bytes,
                                            Symlinks symlinks, const std::string& what) {
  FP_ASSIGN_OR_RETURN(RegularFile file, open_regular_file(path, symlinks, what));
  if (file.size > max_bytes) {
    return Status(StatusCode::kDataLoss, what + " is larger than " + std::to_string(max_bytes) +
                                             " bytes, more than this kind of file can be")
        .with_path(path);
  }
  std::string out;
  try {
    out.resize(static_cast<size_t>(file.size));
  } catch (const std::bad_alloc&) {
    return Status::from_errno(ENOMEM, "cannot allocate " + std::to_string(file.size) + " bytes")
        .with_path(path);
  }
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n =
        ::pread(file.fd.get(), out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::from_errno(errno, "read failed")
          .with_path(path)
          .with_range(done, out.size() - done);
    }
    if (n == 0) break;  // shrank while reading
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

}  // namespace fastpersist
