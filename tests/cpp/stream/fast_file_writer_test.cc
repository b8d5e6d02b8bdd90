// SPDX-License-Identifier: Apache-2.0
// FastFileWriter: the file equals the stream, byte for byte, whatever the chunking, buffer size,
// backend or number of parallel writers; the target never holds a partial file.
#include "fastpersist/fast_file_writer.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <random>
#include <thread>
#include <vector>

#include "testing/mount_util.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"

namespace fastpersist {
namespace {

using testing::list_dir;
using testing::TempDir;

// Writes `data` in pseudo-random chunk sizes (1 byte to 3 MiB) drawn from `seed`.
Status write_chunked(FastFileWriter& w, std::span<const std::byte> data, unsigned seed) {
  std::mt19937 rng(seed);
  size_t pos = 0;
  while (pos < data.size()) {
    size_t kind = rng() % 4;
    size_t n = kind == 0 ? 1 + rng() % 16 : kind == 1 ? 1 + rng() % 5000 : 1 + rng() % (3u << 20);
    n = std::min(n, data.size() - pos);
    FP_RETURN_IF_ERROR(w.write(data.data() + pos, n));
    pos += n;
  }
  return Status::ok();
}

struct WriterCase {
  size_t size;
  size_t io_buffer;
  bool single;
  Backend backend;
};

class FastFileWriterMatrix : public ::testing::TestWithParam<WriterCase> {};

TEST_P(FastFileWriterMatrix, FileEqualsStream) {
  const WriterCase c = GetParam();
  if (auto why = testing::backend_skip_reason(c.backend)) GTEST_SKIP() << *why;
  TempDir dir;
  auto data = testing::random_bytes(c.size, c.size + c.io_buffer);
  EngineOptions eo;
  eo.backend = c.backend;
  auto engine = IoEngine::create(eo);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  std::shared_ptr<IoEngine> shared = std::move(engine).value();
  FastFileWriterOptions o;
  o.io_buffer_bytes = c.io_buffer;
  o.single_io_buffer = c.single;
  auto w = FastFileWriter::open(dir.file("ckpt.pt"), o, shared);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  ASSERT_TRUE(write_chunked(**w, data, static_cast<unsigned>(c.size)).is_ok());
  EXPECT_FALSE(testing::file_size(dir.file("ckpt.pt")).is_ok()) << "target exists before close";
  Status st = (*w)->close();
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_TRUE((*w)->committed());
  auto back = testing::read_whole_file(dir.file("ckpt.pt"));
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ("", testing::first_difference(data, *back));
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"ckpt.pt"});  // no temporaries left
  FastFileWriterStats s = (*w)->stats();
  EXPECT_EQ(s.bytes, c.size);
  EXPECT_EQ(s.persisted_bytes, c.size);
  EXPECT_LE(s.pinned_bytes, c.io_buffer + 4096);
}

