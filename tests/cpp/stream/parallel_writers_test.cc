// SPDX-License-Identifier: Apache-2.0
// Parallel writers that do not complete their set: an abort, a new attempt racing an aborted
// one, writers that serialized different bytes, a missing or crashed writer. None of them may
// fail silently (with a commit timeout) or commit the wrong file, and the last one out leaves
// no bookkeeping files behind.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fastpersist/fast_file_writer.h"
#include "stream/parallel_records.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"

namespace fastpersist {
namespace {

using testing::list_dir;
using testing::TempDir;
using Clock = std::chrono::steady_clock;
using Writer = std::unique_ptr<FastFileWriter>;

constexpr size_t kStripe = 256 << 10;

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Bounded polling for a state another thread or process reaches.
bool wait_until(const std::function<bool()>& reached, std::chrono::seconds limit) {
  auto deadline = Clock::now() + limit;
  while (!reached()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

Result<Writer> open_writer(const std::string& path, unsigned n, unsigned rank, double timeout = 0) {
  FastFileWriterOptions o;
  o.num_writers = n;
  o.writer_rank = rank;
  o.stripe_bytes = kStripe;
  o.io_buffer_bytes = 1 << 20;
  o.commit_timeout_seconds = timeout;
  return FastFileWriter::open(path, o);
}

// Opens writers 0..n-1 of `path` and has each write all of `data`.
std::vector<Writer> open_and_write(const std::string& path, unsigned n,
                                   const std::vector<std::byte>& data, double timeout = 0) {
  std::vector<Writer> out;
  for (unsigned r = 0; r < n; ++r) {
    auto w = open_writer(path, n, r, timeout);
    EXPECT_TRUE(w.is_ok()) << w.status().to_string();
    if (!w.is_ok()) return {};
    Status st = (*w)->write(data.data(), data.size());
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    out.push_back(std::move(*w));
  }
  return out;
}

struct CloseOutcome {
  Status status;
  double seconds = 0;
  bool committed = false;
  bool file_committed = false;
};

// Closes `writers` concurrently, one thread each.
std::vector<CloseOutcome> close_concurrently(const std::vector<FastFileWriter*>& writers) {
  std::vector<CloseOutcome> out(writers.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < writers.size(); ++i) {
    threads.emplace_back([&, i] {
      auto t0 = Clock::now();
      out[i].status = writers[i]->close();
      out[i].seconds = seconds_since(t0);
      out[i].committed = writers[i]->committed();
      out[i].file_committed = writers[i]->file_committed();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

void expect_aborted_error(const Status& st, const std::string& target) {
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.to_string();
  EXPECT_EQ(st.sys_errno(), ECANCELED) << st.to_string();
  EXPECT_NE(st.message().find("another writer of this file aborted"), std::string::npos)
      << st.to_string();
  EXPECT_NE(st.message().find("nothing was committed"), std::string::npos) << st.to_string();
  EXPECT_EQ(st.path(), target);
}

void expect_timeout_error(const Status& st, const std::string& target) {
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.to_string();
  EXPECT_EQ(st.sys_errno(), ETIMEDOUT) << st.to_string();
  EXPECT_NE(st.message().find("did not commit the file within"), std::string::npos)
      << st.to_string();
  EXPECT_EQ(st.path(), target);
}

bool contains(const Status& st, const std::string& text) {
  return st.message().find(text) != std::string::npos;
}

TEST(FastFileWriterParallel, CommitTimeoutMustBeFiniteAndNotNegative) {
  TempDir dir;
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    auto w = open_writer(dir.file("x"), 2, 0, bad);
    EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

// Regression: abort() unlinked the shared temporary without the lock, and the others' closes
// succeeded (recording into a dead file). Now they fail, with or without a commit timeout, and
// nothing is left behind.
TEST(FastFileWriterParallel, AbortFailsTheOtherClosesAndLeavesNothing) {
  for (double timeout : {0.0, 30.0}) {
    TempDir dir;
    const std::string target = dir.file("a.pt");
    auto data = testing::random_bytes((3 << 20) + 123, 31);
    std::vector<Writer> w = open_and_write(target, 3, data, timeout);
    ASSERT_EQ(w.size(), 3u);
    w[1]->abort();
    for (unsigned r : {0u, 2u}) {
      auto t0 = Clock::now();
      Status st = w[r]->close();
      expect_aborted_error(st, target);
      EXPECT_LT(seconds_since(t0), 5.0) << "timeout " << timeout << ": an abort is final";
      EXPECT_FALSE(w[r]->committed());
      EXPECT_FALSE(w[r]->file_committed());
    }
    EXPECT_FALSE(exists(target));
    EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{}) << "timeout " << timeout;
  }
}

TEST(FastFileWriterParallel, AWaitingCloseNoticesAnAbort) {
  TempDir dir;
  const std::string target = dir.file("w.pt");
  auto data = testing::random_bytes((2 << 20) + 5, 32);
  std::vector<Writer> w = open_and_write(target, 3, data, 60);
  ASSERT_EQ(w.size(), 3u);
  Status waited;
  std::atomic<bool> returned{false};
  std::thread closer([&] {
    waited = w[0]->close();
    returned = true;
  });
  // Rank 0 has recorded its stripes and waits for ranks 1 and 2.
  ASSERT_TRUE(
      wait_until([&] { return exists(w[0]->temp_path() + ".done"); }, std::chrono::seconds(30)));
  auto t0 = Clock::now();
  w[1]->abort();
  closer.join();
  EXPECT_LT(seconds_since(t0), 5.0) << "the waiting close must not sit out its 60 s timeout";
  expect_aborted_error(waited, target);
  expect_aborted_error(w[2]->close(), target);
  EXPECT_FALSE(exists(target));
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{});
}

// Attempt A loses a writer to abort() while attempt B already writes a new shared temporary at
// the same path. A's remaining closes must fail, and B must commit exactly B's bytes. With a
// record left by a crashed earlier attempt of A's aborted rank (same inode, same bytes), A's
// last close completed its set; before the fix it renamed B's unfinished file onto the target.
void abort_then_new_attempt(bool stale_record_of_the_aborted_rank) {
  TempDir dir;
  const std::string target = dir.file("race.pt");
  auto bytes_a = testing::random_bytes((3 << 20) + 77, 33);
  auto bytes_b = testing::random_bytes((3 << 20) + 77, 34);
  if (stale_record_of_the_aborted_rank) {
    // An earlier attempt of which only rank 1 closed before the job died: its record (this
    // shared temporary's inode, the digest of bytes_a) stays, and so does the temporary.
    auto early = open_writer(target, 3, 1);
    ASSERT_TRUE(early.is_ok());
    FP_ASSERT_OK((*early)->write(bytes_a.data(), bytes_a.size()));
    FP_ASSERT_OK((*early)->close());
    ASSERT_TRUE(exists((*early)->temp_path() + ".done"));
  }
  std::vector<Writer> a = open_and_write(target, 3, bytes_a);
  ASSERT_EQ(a.size(), 3u);
  a[1]->abort();
  std::vector<Writer> b = open_and_write(target, 3, bytes_b);  // a new shared temporary
  ASSERT_EQ(b.size(), 3u);
  expect_aborted_error(a[0]->close(), target);
  expect_aborted_error(a[2]->close(), target);
  EXPECT_FALSE(exists(target)) << "attempt A committed something";
  for (unsigned r = 0; r < 3; ++r) {
    FP_EXPECT_OK(b[r]->close());
    EXPECT_EQ(b[r]->committed(), r == 2);
  }
  auto back = testing::read_whole_file(target);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ("", testing::first_difference(bytes_b, *back));
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"race.pt"});
}

TEST(FastFileWriterParallel, AbortThenNewAttemptCommitsOnlyTheNewBytes) {
  abort_then_new_attempt(false);
}

TEST(FastFileWriterParallel, AbortThenNewAttemptIgnoresAStaleRecordOfTheAbortedRank) {
  abort_then_new_attempt(true);
}

TEST(FastFileWriterParallel, ConcurrentClosesWithATimeoutAllSeeTheCommit) {
  auto data = testing::random_bytes((5 << 20) + 4097, 35);
  for (unsigned n : {2u, 3u, 8u}) {
    TempDir dir;
    const std::string target = dir.file("c.pt");
    std::vector<Writer> w = open_and_write(target, n, data, 30);
    ASSERT_EQ(w.size(), n);
    std::vector<FastFileWriter*> raw;
    for (auto& x : w) raw.push_back(x.get());
    std::vector<CloseOutcome> out = close_concurrently(raw);
    int commits = 0;
    for (unsigned r = 0; r < n; ++r) {
      EXPECT_TRUE(out[r].status.is_ok()) << "rank " << r << ": " << out[r].status.to_string();
      EXPECT_TRUE(out[r].file_committed) << "rank " << r;
      EXPECT_LT(out[r].seconds, 20.0) << "rank " << r << " waited (nearly) its whole timeout";
      commits += out[r].committed ? 1 : 0;
    }
    EXPECT_EQ(commits, 1) << n << " writers";
    auto back = testing::read_whole_file(target);
    ASSERT_TRUE(back.is_ok());
    EXPECT_EQ("", testing::first_difference(data, *back));
    EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"c.pt"});
  }
}

// Regression: a timeout too long for the clock (1e300 s, a "wait forever") overflowed when it was
// converted to clock ticks (undefined; on x86 a deadline in the past), so the first close timed
// out at once instead of waiting for the other writer.
TEST(FastFileWriterParallel, AHugeCommitTimeoutWaitsForTheOtherWriters) {
  auto data = testing::random_bytes((1 << 20) + 5, 38);
  for (double timeout : {1e10, 1e300, std::numeric_limits<double>::max()}) {
    TempDir dir;
    const std::string target = dir.file("h.pt");
    std::vector<Writer> w = open_and_write(target, 2, data, timeout);
    ASSERT_EQ(w.size(), 2u);
    CloseOutcome first;
    std::thread waiter([&] {
      first.status = w[0]->close();
      first.file_committed = w[0]->file_committed();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 0 is waiting now
    FP_EXPECT_OK(w[1]->close());
    waiter.join();
    EXPECT_TRUE(first.status.is_ok()) << timeout << ": " << first.status.to_string();
    EXPECT_TRUE(first.file_committed) << timeout;
    auto back = testing::read_whole_file(target);
    ASSERT_TRUE(back.is_ok());
    EXPECT_EQ("", testing::first_difference(data, *back));
    EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"h.pt"});
  }
}

// Writers that serialized different bytes (a non-deterministic stream) never commit; with a
// timeout every close says so, naming the ranks, and the last one out removes everything.
TEST(FastFileWriterParallel, DifferentBytesTimeOutNamingTheRanks) {
  TempDir dir;
  const std::string target = dir.file("d.pt");
  auto data = testing::random_bytes((2 << 20) + 11, 36);
  auto flipped = data;
  flipped[12345] ^= std::byte{1};
  auto longer = data;
  longer.push_back(std::byte{7});
  const double timeout = 1.0;
  std::vector<Writer> w;
  for (const auto* bytes : {&data, &flipped, &longer}) {
    auto x = open_writer(target, 3, static_cast<unsigned>(w.size()), timeout);
    ASSERT_TRUE(x.is_ok());
    FP_ASSERT_OK((*x)->write(bytes->data(), bytes->size()));
    w.push_back(std::move(*x));
  }
  std::vector<CloseOutcome> out = close_concurrently({w[0].get(), w[1].get(), w[2].get()});
  for (unsigned r = 0; r < 3; ++r) {
    const Status& st = out[r].status;
    expect_timeout_error(st, target);
    EXPECT_GE(out[r].seconds, timeout * 0.9) << "rank " << r;
    EXPECT_LT(out[r].seconds, timeout + 4.0) << "rank " << r;
    EXPECT_TRUE(contains(st, "this writer is rank " + std::to_string(r) + " of 3 ("))
        << st.to_string();
    EXPECT_FALSE(contains(st, "closed with the same stream")) << st.to_string();
    for (unsigned other = 0; other < 3; ++other) {
      if (other == r) continue;
      EXPECT_TRUE(contains(st, "rank " + std::to_string(other) + " closed with a different stream"))
          << st.to_string();
    }
    EXPECT_TRUE(contains(st, "serialized different bytes")) << st.to_string();
    EXPECT_FALSE(w[r]->committed() || w[r]->file_committed());
  }
  EXPECT_FALSE(exists(target));
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{}) << "the last writer out cleans up";
}

// A writer that is still running but never closes: the waiting closes time out naming it and
// leave the shared temporary to it (it is live), so its late close still commits the file.
TEST(FastFileWriterParallel, AMissingRankTimesOutAndItsLateCloseStillCommits) {
  TempDir dir;
  const std::string target = dir.file("m.pt");
  auto data = testing::random_bytes((2 << 20) + 99, 37);
  std::vector<Writer> w = open_and_write(target, 3, data, 1.0);
  ASSERT_EQ(w.size(), 3u);
  std::vector<CloseOutcome> out = close_concurrently({w[0].get(), w[1].get()});
  for (unsigned r = 0; r < 2; ++r) {
    expect_timeout_error(out[r].status, target);
    EXPECT_LT(out[r].seconds, 5.0);
    EXPECT_TRUE(contains(out[r].status, "this writer is rank " + std::to_string(r) + " of 3"))
        << out[r].status.to_string();
    EXPECT_TRUE(
        contains(out[r].status, "rank " + std::to_string(1 - r) + " closed with the same stream"))
        << out[r].status.to_string();
    EXPECT_TRUE(contains(out[r].status, "rank 2 has not closed")) << out[r].status.to_string();
    EXPECT_TRUE(contains(out[r].status, "other writers still have")) << out[r].status.to_string();
  }
  EXPECT_FALSE(exists(target));
  FP_ASSERT_OK(w[2]->close());
  EXPECT_TRUE(w[2]->committed());
  auto back = testing::read_whole_file(target);
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ("", testing::first_difference(data, *back));
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"m.pt"});
}

