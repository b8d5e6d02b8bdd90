// SPDX-License-Identifier: Apache-2.0
// The engine conformance suite, data half: round trips of awkward sizes at awkward offsets from
// awkward addresses, overwrites, concurrency, tickets and statistics, on every backend and
// configuration (see testing/engine_fixture.h). The error half is engine_errors_test.cc.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "fastpersist/io_engine.h"
#include "testing/engine_fixture.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"
#include "testing/watchdog.h"

namespace fastpersist::testing {
namespace {

using std::chrono::seconds;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kSizes[] = {0, 1, 511, 512, 4095, 4096, kMiB + 7};
constexpr uint64_t kOffsets[] = {0, 512, 4097};

IoRequest request(IoKind kind, const std::string& path, std::byte* buffer, uint64_t length,
                  uint64_t offset = 0) {
  IoRequest r;
  r.kind = kind;
  r.path = path;
  r.buffer = buffer;
  r.length = length;
  r.file_offset = offset;
  return r;
}

std::string name_of(uint64_t size, uint64_t offset, size_t misalign) {
  return "rt-" + std::to_string(size) + "-" + std::to_string(offset) + "-" +
         std::to_string(misalign);
}

TEST_P(EngineTest, RoundTripsEverySizeAtEveryOffset) {
  uint64_t requests = 0;
  for (uint64_t size : kSizes) {
    for (uint64_t offset : kOffsets) {
      for (size_t misalign : {0, 1}) {
        check_round_trip(dir_.file(name_of(size, offset, misalign)), size, offset, misalign);
        if (HasFatalFailure()) return;
        requests += size == 0 && offset > 0 ? 1 : 2;  // an empty file has nothing at the offset
      }
    }
  }
  // Successful transfers are counted exactly once, either as O_DIRECT or as page-cache bytes.
  IoStats s = engine_->stats();
  EXPECT_EQ(s.bytes_written, s.bytes_read) << "every byte written was read back once";
  EXPECT_EQ(s.direct_bytes + s.buffered_bytes, s.bytes_written + s.bytes_read);
  EXPECT_EQ(s.requests, requests);
  if (GetParam().short_transfers) {
    EXPECT_GT(s.short_transfers, 0u);
  }
  if (direct_expected()) {
    EXPECT_GT(s.direct_bytes, 0u);
  } else {
    EXPECT_EQ(s.direct_bytes, 0u);
  }
}

TEST_P(EngineTest, MisalignedBuffersBounceOnlyForODirect) {
  TestBuffer aligned(kMiB, 0);
  fill_random(aligned.span(), 1);
  FP_ASSERT_OK(write_at(dir_.file("aligned"), aligned.data(), kMiB, 0));
  FP_ASSERT_OK(read_at(dir_.file("aligned"), aligned.data(), kMiB, 0));
  EXPECT_EQ(engine_->stats().bounce_bytes, 0u) << "page-aligned memory needs no bounce buffer";

  TestBuffer misaligned(kMiB, 1);
  fill_random(misaligned.span(), 2);
  FP_ASSERT_OK(write_at(dir_.file("misaligned"), misaligned.data(), kMiB, 0));
  TestBuffer back(kMiB, 1);
  FP_ASSERT_OK(read_at(dir_.file("misaligned"), back.data(), kMiB, 0));
  EXPECT_EQ("", first_difference(misaligned.span(), back.span()));
  IoStats s = engine_->stats();
  if (direct_expected()) {
    // The whole megabyte is one aligned body, moved twice through bounce memory.
    EXPECT_EQ(s.bounce_bytes, 2 * kMiB);
    // (A short O_DIRECT transfer that stops at an unaligned point finishes through the cache.)
    if (!GetParam().short_transfers) {
      EXPECT_EQ(s.direct_bytes, 4 * kMiB);
    }
    EXPECT_EQ(s.direct_bytes + s.buffered_bytes, 4 * kMiB);
  } else {
    EXPECT_EQ(s.bounce_bytes, 0u);
    EXPECT_EQ(s.buffered_bytes, 4 * kMiB);
  }
}

TEST_P(EngineTest, TruncatingWriteOfALongerFileLeavesNoStaleTail) {
  for (uint64_t size : {uint64_t{0}, uint64_t{1}, uint64_t{4095}, uint64_t{4097}, kMiB + 7}) {
    SCOPED_TRACE("new size " + std::to_string(size));
    std::string path = dir_.file("overwrite-" + std::to_string(size));
    FP_ASSERT_OK(write_whole_file(path, random_bytes(2 * kMiB + 5, 9)));
    std::vector<std::byte> fresh = random_bytes(size, size);
    FP_ASSERT_OK(write_at(path, fresh.data(), size, 0, /*truncate=*/true));
    FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> on_disk, read_whole_file(path));
    EXPECT_EQ("", first_difference(fresh, on_disk));
  }
  // The same when the longer file was itself written by the engine.
  std::string path = dir_.file("engine-longer");
  std::vector<std::byte> longer = random_bytes(3 * kMiB, 3);
  FP_ASSERT_OK(write_at(path, longer.data(), longer.size(), 0));
  std::vector<std::byte> shorter = random_bytes(kMiB + 1, 4);
  FP_ASSERT_OK(write_at(path, shorter.data(), shorter.size(), 0, /*truncate=*/true));
  FP_ASSERT_OK_AND_ASSIGN(uint64_t size, file_size(path));
  EXPECT_EQ(size, shorter.size());
}

// Regression: a write by path at offset 0 used to open with O_TRUNC and destroy what other
// requests had written to the rest of the file.
TEST_P(EngineTest, WriteAtOffsetZeroKeepsBytesOtherRequestsWrote) {
  std::string path = dir_.file("disjoint");
  std::vector<std::byte> content = random_bytes(4 * kMiB, 11);
  for (uint64_t i : {1, 2, 3, 0}) {  // offset 0 last, as in the report
    FP_ASSERT_OK(write_at(path, content.data() + i * kMiB, kMiB, i * kMiB));
  }
  FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> on_disk, read_whole_file(path));
  EXPECT_EQ("", first_difference(content, on_disk));
  // Submitted together, in any order, the ranges still make up the whole file.
  std::string batch = dir_.file("disjoint-batch");
  for (uint64_t i : {2, 0, 3, 1}) {
    FP_ASSERT_OK(
        engine_->submit(request(IoKind::kWrite, batch, content.data() + i * kMiB, kMiB, i * kMiB)));
  }
  FP_ASSERT_OK_AND_ASSIGN(size_t n, engine_->wait());
  EXPECT_EQ(n, 4u);
  FP_ASSERT_OK_AND_ASSIGN(on_disk, read_whole_file(batch));
  EXPECT_EQ("", first_difference(content, on_disk));
}