std::vector<WriterCase> writer_cases() {
  std::vector<WriterCase> out;
  for (Backend b : {Backend::kIoUring, Backend::kLibaio, Backend::kThreads}) {
    for (size_t size : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{(1 << 20) + 7},
                        size_t{(9 << 20) + 513}}) {
      out.push_back({size, size_t{64} << 10, false, b});  // tiny buffer: many drains
      out.push_back({size, size_t{64} << 20, false, b});
      out.push_back({size, size_t{1} << 20, true, b});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, FastFileWriterMatrix, ::testing::ValuesIn(writer_cases()),
                         [](const auto& param_info) {
                           const WriterCase& c = param_info.param;
                           return std::string(backend_name(c.backend)) + "_" +
                                  std::to_string(c.size) + "_buf" + std::to_string(c.io_buffer) +
                                  (c.single ? "_single" : "_double");
                         });

TEST(FastFileWriter, AlignedSourceGoesZeroCopy) {
  TempDir dir;
  testing::TestBuffer buf((16 << 20) + 100, 0);
  testing::fill_random(buf.span(), 5);
  FastFileWriterOptions o;
  o.io_buffer_bytes = 4 << 20;
  auto w = FastFileWriter::open(dir.file("z"), o);
  ASSERT_TRUE(w.is_ok());
  ASSERT_TRUE((*w)->write(buf.data(), buf.size()).is_ok());
  ASSERT_TRUE((*w)->close().is_ok());
  EXPECT_EQ((*w)->stats().zero_copy_bytes, size_t{16} << 20);
  EXPECT_EQ((*w)->stats().fill_bytes, 100u);
  auto back = testing::read_whole_file(dir.file("z"));
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ("", testing::first_difference(buf.span(), *back));
}

// torch.save writes small records, pads to a 4096-aligned offset, then a storage: an aligned
// storage must still go zero-copy although the staging half holds the records (they are sent
// first as a partial, aligned write). Before, a partly filled half made the whole storage go
// through the copy.
TEST(FastFileWriter, AlignedSourceAfterStagedBytesGoesZeroCopy) {
  TempDir dir;
  std::vector<std::byte> records(4096);
  testing::fill_random(records, 7);
  testing::TestBuffer storage(size_t{4} << 20, 0);
  testing::fill_random(storage.span(), 8);
  testing::TestBuffer tail(100, 1);  // unaligned: copied
  testing::fill_random(tail.span(), 9);
  FastFileWriterOptions o;  // 64 MiB of staging: the records alone never fill a half
  auto w = FastFileWriter::open(dir.file("t"), o);
  ASSERT_TRUE(w.is_ok());
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE((*w)->write(records.data(), 1000).is_ok());
    ASSERT_TRUE((*w)->write(records.data() + 1000, records.size() - 1000).is_ok());
    ASSERT_TRUE((*w)->write(storage.data(), storage.size()).is_ok());
  }
  ASSERT_TRUE((*w)->write(tail.data(), tail.size()).is_ok());
  ASSERT_TRUE((*w)->close().is_ok());
  EXPECT_EQ((*w)->stats().zero_copy_bytes, size_t{12} << 20);
  EXPECT_EQ((*w)->stats().fill_bytes, 3 * records.size() + tail.size());
  auto back = testing::read_whole_file(dir.file("t"));
  ASSERT_TRUE(back.is_ok());
  std::vector<std::byte> want;
  for (int round = 0; round < 3; ++round) {
    want.insert(want.end(), records.begin(), records.end());
    want.insert(want.end(), storage.data(), storage.data() + storage.size());
  }
  want.insert(want.end(), tail.data(), tail.data() + tail.size());
  EXPECT_EQ("", testing::first_difference(want, *back));
}

TEST(FastFileWriter, MisalignedSourceIsCopiedAndStillCorrect) {
  TempDir dir;
  testing::TestBuffer buf(8 << 20, 1);
  testing::fill_random(buf.span(), 6);
  auto w = FastFileWriter::open(dir.file("m"), {});
  ASSERT_TRUE(w.is_ok());
  ASSERT_TRUE((*w)->write(buf.data(), buf.size()).is_ok());
  ASSERT_TRUE((*w)->close().is_ok());
  EXPECT_EQ((*w)->stats().zero_copy_bytes, 0u);
  auto back = testing::read_whole_file(dir.file("m"));
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ("", testing::first_difference(buf.span(), *back));
}

TEST(FastFileWriter, ReplacesAnExistingTargetOnlyAtClose) {
  TempDir dir;
  auto old_bytes = testing::random_bytes(3 << 20, 1);
  ASSERT_TRUE(testing::write_whole_file(dir.file("t"), old_bytes).is_ok());
  auto fresh = testing::random_bytes(1000, 2);
  auto w = FastFileWriter::open(dir.file("t"), {});
  ASSERT_TRUE(w.is_ok());
  ASSERT_TRUE((*w)->write(fresh.data(), fresh.size()).is_ok());
  auto mid = testing::read_whole_file(dir.file("t"));
  ASSERT_TRUE(mid.is_ok());
  EXPECT_EQ("", testing::first_difference(old_bytes, *mid));  // old file untouched until close
  ASSERT_TRUE((*w)->close().is_ok());
  auto back = testing::read_whole_file(dir.file("t"));
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ("", testing::first_difference(fresh, *back));
}

TEST(FastFileWriter, AbortAndDestructionLeaveNothing) {
  TempDir dir;
  auto data = testing::random_bytes(5 << 20, 3);
  {
    auto w = FastFileWriter::open(dir.file("a"), {});
    ASSERT_TRUE(w.is_ok());
    ASSERT_TRUE((*w)->write(data.data(), data.size()).is_ok());
    (*w)->abort();
    (*w)->abort();  // idempotent
    EXPECT_FALSE((*w)->write(data.data(), 1).is_ok());
    EXPECT_FALSE((*w)->close().is_ok());
  }
  {
    auto w = FastFileWriter::open(dir.file("b"), {});
    ASSERT_TRUE(w.is_ok());
    ASSERT_TRUE((*w)->write(data.data(), data.size()).is_ok());
  }  // destroyed without close
  EXPECT_TRUE(list_dir(dir.path()).empty());
}

