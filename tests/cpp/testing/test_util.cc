// SPDX-License-Identifier: Apache-2.0
#include "testing/test_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "common/unique_fd.h"
#include "fastpersist/io_backend.h"

namespace fastpersist::testing {
namespace {

constexpr size_t kPage = 4096;

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

void fill_random(std::span<std::byte> out, uint64_t seed) {
  uint64_t state = seed;
  size_t i = 0;
  while (i + 8 <= out.size()) {
    uint64_t v = splitmix64(state);
    std::memcpy(out.data() + i, &v, 8);
    i += 8;
  }
  if (i < out.size()) {
    uint64_t v = splitmix64(state);
    std::memcpy(out.data() + i, &v, out.size() - i);
  }
}

std::vector<std::byte> random_bytes(size_t n, uint64_t seed) {
  std::vector<std::byte> out(n);
  fill_random(out, seed);
  return out;
}

TestBuffer::TestBuffer(size_t size, size_t misalign) : size_(size) {
  size_t total = (size + misalign + kPage - 1) / kPage * kPage;
  if (total == 0) total = kPage;
  void* p = std::aligned_alloc(kPage, total);
  if (p == nullptr) throw std::bad_alloc();
  base_ = static_cast<std::byte*>(p);
  data_ = base_ + misalign;
}

TestBuffer::~TestBuffer() { std::free(base_); }

TestBuffer::TestBuffer(TestBuffer&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

TestBuffer& TestBuffer::operator=(TestBuffer&& other) noexcept {
  if (this != &other) {
    std::free(base_);
    base_ = std::exchange(other.base_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

Result<std::vector<std::byte>> read_whole_file(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::from_errno(errno, "open for reading").with_path(path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::from_errno(errno, "fstat").with_path(path);
  std::vector<std::byte> out(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd.get(), out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::from_errno(errno, "pread").with_path(path);
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

Status write_whole_file(const std::string& path, std::span<const std::byte> bytes) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return Status::from_errno(errno, "open for writing").with_path(path);
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n =
        ::pwrite(fd.get(), bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::from_errno(n < 0 ? errno : EIO, "pwrite").with_path(path);
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

Result<uint64_t> file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::from_errno(errno, "stat").with_path(path);
  return static_cast<uint64_t>(st.st_size);
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string first_difference(std::span<const std::byte> expected,
                             std::span<const std::byte> actual) {
  size_t n = std::min(expected.size(), actual.size());
  for (size_t i = 0; i < n; ++i) {
    if (expected[i] != actual[i]) {
      return "first difference at byte " + std::to_string(i) + " of " + std::to_string(n) +
             ": expected " + std::to_string(static_cast<int>(expected[i])) + ", got " +
             std::to_string(static_cast<int>(actual[i]));
    }
  }
  if (expected.size() != actual.size()) {
    return "sizes differ: expected " + std::to_string(expected.size()) + " bytes, got " +
           std::to_string(actual.size());
  }
  return "";
}

std::vector<Backend> real_backends() {
  return {Backend::kIoUring, Backend::kLibaio, Backend::kThreads};
}

std::optional<std::string> backend_skip_reason(Backend backend) {
  BackendProbe probe = probe_backend(backend);
  if (probe.available) return std::nullopt;
  std::string why =
      std::string(backend_name(backend)) + " backend unavailable here: " + probe.reason;
  if (!probe.fix.empty()) why += " (fix: " + probe.fix + ")";
  return why;
}

}  // namespace fastpersist::testing
