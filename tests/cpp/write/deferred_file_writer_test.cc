// SPDX-License-Identifier: Apache-2.0
// DeferredFileWriter: what write() recorded, persist() writes byte for byte (borrowed pieces from
// the lent memory as it is at persist time, copied pieces as they were at write time), with the
// record write_sidecar_file gives; a file is created once, a failure leaves none; and
// check_object_file refuses a file that is not what its record says.
#include "fastpersist/deferred_file_writer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "fastpersist/checksum.h"
#include "fastpersist/pinned_buffer.h"
#include "testing/fault_backend.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"

namespace fastpersist::testing {
namespace {

DeferredFileWriterOptions options(bool durable = false) {
  DeferredFileWriterOptions o;
  o.writer.durable = durable;
  o.writer.io_buffer_bytes = size_t{1} << 20;
  o.rank = 3;
  return o;
}

std::vector<std::byte> concat(const std::vector<std::span<const std::byte>>& parts) {
  std::vector<std::byte> out;
  for (auto p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(DeferredFileWriter, WritesBorrowedAndCopiedPiecesInOrder) {
  TempDir dir;
  TestBuffer tensor(size_t{20} << 20, 64);  // a lent "storage", not page aligned
  fill_random(tensor.span(), 1);
  std::vector<std::byte> header = random_bytes(300, 2);
  std::vector<std::byte> middle = random_bytes(100000, 3);  // large, but not lent: copied
  FP_ASSERT_OK_AND_ASSIGN(auto w, DeferredFileWriter::create(dir.path(), "a.pt", options(true)));
  w->borrow(tensor.data(), tensor.size());
  FP_ASSERT_OK(w->write(header.data(), header.size()));
  FP_ASSERT_OK(w->write(tensor.data() + 4096, (size_t{12} << 20) + 5));  // inside the lent range
  std::vector<std::byte> scratch = middle;
  FP_ASSERT_OK(w->write(scratch.data(), scratch.size()));
  std::memset(scratch.data(), 0, scratch.size());  // the caller reuses its memory: a copy was kept
  FP_ASSERT_OK(w->write(header.data(), 7));
  DeferredFileWriterStats s = w->stats();
  EXPECT_EQ(s.borrowed_bytes, (size_t{12} << 20) + 5);
  EXPECT_EQ(s.copied_bytes, 300u + 100000u + 7u);
  EXPECT_EQ(s.pieces, 3u);  // the copies after the borrowed piece share one block

  FP_ASSERT_OK_AND_ASSIGN(ManifestFile rec, w->persist());
  std::vector<std::byte> want =
      concat({std::span<const std::byte>(header),
              std::span<const std::byte>(tensor.data() + 4096, (size_t{12} << 20) + 5),
              std::span<const std::byte>(middle), std::span<const std::byte>(header.data(), 7)});
  FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> got, read_whole_file(dir.file("a.pt")));
  EXPECT_TRUE(got == want);
  EXPECT_EQ(rec.name, "a.pt");
  EXPECT_EQ(rec.role, "objects");
  EXPECT_EQ(rec.size, want.size());
  EXPECT_EQ(rec.checksum_bytes, want.size());
  EXPECT_EQ(rec.checksum, xxh3_64(want.data(), want.size()));
  EXPECT_EQ(rec.rank, std::optional<uint32_t>(3));
  EXPECT_EQ((w->persist().status()).code(), StatusCode::kInvalidArgument);  // once
  EXPECT_EQ((w->write(header.data(), 1)).code(), StatusCode::kInvalidArgument);
}

TEST(DeferredFileWriter, APieceReachingPastTheLentRangeIsCopied) {
  TempDir dir;
  TestBuffer tensor(size_t{1} << 20);
  fill_random(tensor.span(), 4);
  FP_ASSERT_OK_AND_ASSIGN(auto w, DeferredFileWriter::create(dir.path(), "b", options()));
  w->borrow(tensor.data(), tensor.size() / 2);
  FP_ASSERT_OK(w->write(tensor.data(), tensor.size()));  // half of it lies outside
  EXPECT_EQ(w->stats().borrowed_bytes, 0u);
  FP_ASSERT_OK(w->write(tensor.data() + 100, 4096));  // below borrow_min_bytes
  EXPECT_EQ(w->stats().borrowed_bytes, 0u);
  std::vector<std::byte> want(tensor.data(), tensor.data() + tensor.size());
  want.insert(want.end(), tensor.data() + 100, tensor.data() + 100 + 4096);
  std::memset(tensor.data(), 0, tensor.size());
  FP_ASSERT_OK(w->persist().status());
  FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> got, read_whole_file(dir.file("b")));
  EXPECT_TRUE(got == want);
}

// A piece that starts just past a lent range (torch.save's pickle, allocated right after a small
// storage) is copied, not borrowed: its memory is freed before persist() runs.
TEST(DeferredFileWriter, APieceJustPastALentRangeIsCopied) {
  TempDir dir;
  TestBuffer memory(size_t{1} << 20);
  fill_random(memory.span(), 21);
  FP_ASSERT_OK_AND_ASSIGN(auto w, DeferredFileWriter::create(dir.path(), "p", options()));
  w->borrow(memory.data(), 4096);                       // a small storage
  const std::byte* pickle = memory.data() + 4096 + 16;  // 16 bytes past its end
  const size_t n = 70000;                               // above borrow_min_bytes
  FP_ASSERT_OK(w->write(pickle, n));
  EXPECT_EQ(w->stats().borrowed_bytes, 0u);
  EXPECT_EQ(w->stats().copied_bytes, n);
  std::vector<std::byte> want(pickle, pickle + n);
  std::memset(memory.data() + 4096, 0, n + 16);  // the pickle's memory is reused
  FP_ASSERT_OK(w->persist().status());
  FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> got, read_whole_file(dir.file("p")));
  EXPECT_TRUE(got == want);
}

TEST(DeferredFileWriter, RefusesBadNamesAndExistingFiles) {
  TempDir dir;
  for (const char* bad : {"", ".", "..", "a/b", "../x"}) {
    EXPECT_EQ((DeferredFileWriter::create(dir.path(), bad, options()).status()).code(),
              StatusCode::kInvalidArgument)
        << bad;
  }
  std::vector<std::byte> old = random_bytes(10, 5);
  FP_ASSERT_OK(write_whole_file(dir.file("taken"), old));
  EXPECT_EQ(DeferredFileWriter::create(dir.path(), "taken", options()).status().code(),
            StatusCode::kAlreadyExists);
  // Created meanwhile (another writer of the same name): persist() refuses and keeps it.
  FP_ASSERT_OK_AND_ASSIGN(auto w, DeferredFileWriter::create(dir.path(), "late", options()));
  FP_ASSERT_OK(w->write(old.data(), 3));
  FP_ASSERT_OK(write_whole_file(dir.file("late"), old));
  EXPECT_EQ((w->persist().status()).code(), StatusCode::kAlreadyExists);
  FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> got, read_whole_file(dir.file("late")));
  EXPECT_TRUE(got == old);
}