TEST(FastFileWriter, BadArgumentsAreClearErrors) {
  TempDir dir;
  FastFileWriterOptions o;
  o.io_buffer_bytes = 100;
  EXPECT_EQ(FastFileWriter::open(dir.file("x"), o).status().code(), StatusCode::kInvalidArgument);
  o = {};
  o.num_writers = 2;
  o.writer_rank = 2;
  EXPECT_EQ(FastFileWriter::open(dir.file("x"), o).status().code(), StatusCode::kInvalidArgument);
  o.writer_rank = 0;
  o.stripe_bytes = 1000;
  EXPECT_EQ(FastFileWriter::open(dir.file("x"), o).status().code(), StatusCode::kInvalidArgument);
  auto missing = FastFileWriter::open(dir.file("no/dir/x"), {});
  EXPECT_EQ(missing.status().sys_errno(), ENOENT);
  auto is_dir = FastFileWriter::open(dir.path(), {});
  EXPECT_FALSE(is_dir.is_ok());
}

// N writers each see the whole stream and persist their stripes; the result is one file.
void run_parallel_writers(const std::string& path, std::span<const std::byte> data, unsigned n,
                          size_t stripe, std::vector<Status>* results,
                          std::vector<char>* committed) {
  results->assign(n, Status());
  // char, not bool: std::vector<bool> packs the flags into shared words, so writer threads
  // setting their own flags would race.
  committed->assign(n, 0);
  std::vector<std::thread> threads;
  for (unsigned r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      FastFileWriterOptions o;
      o.num_writers = n;
      o.writer_rank = r;
      o.stripe_bytes = stripe;
      o.io_buffer_bytes = 1 << 20;
      auto w = FastFileWriter::open(path, o);
      if (!w.is_ok()) {
        (*results)[r] = w.status();
        return;
      }
      Status st = write_chunked(**w, data, 77);  // the same chunking as the other writers
      if (st.is_ok()) st = (*w)->close();
      (*results)[r] = st;
      (*committed)[r] = (*w)->committed();
    });
  }
  for (auto& t : threads) t.join();
}

TEST(FastFileWriterParallel, ThreadsProduceTheSingleWritersFile) {
  auto data = testing::random_bytes((13 << 20) + 4097, 11);
  for (unsigned n : {1u, 2u, 3u, 8u}) {
    TempDir dir;
    std::vector<Status> results;
    std::vector<char> committed;
    run_parallel_writers(dir.file("p.pt"), data, n, 1 << 20, &results, &committed);
    int commits = 0;
    for (unsigned r = 0; r < n; ++r) {
      ASSERT_TRUE(results[r].is_ok()) << "writer " << r << ": " << results[r].to_string();
      commits += committed[r] ? 1 : 0;
    }
    EXPECT_EQ(commits, 1) << n << " writers";
    auto back = testing::read_whole_file(dir.file("p.pt"));
    ASSERT_TRUE(back.is_ok());
    EXPECT_EQ("", testing::first_difference(data, *back)) << n << " writers";
    EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"p.pt"});
  }
}

TEST(FastFileWriterParallel, ProcessesProduceTheSingleWritersFile) {
  TempDir dir;
  auto data = testing::random_bytes((7 << 20) + 3, 12);
  const unsigned n = 3;
  std::vector<pid_t> pids;
  for (unsigned r = 0; r < n; ++r) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      FastFileWriterOptions o;
      o.num_writers = n;
      o.writer_rank = r;
      o.stripe_bytes = 512 << 10;
      auto w = FastFileWriter::open(dir.file("proc.pt"), o);
      if (!w.is_ok()) _exit(2);
      if (!write_chunked(**w, data, 5).is_ok()) _exit(3);
      _exit((*w)->close().is_ok() ? 0 : 4);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
  auto back = testing::read_whole_file(dir.file("proc.pt"));
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ("", testing::first_difference(data, *back));
}

TEST(FastFileWriterParallel, UntilTheLastWriterClosesThereIsNoFile) {
  TempDir dir;
  auto data = testing::random_bytes(3 << 20, 13);
  FastFileWriterOptions o;
  o.num_writers = 2;
  o.stripe_bytes = 1 << 20;
  auto w0 = FastFileWriter::open(dir.file("late.pt"), o);
  o.writer_rank = 1;
  auto w1 = FastFileWriter::open(dir.file("late.pt"), o);
  ASSERT_TRUE(w0.is_ok() && w1.is_ok());
  ASSERT_TRUE((*w0)->write(data.data(), data.size()).is_ok());
  ASSERT_TRUE((*w1)->write(data.data(), data.size()).is_ok());
  ASSERT_TRUE((*w0)->close().is_ok());
  EXPECT_FALSE((*w0)->committed());
  EXPECT_FALSE(testing::file_size(dir.file("late.pt")).is_ok());
  ASSERT_TRUE((*w1)->close().is_ok());
  EXPECT_TRUE((*w1)->committed());
  auto back = testing::read_whole_file(dir.file("late.pt"));
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ("", testing::first_difference(data, *back));
}

