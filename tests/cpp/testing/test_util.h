// SPDX-License-Identifier: Apache-2.0
// Small helpers shared by the C++ tests: reproducible random bytes, buffers at a chosen
// (mis)alignment, whole-file reads and writes with plain POSIX calls (never through the engine
// under test), and the list of real backends with the reason one is skipped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fastpersist/options.h"
#include "fastpersist/status.h"

namespace fastpersist::testing {

// `n` bytes from a fixed generator: the same seed always gives the same bytes.
std::vector<std::byte> random_bytes(size_t n, uint64_t seed);
void fill_random(std::span<std::byte> out, uint64_t seed);

// Heap memory whose data() is `misalign` bytes past a 4096-byte boundary, so a test can hand the
// engine page-aligned memory (misalign 0) or deliberately misaligned memory (misalign 1).
class TestBuffer {
 public:
  explicit TestBuffer(size_t size, size_t misalign = 0);
  ~TestBuffer();
  TestBuffer(TestBuffer&& other) noexcept;
  TestBuffer& operator=(TestBuffer&& other) noexcept;
  TestBuffer(const TestBuffer&) = delete;
  TestBuffer& operator=(const TestBuffer&) = delete;

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<std::byte> span() { return {data_, size_}; }
  std::span<const std::byte> span() const { return {data_, size_}; }

 private:
  std::byte* base_ = nullptr;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// The whole content of a file (pread loop), or the errno-carrying error.
Result<std::vector<std::byte>> read_whole_file(const std::string& path);
// Creates or replaces `path` with exactly `bytes`.
Status write_whole_file(const std::string& path, std::span<const std::byte> bytes);
Result<uint64_t> file_size(const std::string& path);
// The names in `dir` (not "." and ".."), sorted; empty when it cannot be read.
std::vector<std::string> list_dir(const std::string& dir);

// "" when equal, else where and how they first differ (for EXPECT_EQ("", ...)).
std::string first_difference(std::span<const std::byte> expected,
                             std::span<const std::byte> actual);

// io_uring, libaio, threads: the backends every engine test runs against.
std::vector<Backend> real_backends();
// Why `backend` cannot run here (the probe's reason and fix), or nullopt when it can.
std::optional<std::string> backend_skip_reason(Backend backend);

}  // namespace fastpersist::testing