// A writer process that dies before its close holds nothing any more: the others time out
// naming it, and the last of them removes the shared temporary and the records.
TEST(FastFileWriterParallel, ACrashedRankTimesOutAndTheLastWaiterCleansUp) {
  TempDir dir;
  const std::string target = dir.file("k.pt");
  auto data = testing::random_bytes((2 << 20) + 3, 38);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto w = open_writer(target, 3, 2);
    if (!w.is_ok() || !(*w)->write(data.data(), data.size()).is_ok()) _exit(2);
    _exit(0);  // crash: no close(), no abort()
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::vector<Writer> w;
  for (unsigned r = 0; r < 2; ++r) {
    auto x = open_writer(target, 3, r, 0.5);
    ASSERT_TRUE(x.is_ok());
    FP_ASSERT_OK((*x)->write(data.data(), data.size()));
    w.push_back(std::move(*x));
  }
  std::vector<CloseOutcome> out = close_concurrently({w[0].get(), w[1].get()});
  int cleaned = 0;
  for (unsigned r = 0; r < 2; ++r) {
    expect_timeout_error(out[r].status, target);
    EXPECT_TRUE(contains(out[r].status, "rank 2 has not closed")) << out[r].status.to_string();
    cleaned += contains(out[r].status, "it and the records were removed") ? 1 : 0;
  }
  EXPECT_EQ(cleaned, 1) << "exactly the last writer out removes the files";
  EXPECT_FALSE(exists(target));
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{});
}