TEST_P(EngineTest, ShorterRewriteWithoutTruncateLeavesTheOldTail) {
  std::string path = dir_.file("rewrite");
  std::vector<std::byte> longer = random_bytes(2 * kMiB + 5, 12);
  FP_ASSERT_OK(write_at(path, longer.data(), longer.size(), 0));
  std::vector<std::byte> head = random_bytes(kMiB + 1, 13);
  FP_ASSERT_OK(write_at(path, head.data(), head.size(), 0));
  std::vector<std::byte> expected = longer;
  std::copy(head.begin(), head.end(), expected.begin());
  FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> on_disk, read_whole_file(path));
  EXPECT_EQ("", first_difference(expected, on_disk));
}

TEST_P(EngineTest, TruncateIsRefusedForReadsAndDescriptors) {
  std::string path = dir_.file("t");
  std::vector<std::byte> data = random_bytes(4096, 14);
  FP_ASSERT_OK(write_at(path, data.data(), data.size(), 0));
  IoRequest read = request(IoKind::kRead, path, data.data(), data.size());
  read.truncate = true;
  EXPECT_EQ(engine_->submit(read).status().code(), StatusCode::kInvalidArgument);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  IoRequest by_fd = request(IoKind::kWrite, "", data.data(), 100);
  by_fd.fd = fd;
  by_fd.truncate = true;
  EXPECT_EQ(engine_->submit(by_fd).status().code(), StatusCode::kInvalidArgument);
  ::close(fd);
  FP_ASSERT_OK_AND_ASSIGN(uint64_t size, file_size(path));
  EXPECT_EQ(size, data.size());
}