TEST(DeferredFileWriter, ASnapshotFreesTheLentMemoryBeforePersist) {
  TempDir dir;
  PinnedBufferPool pool(size_t{64} << 20);
  TestBuffer a(size_t{3} << 20, 64);  // two lent "storages", not page aligned
  TestBuffer b((size_t{1} << 20) + 123, 64);
  fill_random(a.span(), 11);
  fill_random(b.span(), 12);
  std::vector<std::byte> header = random_bytes(500, 13);
  std::vector<std::byte> want = concat(
      {std::span<const std::byte>(header), a.span(), std::span<const std::byte>(header), b.span()});
  for (int round = 0; round < 2; ++round) {  // the second save reuses the pool's buffer
    std::string name = "s" + std::to_string(round);
    FP_ASSERT_OK_AND_ASSIGN(auto w, DeferredFileWriter::create(dir.path(), name, options(true)));
    w->borrow(a.data(), a.size());
    w->borrow(b.data(), b.size());
    FP_ASSERT_OK(w->write(header.data(), header.size()));
    FP_ASSERT_OK(w->write(a.data(), a.size()));
    FP_ASSERT_OK(w->write(header.data(), header.size()));
    FP_ASSERT_OK(w->write(b.data(), b.size()));
    FP_ASSERT_OK(w->snapshot(pool));
    EXPECT_EQ(w->stats().snapshot_bytes, a.size() + b.size());
    // The trainer changes its tensors as soon as the snapshot is taken.
    std::vector<std::byte> a_was(a.data(), a.data() + a.size());
    std::vector<std::byte> b_was(b.data(), b.data() + b.size());
    std::memset(a.data(), 0x5a, a.size());
    std::memset(b.data(), 0xa5, b.size());
    EXPECT_EQ(w->snapshot(pool).code(), StatusCode::kInvalidArgument);  // once
    EXPECT_EQ(w->write(header.data(), 1).code(), StatusCode::kInvalidArgument);
    FP_ASSERT_OK_AND_ASSIGN(ManifestFile rec, w->persist());
    FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> got, read_whole_file(dir.file(name)));
    EXPECT_TRUE(got == want);
    EXPECT_EQ(rec.checksum, xxh3_64(want.data(), want.size()));
    std::memcpy(a.data(), a_was.data(), a.size());
    std::memcpy(b.data(), b_was.data(), b.size());
    w.reset();
    EXPECT_GE(pool.cached_bytes(), a.size() + b.size());  // the copies' buffer is back
  }
}

