// SPDX-License-Identifier: Apache-2.0
#include "bench_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace fastpersist::cli {
namespace {

// Closes on scope exit; tools/ may not include src/ internals such as common/unique_fd.h.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

Result<std::optional<uint64_t>> regular_file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::optional<uint64_t>();
    return Status::from_errno(errno, "cannot stat file").with_path(path);
  }
  if (!S_ISREG(st.st_mode)) {
    return Status(StatusCode::kInvalidArgument, "exists and is not a regular file").with_path(path);
  }
  return std::optional<uint64_t>(static_cast<uint64_t>(st.st_size));
}

Status fsync_path(const std::string& path) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) return Status::from_errno(errno, "cannot open file to fsync it").with_path(path);
  if (::fsync(f.fd) != 0) return Status::from_errno(errno, "fsync failed").with_path(path);
  return Status::ok();
}

Status evict_from_page_cache(const std::string& path) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) return Status::from_errno(errno, "cannot open file to evict it").with_path(path);
  // Dirty pages cannot be dropped; write them back first.
  if (::fdatasync(f.fd) != 0) return Status::from_errno(errno, "fdatasync failed").with_path(path);
  int rc = ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
  if (rc != 0) return Status::from_errno(rc, "posix_fadvise(DONTNEED) failed").with_path(path);
  return Status::ok();
}

Status remove_file(const std::string& path) {
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return Status::ok();
    return Status::from_errno(errno, "cannot remove file").with_path(path);
  }
  std::string folder = std::filesystem::path(path).parent_path().string();
  Fd dir{::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dir.fd >= 0) (void)::fsync(dir.fd);  // best effort: only settles the journal
  return Status::ok();
}

void fill_pseudo_random(std::byte* data, size_t bytes, uint64_t seed) {
  uint64_t x = seed | 1;  // xorshift state must not be zero
  size_t i = 0;
  for (; i + sizeof(uint64_t) <= bytes; i += sizeof(uint64_t)) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    uint64_t word = x * 0x2545F4914F6CDD1DULL;
    std::memcpy(data + i, &word, sizeof(word));
  }
  for (; i < bytes; ++i) data[i] = std::byte{0x5a};
}

}  // namespace fastpersist::cli