TEST_P(EngineTest, WritingAtAnOffsetPreservesTheOtherBytes) {
  std::string path = dir_.file("patched");
  std::vector<std::byte> expected = random_bytes((256 << 10) + 3, 5);
  FP_ASSERT_OK(write_whole_file(path, expected));
  struct Patch {
    uint64_t offset, length;
  };
  // Inside the file (unaligned and aligned), and one that extends it.
  for (Patch p : {Patch{4097, 10000}, Patch{65536 + 512, 100000}, Patch{8192, 65536},
                  Patch{expected.size() - 100, 5000}}) {
    SCOPED_TRACE("patch at " + std::to_string(p.offset));
    TestBuffer patch(p.length, p.offset % 2);
    fill_random(patch.span(), p.offset);
    FP_ASSERT_OK(write_at(path, patch.data(), p.length, p.offset));
    if (p.offset + p.length > expected.size()) expected.resize(p.offset + p.length);
    std::memcpy(expected.data() + p.offset, patch.data(), p.length);
    FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> on_disk, read_whole_file(path));
    ASSERT_EQ("", first_difference(expected, on_disk));
  }
}

TEST_P(EngineTest, ReadsAnyRangeOfAFile) {
  std::string path = dir_.file("source");
  std::vector<std::byte> content = random_bytes(3 * kMiB + 11, 6);
  FP_ASSERT_OK(write_whole_file(path, content));
  struct Range {
    uint64_t offset, length;
  };
  for (Range r :
       {Range{0, content.size()}, Range{1, kMiB}, Range{4096, 2 * kMiB}, Range{4097, kMiB + 7},
        Range{content.size() - 1, 1}, Range{content.size(), 0}, Range{kMiB - 3, 6}}) {
    for (size_t misalign : {0, 1}) {
      SCOPED_TRACE("range " + std::to_string(r.offset) + "+" + std::to_string(r.length));
      TestBuffer dst(r.length, misalign);
      FP_ASSERT_OK_AND_ASSIGN(uint64_t n, read_at(path, dst.data(), r.length, r.offset));
      EXPECT_EQ(n, r.length);
      ASSERT_EQ("", first_difference(std::span(content).subspan(r.offset, r.length), dst.span()));
    }
  }
}

TEST_P(EngineTest, ManyConcurrentRequestsToDistinctFiles) {
  constexpr int kFiles = 64;
  std::vector<TestBuffer> data;
  std::vector<IoTicket> tickets;
  for (int i = 0; i < kFiles; ++i) {
    uint64_t size = i == 0 ? kMiB + 7 : static_cast<uint64_t>(i) * 4099 + 1;
    data.emplace_back(size, static_cast<size_t>(i % 2));
    fill_random(data.back().span(), static_cast<uint64_t>(i));
  }
  run_with_watchdog(seconds(60), "64 concurrent writes and reads", [&] {
    for (int i = 0; i < kFiles; ++i) {
      IoRequest r = request(IoKind::kWrite, dir_.file("f" + std::to_string(i)), data[i].data(),
                            data[i].size(), 0);
      FP_ASSERT_OK_AND_ASSIGN(IoTicket t, engine_->submit(r));
      tickets.push_back(t);
    }
    EXPECT_EQ(engine_->pending(), static_cast<size_t>(kFiles));
    FP_ASSERT_OK_AND_ASSIGN(size_t completed, engine_->wait());
    EXPECT_EQ(completed, static_cast<size_t>(kFiles));
    EXPECT_EQ(engine_->pending(), 0u);
    for (int i = 0; i < kFiles; ++i) {
      EXPECT_TRUE(tickets[i].done());
      Result<uint64_t> n = tickets[i].wait();
      FP_EXPECT_OK(n);
      if (n.is_ok()) {
        EXPECT_EQ(*n, data[i].size());
      }
    }

    std::vector<TestBuffer> back;
    for (int i = 0; i < kFiles; ++i)
      back.emplace_back(data[i].size(), static_cast<size_t>((i + 1) % 2));
    for (int i = 0; i < kFiles; ++i) {
      IoRequest r = request(IoKind::kRead, dir_.file("f" + std::to_string(i)), back[i].data(),
                            back[i].size(), 0);
      FP_ASSERT_OK(engine_->submit(r));
    }
    FP_ASSERT_OK_AND_ASSIGN(size_t read_back, engine_->wait());
    EXPECT_EQ(read_back, static_cast<size_t>(kFiles));
    for (int i = 0; i < kFiles; ++i) {
      ASSERT_EQ("", first_difference(data[i].span(), back[i].span())) << "file " << i;
    }
  });
  // A second wait() has nothing left to collect.
  FP_ASSERT_OK_AND_ASSIGN(size_t none, engine_->wait());
  EXPECT_EQ(none, 0u);
}