TEST(FastFileWriter, EnospcIsAClearErrorAndLeavesNoFile) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a small ext4 image needs root";
  TempDir dir;
  std::string mnt = dir.file("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  auto m = testing::ScopedMount::ext4_image(dir.file("img"), mnt, 16 << 20);
  if (!m.is_ok()) GTEST_SKIP() << "cannot mount an ext4 image: " << m.status().to_string();
  auto data = testing::random_bytes(32 << 20, 14);
  auto w = FastFileWriter::open(mnt + "/big.pt", {});
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  Status st = write_chunked(**w, data, 3);
  Status closed = (*w)->close();  // after a failed write, close reports the same error
  if (st.is_ok()) st = closed;
  ASSERT_FALSE(st.is_ok());
  ASSERT_FALSE(closed.is_ok());
  EXPECT_EQ(st.sys_errno(), ENOSPC) << st.to_string();
  EXPECT_EQ(closed.sys_errno(), ENOSPC) << closed.to_string();
  auto names = list_dir(mnt);
  std::erase(names, "lost+found");
  EXPECT_TRUE(names.empty()) << names.size() << " entries left, first: " << names[0];
}

off_t size_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

// The temporary file grows by fallocate() well ahead of the writes (so no drain extends it and
// waits for the direct I/O in flight), and close() cuts it to the stream's exact size.
TEST(FastFileWriter, PreallocatesAheadAndTruncatesAtClose) {
  TempDir dir;
  auto data = testing::random_bytes((3 << 20) + 123, 21);
  FastFileWriterOptions o;
  o.io_buffer_bytes = 1 << 20;
  auto w = FastFileWriter::open(dir.file("p"), o);
  ASSERT_TRUE(w.is_ok());
  ASSERT_TRUE((*w)->write(data.data(), data.size()).is_ok());
  off_t during = size_of((*w)->temp_path());
  if (during == static_cast<off_t>(data.size()) || during < 0) {
    GTEST_SKIP() << "this filesystem does not support fallocate";
  }
  EXPECT_GE(during, off_t{256} << 20) << "the first step covers 256 MiB";
  ASSERT_TRUE((*w)->close().is_ok());
  EXPECT_EQ(size_of(dir.file("p")), static_cast<off_t>(data.size()));
  auto back = testing::read_whole_file(dir.file("p"));
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ("", testing::first_difference(data, *back));
}

TEST(FastFileWriter, PreallocationCanBeTurnedOff) {
  TempDir dir;
  auto data = testing::random_bytes(3 << 20, 22);
  FastFileWriterOptions o;
  o.io_buffer_bytes = 1 << 20;
  o.preallocate_max_bytes = 0;
  auto w = FastFileWriter::open(dir.file("n"), o);
  ASSERT_TRUE(w.is_ok());
  ASSERT_TRUE((*w)->write(data.data(), data.size()).is_ok());
  EXPECT_LE(size_of((*w)->temp_path()), static_cast<off_t>(data.size()));
  ASSERT_TRUE((*w)->close().is_ok());
  EXPECT_EQ(size_of(dir.file("n")), static_cast<off_t>(data.size()));
}

// On a filesystem smaller than the first preallocation step, fallocate fails with ENOSPC; the
// writer must then carry on without preallocating, so a file that fits is still written.
TEST(FastFileWriter, FailedPreallocationDoesNotFailAFileThatFits) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a small ext4 image needs root";
  TempDir dir;
  std::string mnt = dir.file("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  auto m = testing::ScopedMount::ext4_image(dir.file("img"), mnt, 32 << 20);
  if (!m.is_ok()) GTEST_SKIP() << "cannot mount an ext4 image: " << m.status().to_string();
  auto data = testing::random_bytes((8 << 20) + 777, 23);
  FastFileWriterOptions o;
  o.io_buffer_bytes = 2 << 20;
  auto w = FastFileWriter::open(mnt + "/fits.pt", o);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  ASSERT_TRUE(write_chunked(**w, data, 4).is_ok());
  Status closed = (*w)->close();
  ASSERT_TRUE(closed.is_ok()) << closed.to_string();
  auto back = testing::read_whole_file(mnt + "/fits.pt");
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ("", testing::first_difference(data, *back));
}

}  // namespace
}  // namespace fastpersist