TEST(DeferredFileWriter, ASnapshottedStreamIsNotTakenApart) {
  TempDir dir;
  PinnedBufferPool pool;
  std::vector<std::byte> bytes = random_bytes(1000, 14);
  FP_ASSERT_OK_AND_ASSIGN(auto w, DeferredFileWriter::create(dir.path(), "t", options()));
  FP_ASSERT_OK(w->write(bytes.data(), bytes.size()));
  FP_ASSERT_OK(w->snapshot(pool));  // nothing borrowed: nothing to copy
  EXPECT_EQ(w->stats().snapshot_bytes, 0u);
  EXPECT_EQ(w->take_pieces().status().code(), StatusCode::kInvalidArgument);
  FP_ASSERT_OK(w->persist().status());
  EXPECT_EQ(w->snapshot(pool).code(), StatusCode::kInvalidArgument);  // finished
  FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> got, read_whole_file(dir.file("t")));
  EXPECT_TRUE(got == bytes);
}

TEST(DeferredFileWriter, ReplacesAnExistingFileOnlyWhenAsked) {
  TempDir dir;
  std::vector<std::byte> old = random_bytes(10, 15);
  std::vector<std::byte> fresh = random_bytes(70000, 16);
  FP_ASSERT_OK(write_whole_file(dir.file("last.ckpt"), old));
  DeferredFileWriterOptions o = options(true);
  o.replace_existing = true;
  FP_ASSERT_OK_AND_ASSIGN(auto w, DeferredFileWriter::create(dir.path(), "last.ckpt", o));
  FP_ASSERT_OK(w->write(fresh.data(), fresh.size()));
  // Until persist() renames the new file over it, the old one is whole.
  FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> before, read_whole_file(dir.file("last.ckpt")));
  EXPECT_TRUE(before == old);
  FP_ASSERT_OK(w->persist().status());
  FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> got, read_whole_file(dir.file("last.ckpt")));
  EXPECT_TRUE(got == fresh);
  EXPECT_EQ(list_dir(dir.path()).size(), 1u);  // no temporary file left
}

TEST(DeferredFileWriter, AFailedWriteLeavesNoFile) {
  TempDir dir;
  FP_ASSERT_OK_AND_ASSIGN(
      auto faults,
      FaultInjector::create(
          {.kind = FaultKind::kError, .error = ENOSPC, .nth = 2, .ops = FaultOps::kWrites},
          Backend::kThreads));
  EngineOptions eo;
  eo.backend = Backend::kThreads;
  FP_ASSERT_OK_AND_ASSIGN(auto engine, IoEngine::create(eo, faults->factory(), "faulty threads"));
  TestBuffer tensor(size_t{8} << 20);
  fill_random(tensor.span(), 6);
  FP_ASSERT_OK_AND_ASSIGN(auto w,
                          DeferredFileWriter::create(dir.path(), "c", options(true),
                                                     std::shared_ptr<IoEngine>(std::move(engine))));
  w->borrow(tensor.data(), tensor.size());
  FP_ASSERT_OK(w->write(tensor.data(), tensor.size()));
  Status st = w->persist().status();
  EXPECT_FALSE(st.is_ok());
  EXPECT_EQ(st.sys_errno(), ENOSPC) << st.to_string();
  EXPECT_TRUE(list_dir(dir.path()).empty());
}

TEST(CheckObjectFile, ChecksSizeAndChecksum) {
  TempDir dir;
  std::vector<std::byte> bytes = random_bytes((size_t{8} << 20) + 50000, 7);  // more than one chunk
  FP_ASSERT_OK_AND_ASSIGN(auto w, DeferredFileWriter::create(dir.path(), "d", options()));
  FP_ASSERT_OK(w->write(bytes.data(), bytes.size()));
  FP_ASSERT_OK_AND_ASSIGN(ManifestFile rec, w->persist());
  FP_EXPECT_OK(check_object_file(dir.file("d"), rec, true));

  bytes[(size_t{8} << 20) + 12345] ^= std::byte{1};  // one flipped bit, in the second chunk
  FP_ASSERT_OK(write_whole_file(dir.file("d"), bytes));
  Status st = check_object_file(dir.file("d"), rec, true);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.to_string().find(dir.file("d")), std::string::npos) << st.to_string();
  FP_EXPECT_OK(check_object_file(dir.file("d"), rec, false));  // a manifest without checksums

  bytes.pop_back();
  FP_ASSERT_OK(write_whole_file(dir.file("d"), bytes));
  EXPECT_EQ(check_object_file(dir.file("d"), rec, false).code(), StatusCode::kDataLoss);
  EXPECT_FALSE(check_object_file(dir.file("missing"), rec, true).is_ok());
  EXPECT_EQ(check_object_file(dir.path(), rec, true).code(), StatusCode::kDataLoss);  // a directory
}

}  // namespace
}  // namespace fastpersist::testing
