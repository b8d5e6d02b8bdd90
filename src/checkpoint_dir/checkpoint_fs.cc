// SPDX-License-Identifier: Apache-2.0
#include "checkpoint_dir/checkpoint_fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <new>
#include <random>

#include "common/regular_file.h"
#include "common/unique_fd.h"
#include "fastpersist/layout.h"

namespace fastpersist::checkpoint {

std::string join_path(const std::string& dir, std::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return dir + std::string(name);
  return dir + "/" + std::string(name);
}

Status fsync_dir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid())
    return Status::from_errno(errno, "cannot open directory to fsync it").with_path(dir);
  if (::fsync(fd.get()) != 0)
    return Status::from_errno(errno, "fsync of directory failed").with_path(dir);
  return Status::ok();
}

namespace {

Status write_all(int fd, std::string_view bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::from_errno(errno, "write failed")
          .with_path(path)
          .with_range(done, bytes.size() - done);
    }
    if (n == 0) {
      return Status(StatusCode::kIoError, "write made no progress")
          .with_path(path)
          .with_range(done, bytes.size() - done);
    }
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

}  // namespace

Status write_new_file(const std::string& path, std::string_view bytes, bool durable) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    if (errno == EEXIST)
      return Status(StatusCode::kAlreadyExists, "the file already exists", EEXIST).with_path(path);
    return Status::from_errno(errno, "cannot create file").with_path(path);
  }
  FP_RETURN_IF_ERROR(write_all(fd.get(), bytes, path));
  if (durable && ::fdatasync(fd.get()) != 0) {
    return Status::from_errno(errno, "fdatasync failed").with_path(path);
  }
  if (::close(fd.release()) != 0) return Status::from_errno(errno, "close failed").with_path(path);
  return Status::ok();
}

Result<std::string> read_small_file(const std::string& path, size_t max_bytes) {
  return read_small_regular_file(path, max_bytes, Symlinks::kRefuse);
}

Status replace_file_atomically(const std::string& path, std::string_view bytes, bool durable) {
  auto slash = path.find_last_of('/');
  std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  std::string temp = join_path(dir, replace_temp_prefix(name) + unique_suffix());
  Status st = write_new_file(temp, bytes, durable);
  if (st.is_ok() && ::rename(temp.c_str(), path.c_str()) != 0) {
    st = Status::from_errno(errno, "cannot rename " + temp + " onto the target").with_path(path);
  }
  if (!st.is_ok()) {
    ::unlink(temp.c_str());
    return st;
  }
  return durable ? fsync_dir(dir) : Status::ok();
}

Status rename_no_replace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
    return Status::ok();
  }
  int err = errno;
  if (err == EEXIST) {
    return Status(StatusCode::kAlreadyExists, "the target already exists", EEXIST).with_path(to);
  }
  if (err != EINVAL && err != ENOSYS) {
    return Status::from_errno(err, "cannot rename " + from).with_path(to);
  }
  // The filesystem lacks RENAME_NOREPLACE: check, then rename (the root's lock excludes other
  // writers, so nobody creates the target in between).
  struct stat st {};
  if (::lstat(to.c_str(), &st) == 0) {
    return Status(StatusCode::kAlreadyExists, "the target already exists", EEXIST).with_path(to);
  }
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return Status::from_errno(errno, "cannot rename " + from).with_path(to);
  }
  return Status::ok();
}

namespace {
int remove_entry(const char* path, const struct stat*, int type, struct FTW*) {
  int rc = (type == FTW_DP) ? ::rmdir(path) : ::unlink(path);
  return rc == 0 || errno == ENOENT ? 0 : errno;
}
}  // namespace

Status remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? Status::ok()
                           : Status::from_errno(errno, "cannot stat").with_path(path);
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Status::from_errno(errno, "cannot remove file").with_path(path);
    }
    return Status::ok();
  }
  int rc = ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  if (rc != 0) {
    return Status::from_errno(rc > 0 ? rc : errno, "cannot remove directory tree").with_path(path);
  }
  return Status::ok();
}

Result<std::vector<std::string>> list_dir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return Status::from_errno(errno, "cannot list directory").with_path(dir);
  std::vector<std::string> names;
  errno = 0;
  while (struct dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(std::move(name));
  }
  int err = errno;
  ::closedir(d);
  if (err != 0) return Status::from_errno(err, "cannot list directory").with_path(dir);
  return names;
}

Result<uint64_t> file_size(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0)
    return Status::from_errno(errno, "cannot stat file").with_path(path);
  if (S_ISLNK(st.st_mode)) {
    return Status(StatusCode::kDataLoss,
                  "a symbolic link, which a checkpoint never holds (refused: "
                  "it could lead out of the checkpoint root)")
        .with_path(path);
  }
  if (!S_ISREG(st.st_mode))
    return Status(StatusCode::kDataLoss, "not a regular file").with_path(path);
  return static_cast<uint64_t>(st.st_size);
}

std::string unique_suffix() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%d-%llu-%06llx", static_cast<int>(::getpid()),
                static_cast<unsigned long long>(counter.fetch_add(1)),
                static_cast<unsigned long long>(rng() & 0xffffff));
  return buf;
}

}  // namespace fastpersist::checkpoint
