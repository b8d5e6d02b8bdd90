// SPDX-License-Identifier: Apache-2.0
#include "io/open_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/align.h"

#ifndef STATX_DIOALIGN
#define STATX_DIOALIGN 0x00002000U
#endif

namespace fastpersist::io {
namespace {

constexpr uint32_t kFallbackAlignment = 4096;

uint32_t sysfs_logical_block_size(dev_t dev) {
  // A partition has no queue/ of its own; its parent disk does.
  std::string base =
      "/sys/dev/block/" + std::to_string(major(dev)) + ":" + std::to_string(minor(dev));
  for (const char* rel : {"/queue/logical_block_size", "/../queue/logical_block_size"}) {
    std::ifstream in(base + rel);
    uint32_t value = 0;
    if (in >> value && is_power_of_two(value)) return value;
  }
  return 0;
}

std::string describe(const IoRequest& r) {
  return r.fd >= 0 ? "fd " + std::to_string(r.fd) : r.path;
}

Status open_error(int err, const IoRequest& r, const char* what) {
  return Status::from_errno(err, std::string("cannot open file for ") + what)
      .with_path(describe(r));
}

// Reopens a caller's descriptor through /proc so we get our own file description with our
// own flags (O_DIRECT or not, no O_APPEND) without disturbing the caller's.
int reopen_fd(int fd, int flags) {
  std::string proc = "/proc/self/fd/" + std::to_string(fd);
  return ::open(proc.c_str(), flags | O_CLOEXEC);
}

}  // namespace

FileIoMode direct_io_alignment(int fd) {
  FileIoMode mode;
  struct statx sx {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN | STATX_BASIC_STATS, &sx) == 0 &&
      (sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_offset_align != 0) {
    mode.offset_alignment = sx.stx_dio_offset_align;
    mode.memory_alignment = std::max<uint32_t>(sx.stx_dio_mem_align, 1);
    return mode;
  }
  struct stat st {};
  uint32_t lbs = 0;
  if (::fstat(fd, &st) == 0)
    lbs = sysfs_logical_block_size(S_ISBLK(st.st_mode) ? st.st_rdev : st.st_dev);
  mode.offset_alignment = lbs != 0 ? lbs : kFallbackAlignment;
  mode.memory_alignment = mode.offset_alignment;
  return mode;
}

Result<std::shared_ptr<OpenFile>> open_for_request(const IoRequest& r, bool want_direct) {
  const bool write = r.kind == IoKind::kWrite;
  const char* what = write ? "writing" : "reading";
  auto file = std::make_shared<OpenFile>();
  file->path = describe(r);

  int access = write ? O_WRONLY : O_RDONLY;
  if (r.fd >= 0) {
    int fl = ::fcntl(r.fd, F_GETFL);
    if (fl < 0) return open_error(errno, r, what);
    int acc = fl & O_ACCMODE;
    if ((write && acc == O_RDONLY) || (!write && acc == O_WRONLY)) {
      return Status(StatusCode::kInvalidArgument,
                    std::string("file descriptor is not open for ") + what)
          .with_path(file->path);
    }
    int fd = reopen_fd(r.fd, access);
    if (fd < 0) fd = (fl & (O_DIRECT | O_APPEND)) ? -1 : ::fcntl(r.fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return open_error(errno, r, what);
    file->buffered_fd.reset(fd);
  } else {
    if (r.path.empty()) {
      return Status(StatusCode::kInvalidArgument, "request names neither a path nor a descriptor");
    }
    int flags = access | O_CLOEXEC;
    if (write) flags |= O_CREAT | (r.truncate ? O_TRUNC : 0);
    int fd = ::open(r.path.c_str(), flags, 0644);
    if (fd < 0) return open_error(errno, r, what);
    file->buffered_fd.reset(fd);
  }

  struct stat st {};
  if (::fstat(file->buffered_fd.get(), &st) != 0) {
    return Status::from_errno(errno, "fstat failed").with_path(file->path);
  }
  if (S_ISDIR(st.st_mode)) {
    // The same error open() gives for a write to a directory, so both directions agree (and
    // Python raises IsADirectoryError for either).
    return Status::from_errno(EISDIR, "path is a directory").with_path(file->path);
  }
  if (!write && S_ISREG(st.st_mode)) {
    uint64_t size = static_cast<uint64_t>(st.st_size);
    if (r.file_offset > size || r.length > size - r.file_offset) {
      return Status(StatusCode::kOutOfRange,
                    "read past the end of the file: the file has " + std::to_string(size) +
                        " bytes, the request needs " + std::to_string(r.file_offset + r.length))
          .with_path(file->path)
          .with_range(r.file_offset, r.length);
    }
  }
  file->split_alignment = std::max<uint64_t>({4096, static_cast<uint64_t>(st.st_blksize), 1});
  if (!is_power_of_two(file->split_alignment)) file->split_alignment = 4096;

  if (!want_direct) return file;
  int dfd = r.fd >= 0 ? reopen_fd(r.fd, access | O_DIRECT)
                      : ::open(r.path.c_str(), access | O_DIRECT | O_CLOEXEC);
  if (dfd < 0) {
    int err = errno;
    file->mode.direct = false;
    file->mode.fallback_reason =
        err == EINVAL ? "the filesystem refuses O_DIRECT (EINVAL); using buffered I/O"
                      : std::string("opening with O_DIRECT failed (") + std::strerror(err) +
                            "); using buffered I/O";
    return file;
  }
  file->direct_fd.reset(dfd);
  FileIoMode align = direct_io_alignment(dfd);
  file->mode.direct = true;
  file->mode.offset_alignment = align.offset_alignment;
  file->mode.memory_alignment = align.memory_alignment;
  file->split_alignment = std::max<uint64_t>(file->split_alignment, align.offset_alignment);
  // An O_DIRECT write that extends the file runs synchronously under the inode lock on ext4 and
  // xfs, so the queue depth collapses to one. Allocating the range first (as fio does) keeps the
  // writes asynchronous; mode 0 sets the size to exactly what the write produces. Filesystems
  // without fallocate simply keep the slow path; running out of space is reported now.
  if (write && S_ISREG(st.st_mode) && r.length > 0 &&
      r.file_offset + r.length > static_cast<uint64_t>(st.st_size)) {
    if (::fallocate(file->buffered_fd.get(), 0, static_cast<off_t>(r.file_offset),
                    static_cast<off_t>(r.length)) != 0 &&
        errno == ENOSPC) {
      return Status::from_errno(ENOSPC, "cannot allocate space for the write")
          .with_path(file->path)
          .with_range(r.file_offset, r.length);
    }
  }
  return file;
}

Result<FileIoMode> probe_file_io_impl(const std::string& path) {
  struct stat st {};
  UniqueFd fd;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    int tmp = ::open(path.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (tmp < 0) {
      // Filesystems without O_TMPFILE: a named temporary, removed at once.
      std::string name = path + "/.fastpersist-probe-XXXXXX";
      tmp = ::mkstemp(name.data());
      if (tmp >= 0) ::unlink(name.c_str());
    }
    if (tmp < 0)
      return Status::from_errno(errno, "cannot create a probe file in the folder").with_path(path);
    fd.reset(tmp);
  } else {
    int f = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f < 0) return Status::from_errno(errno, "cannot open file").with_path(path);
    fd.reset(f);
  }
  FileIoMode mode;
  int dfd = reopen_fd(fd.get(), O_RDONLY | O_DIRECT);
  if (dfd < 0) {
    mode.direct = false;
    mode.fallback_reason = errno == EINVAL
                               ? "the filesystem refuses O_DIRECT (EINVAL)"
                               : std::string("O_DIRECT open failed: ") + std::strerror(errno);
    return mode;
  }
  UniqueFd direct(dfd);
  mode = direct_io_alignment(dfd);
  mode.direct = true;
  return mode;
}

}  // namespace fastpersist::io

namespace fastpersist {
Result<FileIoMode> probe_file_io(const std::string& path) { return io::probe_file_io_impl(path); }
}  // namespace fastpersist