TEST_P(EngineTest, ManyConcurrentRangesOfOneFile) {
  constexpr int kRanges = 64;
  std::vector<uint64_t> offsets, lengths;
  uint64_t total = 0;
  for (int i = 0; i < kRanges; ++i) {
    // Range boundaries fall inside pages, so neighbours share pages at both ends.
    uint64_t length = (i % 3 == 0) ? 65536 : static_cast<uint64_t>(i) * 1237 + 3;
    offsets.push_back(total);
    lengths.push_back(length);
    total += length;
  }
  TestBuffer content(total, 1);
  fill_random(content.span(), 42);
  std::string path = dir_.file("shared");
  run_with_watchdog(seconds(60), "64 concurrent ranges of one file", [&] {
    // No request truncates, so the submission order of the ranges does not matter.
    for (int i = 0; i < kRanges; ++i) {
      IoRequest r =
          request(IoKind::kWrite, path, content.data() + offsets[i], lengths[i], offsets[i]);
      FP_ASSERT_OK(engine_->submit(r));
    }
    FP_ASSERT_OK_AND_ASSIGN(size_t n, engine_->wait());
    EXPECT_EQ(n, static_cast<size_t>(kRanges));
    FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> on_disk, read_whole_file(path));
    ASSERT_EQ("", first_difference(content.span(), on_disk));

    TestBuffer back(total, 0);
    for (int i = kRanges - 1; i >= 0; --i) {
      IoRequest r = request(IoKind::kRead, path, back.data() + offsets[i], lengths[i], offsets[i]);
      FP_ASSERT_OK(engine_->submit(r));
    }
    FP_ASSERT_OK_AND_ASSIGN(n, engine_->wait());
    EXPECT_EQ(n, static_cast<size_t>(kRanges));
    ASSERT_EQ("", first_difference(content.span(), back.span()));
  });
}

TEST_P(EngineTest, SubmittersOnManyThreads) {
  // submit, run and wait may be called from any thread; four callers share one engine.
  constexpr int kThreads = 4;
  constexpr int kPerThread = 12;
  std::vector<std::vector<std::byte>> data(kThreads * kPerThread);
  for (size_t i = 0; i < data.size(); ++i) data[i] = random_bytes(20000 + i * 4099, i);
  run_with_watchdog(seconds(60), "four threads submitting at once", [&] {
    std::vector<std::thread> callers;
    for (int t = 0; t < kThreads; ++t) {
      callers.emplace_back([&, t] {
        for (int k = 0; k < kPerThread; ++k) {
          size_t i = static_cast<size_t>(t * kPerThread + k);
          IoRequest r = request(IoKind::kWrite, dir_.file("mt" + std::to_string(i)), data[i].data(),
                                data[i].size());
          // Half go through submit (collected by the wait() below), half through run().
          Status st = k % 2 == 0 ? engine_->submit(r).status() : engine_->run(r).status();
          EXPECT_TRUE(st.is_ok()) << st.to_string();
        }
      });
    }
    for (std::thread& c : callers) c.join();
    FP_ASSERT_OK_AND_ASSIGN(size_t n, engine_->wait());
    EXPECT_EQ(n, static_cast<size_t>(kThreads * kPerThread / 2));
  });
  for (size_t i = 0; i < data.size(); ++i) {
    FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> on_disk,
                            read_whole_file(dir_.file("mt" + std::to_string(i))));
    ASSERT_EQ("", first_difference(data[i], on_disk)) << "file " << i;
  }
}

