// SPDX-License-Identifier: Apache-2.0
// read_whole_file with progress (fastpersist/file_reader.h): the pieces land where a plain read
// puts them, progress counts from 0 to the size, and a file changed meanwhile is refused.
#include "fastpersist/file_reader.h"

#include <gtest/gtest.h>
#include <stdio.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"

namespace fastpersist::testing {
namespace {

using Calls = std::vector<std::pair<uint64_t, uint64_t>>;

std::unique_ptr<IoEngine> engine() {
  Result<std::unique_ptr<IoEngine>> e = IoEngine::create(EngineOptions{});
  EXPECT_TRUE(e.is_ok()) << e.status().to_string();
  return std::move(*e);
}

TEST(ReadWholeFileProgress, PiecesAddUpToThePlainReadAndProgressCountsToTheSize) {
  TempDir dir;
  // Two pieces and a tail: the last piece is short and unaligned.
  const size_t size = 2 * kProgressReadChunkBytes + 12345;
  std::vector<std::byte> bytes = random_bytes(size, 7);
  FP_ASSERT_OK(write_whole_file(dir.file("f"), bytes));
  auto io = engine();
  Calls calls;
  FP_ASSERT_OK_AND_ASSIGN(
      auto read, fastpersist::read_whole_file(dir.file("f"), *io, [&](uint64_t d, uint64_t t) {
        calls.emplace_back(d, t);
      }));
  ASSERT_EQ(read->size(), size);
  EXPECT_EQ(std::memcmp(read->data(), bytes.data(), size), 0);
  EXPECT_EQ(calls, (Calls{{0, size},
                          {kProgressReadChunkBytes, size},
                          {2 * kProgressReadChunkBytes, size},
                          {size, size}}));
}

TEST(ReadWholeFileProgress, AnEmptyFileReportsZeroOfZero) {
  TempDir dir;
  FP_ASSERT_OK(write_whole_file(dir.file("empty"), {}));
  auto io = engine();
  Calls calls;
  FP_ASSERT_OK_AND_ASSIGN(
      auto read, fastpersist::read_whole_file(dir.file("empty"), *io, [&](uint64_t d, uint64_t t) {
        calls.emplace_back(d, t);
      }));
  EXPECT_EQ(read->size(), 0u);
  EXPECT_EQ(calls, (Calls{{0, 0}}));
}

TEST(ReadWholeFileProgress, AFileReplacedWhileItIsReadIsRefused) {
  TempDir dir;
  std::vector<std::byte> bytes = random_bytes(100000, 3);
  FP_ASSERT_OK(write_whole_file(dir.file("f"), bytes));
  FP_ASSERT_OK(write_whole_file(dir.file("other"), random_bytes(100000, 4)));
  auto io = engine();
  // Replaced between the size was taken and the first piece: the read would mix two files.
  auto replaced = fastpersist::read_whole_file(dir.file("f"), *io, [&](uint64_t done, uint64_t) {
    if (done == 0) {
      EXPECT_EQ(::rename(dir.file("other").c_str(), dir.file("f").c_str()), 0);
    }
  });
  ASSERT_FALSE(replaced.is_ok());
  EXPECT_EQ(replaced.status().code(), StatusCode::kIoError);
  EXPECT_EQ(replaced.status().sys_errno(), EAGAIN);
  EXPECT_NE(replaced.status().message().find("changed while it was being read"), std::string::npos);
}

TEST(ReadWholeFileProgress, ADirectoryIsRefusedBeforeAnyProgress) {
  TempDir dir;
  auto io = engine();
  bool called = false;
  auto read =
      fastpersist::read_whole_file(dir.path(), *io, [&](uint64_t, uint64_t) { called = true; });
  ASSERT_FALSE(read.is_ok());
  EXPECT_EQ(read.status().sys_errno(), EISDIR);
  EXPECT_FALSE(called);
}

}  // namespace
}  // namespace fastpersist::testing