TEST(ParallelRecords, DescribeNamesSameDifferentAndMissingRanks) {
  using stream::DoneRecord;
  const DoneRecord mine{0, 100, 0xabc, 7, 4, 4096};
  std::vector<DoneRecord> records = {
      {1, 100, 0xabc, 7, 4, 4096},  // same stream
      {2, 100, 0xdef, 7, 4, 4096},  // different bytes
      {3, 100, 0xabc, 9, 4, 4096},  // another inode: not this attempt
  };
  std::string text = stream::describe_incomplete_set(records, mine);
  EXPECT_NE(text.find("this writer is rank 0 of 4 (100 bytes, digest 0000000000000abc); rank 1 "
                      "closed with the same stream;"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("rank 2 closed with a different stream (100 bytes, digest 0000000000000def)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("serialized different bytes"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 3 has not closed"), std::string::npos) << text;

  records = {{1, 100, 0xabc, 7, 2, 8192}};
  text = stream::describe_incomplete_set(records, mine);
  EXPECT_EQ(text.find("closed with the same stream"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1 closed as one of 2 writers, 8192-byte stripes (this writer: 4 "
                      "writers, 4096-byte stripes)"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("serialized different bytes"), std::string::npos) << text;
  EXPECT_NE(text.find("ranks 2, 3 have not closed"), std::string::npos) << text;
}

TEST(ParallelRecords, ARanksNewRecordReplacesItsStaleOne) {
  using stream::DoneRecord;
  const DoneRecord mine{1, 100, 0xabc, 7, 2, 4096};
  std::vector<DoneRecord> records = {
      {0, 100, 0xabc, 7, 2, 4096},
      {1, 100, 0x111, 7, 2, 4096},  // rank 1's record of a crashed attempt on the same file
      {1, 100, 0xabc, 5, 2, 4096},  // another inode
  };
  std::vector<DoneRecord> merged = stream::with_record(records, mine);
  ASSERT_EQ(merged.size(), 2u);
  EXPECT_EQ(stream::matching_ranks(merged, mine), 2u);
  EXPECT_EQ(merged[1].digest, 0xabcu);
  EXPECT_EQ(stream::matching_ranks(records, mine), 1u);
}

}  // namespace
}  // namespace fastpersist