TEST_P(EngineTest, TicketsWaitAndRunCountSeparately) {
  std::vector<std::byte> a = random_bytes(100000, 1);
  FP_ASSERT_OK_AND_ASSIGN(
      IoTicket t1, engine_->submit(request(IoKind::kWrite, dir_.file("a"), a.data(), a.size())));
  FP_ASSERT_OK_AND_ASSIGN(
      IoTicket t2, engine_->submit(request(IoKind::kWrite, dir_.file("b"), a.data(), a.size())));
  IoTicket copy = t1;  // copies share one completion
  FP_ASSERT_OK_AND_ASSIGN(uint64_t ran,
                          engine_->run(request(IoKind::kWrite, dir_.file("c"), a.data(), 7)));
  EXPECT_EQ(ran, 7u);
  FP_ASSERT_OK_AND_ASSIGN(IoTicket own,
                          engine_->start(request(IoKind::kWrite, dir_.file("d"), a.data(), 9)));
  // wait() collects what submit() started, not run() or start().
  FP_ASSERT_OK_AND_ASSIGN(size_t n, engine_->wait());
  EXPECT_EQ(n, 2u);
  EXPECT_TRUE(t1.done());
  EXPECT_TRUE(copy.done());
  FP_ASSERT_OK_AND_ASSIGN(uint64_t bytes, copy.wait());
  EXPECT_EQ(bytes, a.size());
  FP_ASSERT_OK_AND_ASSIGN(bytes, t2.wait());
  EXPECT_EQ(bytes, a.size());
  FP_ASSERT_OK_AND_ASSIGN(bytes, own.wait());
  EXPECT_EQ(bytes, 9u);
  EXPECT_EQ(engine_->pending(), 0u);

  IoTicket empty;
  EXPECT_FALSE(empty.valid());
  EXPECT_EQ(empty.wait().status().code(), StatusCode::kInvalidArgument);
}

TEST_P(EngineTest, DestroyingTheEngineFinishesRequestsInFlight) {
  constexpr int kRequests = 16;
  std::vector<TestBuffer> data;
  std::vector<IoTicket> tickets;
  for (int i = 0; i < kRequests; ++i) {
    data.emplace_back(kMiB + static_cast<uint64_t>(i), static_cast<size_t>(i % 2));
    fill_random(data.back().span(), static_cast<uint64_t>(i) + 100);
  }
  run_with_watchdog(seconds(60), "engine destruction with requests in flight", [&] {
    for (int i = 0; i < kRequests; ++i) {
      IoRequest r = request(IoKind::kWrite, dir_.file("inflight" + std::to_string(i)),
                            data[i].data(), data[i].size());
      FP_ASSERT_OK_AND_ASSIGN(IoTicket t, engine_->submit(r));
      tickets.push_back(t);
    }
    engine_.reset();
  });
  // The tickets outlive the engine and report the finished requests.
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(tickets[i].done());
    FP_ASSERT_OK_AND_ASSIGN(uint64_t n, tickets[i].wait());
    EXPECT_EQ(n, data[i].size());
    FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> on_disk,
                            read_whole_file(dir_.file("inflight" + std::to_string(i))));
    ASSERT_EQ("", first_difference(data[i].span(), on_disk)) << "file " << i;
  }
}

TEST_P(EngineTest, ReportsItsBackendAndOptions) {
  const EngineConfig& c = GetParam();
  EXPECT_EQ(engine_->options().block_size, c.block_size);
  EXPECT_EQ(engine_->options().queue_depth, c.queue_depth);
  EXPECT_EQ(engine_->options().intra_op_parallelism, c.intra_op_parallelism);
  EXPECT_EQ(engine_->options().overlap_events, c.overlap_events);
  EXPECT_EQ(engine_->options().single_submit, c.single_submit);
  if (!c.short_transfers) {
    EXPECT_EQ(engine_->backend_name(), backend_name(c.backend));
    EXPECT_EQ(engine_->options().backend, c.backend);
  }
  EXPECT_FALSE(engine_->backend_reason().empty());
}

INSTANTIATE_TEST_SUITE_P(AllBackends, EngineTest, ::testing::ValuesIn(conformance_configs()),
                         [](const auto& p) { return p.param.test_name(); });

// 64 MiB + 3 bytes: many blocks per worker, a full queue, and a tail; on a few configurations.
class LargeTransferTest : public EngineTest {};

TEST_P(LargeTransferTest, RoundTripsSixtyFourMegabytesAndThree) {
  constexpr uint64_t kSize = 64 * kMiB + 3;
  run_with_watchdog(seconds(90), "64 MiB + 3 round trips", [&] {
    check_round_trip(dir_.file("big-aligned"), kSize, 0, 0);
    ::unlink(dir_.file("big-aligned").c_str());
    if (HasFatalFailure()) return;
    check_round_trip(dir_.file("big-misaligned"), kSize, 4097, 1);
  });
  IoStats s = engine_->stats();
  EXPECT_EQ(s.direct_bytes + s.buffered_bytes, s.bytes_written + s.bytes_read);
  EXPECT_EQ(s.bytes_written, 2 * kSize);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, LargeTransferTest,
                         ::testing::ValuesIn(large_transfer_configs()),
                         [](const auto& p) { return p.param.test_name(); });

}  // namespace
}  // namespace fastpersist::testing
