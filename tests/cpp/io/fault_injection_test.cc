// SPDX-License-Identifier: Apache-2.0
// Injected failures (testing/fault_backend.h) on every real backend: an error, a full disk, a
// short transfer or a transfer stuck at zero at the Nth operation must become the right error
// (or be resumed) and never hang the engine, never leave a short file reported as success, and
// never stop the engine from serving the next request.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "common/unique_fd.h"
#include "fastpersist/io_engine.h"
#include "testing/fault_backend.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"
#include "testing/watchdog.h"

namespace fastpersist::testing {
namespace {

using std::chrono::seconds;

constexpr uint64_t kBlock = 64 << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;

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

class FaultInjectionTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (auto why = backend_skip_reason(GetParam())) GTEST_SKIP() << *why;
    FP_ASSERT_OK_AND_ASSIGN(faults_, FaultInjector::create({}, GetParam()));
    FP_ASSERT_OK_AND_ASSIGN(folder_mode_, probe_file_io(dir_.path()));
    // One worker and 64 KiB blocks: a request's operations are submitted in file order, so the
    // Nth one is at a known offset.
    FP_ASSERT_OK_AND_ASSIGN(engine_, make_engine(1));
  }

  Result<std::unique_ptr<IoEngine>> make_engine(unsigned parallelism) {
    EngineOptions o;
    o.block_size = kBlock;
    o.queue_depth = 8;
    o.intra_op_parallelism = parallelism;
    o.overlap_events = true;
    o.direct_io_min_bytes = 0;
    return IoEngine::create(o, faults_->factory(),
                            "faulty " + std::string(backend_name(GetParam())));
  }

  // Writes `size` random bytes through the engine and checks the file byte for byte.
  void check_write(const std::string& path, uint64_t size, uint64_t offset = 0,
                   size_t misalign = 0) {
    TestBuffer data(size, misalign);
    fill_random(data.span(), size + offset);
    FP_ASSERT_OK_AND_ASSIGN(uint64_t n,
                            engine_->run(request(IoKind::kWrite, path, data.data(), size, offset)));
    EXPECT_EQ(n, size);
    FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> on_disk, read_whole_file(path));
    ASSERT_EQ(on_disk.size(), offset + size);
    ASSERT_EQ("", first_difference(data.span(), std::span(on_disk).subspan(offset)));
  }

  void check_engine_still_works() {
    SCOPED_TRACE("the engine still works after the failure");
    faults_->disarm();
    check_write(dir_.file("after-failure"), kMiB + 7, 4097, 1);
  }

  TempDir dir_;
  FileIoMode folder_mode_;
  std::shared_ptr<FaultInjector> faults_;
  std::unique_ptr<IoEngine> engine_;
};

TEST_P(FaultInjectionTest, ErrorAtTheNthWriteNamesErrnoPathAndOffset) {
  for (int err : {EIO, ENOSPC}) {
    SCOPED_TRACE(std::strerror(err));
    std::string path = dir_.file("failing-" + std::to_string(err));
    faults_->arm({.kind = FaultKind::kError, .error = err, .nth = 3, .ops = FaultOps::kWrites});
    TestBuffer data(kMiB);
    fill_random(data.span(), 1);
    run_with_watchdog(seconds(30), "a write with an injected error", [&] {
      Status st = engine_->run(request(IoKind::kWrite, path, data.data(), data.size())).status();
      ASSERT_FALSE(st.is_ok()) << "an injected error was reported as success";
      EXPECT_EQ(st.code(), StatusCode::kIoError) << st.to_string();
      EXPECT_EQ(st.sys_errno(), err) << st.to_string();
      EXPECT_EQ(st.path(), path);
      EXPECT_EQ(st.offset(), 2 * kBlock) << st.to_string();
      EXPECT_EQ(st.length(), kBlock) << st.to_string();
      EXPECT_NE(st.message().find("write failed"), std::string::npos) << st.to_string();
    });
    std::vector<InjectedFault> injected = faults_->injected();
    ASSERT_EQ(injected.size(), 1u);
    EXPECT_EQ(injected[0].file_offset, 2 * kBlock);
    EXPECT_TRUE(injected[0].is_write);
  }
  check_engine_still_works();
}

TEST_P(FaultInjectionTest, ErrorAtTheNthRead) {
  std::string path = dir_.file("source");
  check_write(path, kMiB + 7);
  faults_->arm({.kind = FaultKind::kError, .error = EIO, .nth = 5, .ops = FaultOps::kReads});
  TestBuffer back(kMiB + 7, 1);
  run_with_watchdog(seconds(30), "a read with an injected error", [&] {
    Status st = engine_->run(request(IoKind::kRead, path, back.data(), back.size())).status();
    EXPECT_EQ(st.code(), StatusCode::kIoError) << st.to_string();
    EXPECT_EQ(st.sys_errno(), EIO) << st.to_string();
    EXPECT_EQ(st.path(), path);
    EXPECT_EQ(st.offset(), 4 * kBlock) << st.to_string();
    EXPECT_NE(st.message().find("read failed"), std::string::npos) << st.to_string();
  });
  check_engine_still_works();
}

TEST_P(FaultInjectionTest, ErrorOnACallersDescriptorNamesTheDescriptor) {
  std::string path = dir_.file("by-fd");
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  ASSERT_TRUE(fd.valid());
  faults_->arm({.kind = FaultKind::kError, .error = ENOSPC, .nth = 1});
  TestBuffer data(3 * kBlock);
  IoRequest r = request(IoKind::kWrite, "", data.data(), data.size(), kBlock);
  r.fd = fd.get();
  Status st = engine_->run(r).status();
  EXPECT_EQ(st.sys_errno(), ENOSPC) << st.to_string();
  EXPECT_EQ(st.path(), "fd " + std::to_string(fd.get()));
  EXPECT_EQ(st.offset(), kBlock);
  check_engine_still_works();
}

TEST_P(FaultInjectionTest, ShortWritesAreResumedAndTheFileIsExact) {
  // Every operation moves only half of what it asked for, again and again.
  faults_->arm({.kind = FaultKind::kShort, .ops = FaultOps::kWrites, .repeat = true});
  run_with_watchdog(seconds(60), "short writes", [&] {
    check_write(dir_.file("aligned"), kMiB, 0, 0);
    check_write(dir_.file("unaligned"), kMiB + 7, 4097, 1);
    check_write(dir_.file("tiny"), 3, 0, 0);
  });
  IoStats s = engine_->stats();
  EXPECT_GT(s.short_transfers, 0u);
  EXPECT_EQ(s.direct_bytes + s.buffered_bytes, s.bytes_written + s.bytes_read);
  EXPECT_GT(faults_->injected().size(), 10u);

  // Once, in the middle of a request.
  faults_->arm({.kind = FaultKind::kShort, .nth = 4, .ops = FaultOps::kWrites});
  uint64_t before = engine_->stats().short_transfers;
  check_write(dir_.file("once"), kMiB + 7, 512, 0);
  EXPECT_EQ(engine_->stats().short_transfers, before + 1);
  EXPECT_EQ(faults_->injected().size(), 1u);
}

TEST_P(FaultInjectionTest, ShortReadsAreResumed) {
  std::string path = dir_.file("source");
  TestBuffer data(2 * kMiB + 3, 0);
  fill_random(data.span(), 5);
  FP_ASSERT_OK(write_whole_file(path, data.span()));
  faults_->arm({.kind = FaultKind::kShort, .ops = FaultOps::kReads, .repeat = true});
  TestBuffer back(data.size() - 4097, 1);
  run_with_watchdog(seconds(60), "short reads", [&] {
    FP_ASSERT_OK_AND_ASSIGN(
        uint64_t n, engine_->run(request(IoKind::kRead, path, back.data(), back.size(), 4097)));
    EXPECT_EQ(n, back.size());
  });
  EXPECT_EQ("", first_difference(data.span().subspan(4097), back.span()));
  EXPECT_GT(engine_->stats().short_transfers, 0u);
}

TEST_P(FaultInjectionTest, ShortODirectTransferEndingUnalignedFinishesThroughTheCache) {
  if (!folder_mode_.direct)
    GTEST_SKIP() << "the test folder refuses O_DIRECT: " << folder_mode_.fallback_reason;
  // 1000 bytes of an aligned O_DIRECT operation: the rest starts at an offset O_DIRECT cannot use.
  faults_->arm(
      {.kind = FaultKind::kShort, .nth = 2, .ops = FaultOps::kWrites, .short_bytes = 1000});
  check_write(dir_.file("direct"), kMiB, 0, 0);
  std::vector<InjectedFault> injected = faults_->injected();
  ASSERT_EQ(injected.size(), 1u);
  EXPECT_EQ(injected[0].result, 1000);
  IoStats s = engine_->stats();
  EXPECT_EQ(s.short_transfers, 1u);
  EXPECT_GE(s.buffered_bytes, kBlock - 1000);

  faults_->arm({.kind = FaultKind::kShort, .nth = 3, .ops = FaultOps::kReads, .short_bytes = 4097});
  TestBuffer back(kMiB, 0);
  FP_ASSERT_OK(engine_->run(request(IoKind::kRead, dir_.file("direct"), back.data(), back.size())));
  FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> on_disk, read_whole_file(dir_.file("direct")));
  EXPECT_EQ("", first_difference(on_disk, back.span()));
  EXPECT_EQ(engine_->stats().short_transfers, 2u);
}

TEST_P(FaultInjectionTest, StuckAtZeroIsAnErrorNotAHang) {
  std::string path = dir_.file("stuck");
  TestBuffer data(kMiB + 7, 1);
  fill_random(data.span(), 6);
  faults_->arm(
      {.kind = FaultKind::kNoProgress, .nth = 2, .ops = FaultOps::kWrites, .repeat = true});
  run_with_watchdog(seconds(30), "a write stuck at zero bytes", [&] {
    Status st = engine_->run(request(IoKind::kWrite, path, data.data(), data.size())).status();
    ASSERT_FALSE(st.is_ok()) << "a write that made no progress was reported as success";
    EXPECT_EQ(st.code(), StatusCode::kIoError) << st.to_string();
    EXPECT_EQ(st.sys_errno(), EIO) << st.to_string();
    EXPECT_EQ(st.path(), path);
    EXPECT_NE(st.message().find("no progress"), std::string::npos) << st.to_string();
  });

  faults_->disarm();
  check_write(path, kMiB + 7);
  faults_->arm({.kind = FaultKind::kNoProgress, .nth = 1, .ops = FaultOps::kReads});
  run_with_watchdog(seconds(30), "a read stuck at zero bytes", [&] {
    Status st = engine_->run(request(IoKind::kRead, path, data.data(), data.size())).status();
    ASSERT_FALSE(st.is_ok()) << "a read that made no progress was reported as success";
    EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
    EXPECT_EQ(st.path(), path);
  });
  check_engine_still_works();
}

TEST_P(FaultInjectionTest, OneFailureAmongManyAsyncRequests) {
  for (unsigned parallelism : {1u, 3u}) {
    SCOPED_TRACE("intra_op_parallelism " + std::to_string(parallelism));
    FP_ASSERT_OK_AND_ASSIGN(engine_, make_engine(parallelism));
    constexpr int kRequests = 64;
    std::vector<TestBuffer> data;
    for (int i = 0; i < kRequests; ++i) {
      data.emplace_back(4 * kBlock + static_cast<uint64_t>(i), static_cast<size_t>(i % 2));
      fill_random(data.back().span(), static_cast<uint64_t>(i));
    }
    // Each request is about four operations; the 100th falls somewhere in the middle.
    faults_->arm({.kind = FaultKind::kError, .error = EIO, .nth = 100, .ops = FaultOps::kWrites});
    std::vector<IoTicket> tickets;
    run_with_watchdog(seconds(60), "64 async writes, one failing", [&] {
      for (int i = 0; i < kRequests; ++i) {
        IoRequest r = request(IoKind::kWrite, dir_.file("async-" + std::to_string(i)),
                              data[i].data(), data[i].size());
        FP_ASSERT_OK_AND_ASSIGN(IoTicket t, engine_->submit(r));
        tickets.push_back(t);
      }
      Result<size_t> waited = engine_->wait();
      ASSERT_FALSE(waited.is_ok()) << "wait() hid the failure";
      EXPECT_EQ(waited.status().sys_errno(), EIO) << waited.status().to_string();
    });
    EXPECT_EQ(engine_->pending(), 0u);
    // wait() returned only after every request finished; exactly one of them failed.
    int failed = 0;
    for (int i = 0; i < kRequests; ++i) {
      ASSERT_TRUE(tickets[i].done()) << "request " << i << " still running after wait()";
      Result<uint64_t> r = tickets[i].wait();
      if (!r.is_ok()) {
        ++failed;
        EXPECT_EQ(r.status().path(), dir_.file("async-" + std::to_string(i)));
        continue;
      }
      FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> on_disk,
                              read_whole_file(dir_.file("async-" + std::to_string(i))));
      EXPECT_EQ("", first_difference(data[i].span(), on_disk)) << "request " << i;
    }
    EXPECT_EQ(failed, 1);
    FP_ASSERT_OK_AND_ASSIGN(size_t none, engine_->wait());
    EXPECT_EQ(none, 0u);
    check_engine_still_works();
  }
}

TEST_P(FaultInjectionTest, EveryOperationFailingInEveryWorker) {
  FP_ASSERT_OK_AND_ASSIGN(engine_, make_engine(3));
  faults_->arm({.kind = FaultKind::kError, .error = ENOSPC, .repeat = true});
  TestBuffer data(4 * kMiB + 1, 1);
  run_with_watchdog(seconds(60), "requests whose every operation fails", [&] {
    for (int i = 0; i < 8; ++i) {
      FP_ASSERT_OK(engine_->submit(request(IoKind::kWrite, dir_.file("full-" + std::to_string(i)),
                                           data.data(), data.size())));
    }
    Result<size_t> waited = engine_->wait();
    ASSERT_FALSE(waited.is_ok());
    EXPECT_EQ(waited.status().sys_errno(), ENOSPC);
  });
  check_engine_still_works();
}

TEST_P(FaultInjectionTest, SubmitFailureIsReportedWithoutHanging) {
  faults_->arm({.kind = FaultKind::kSubmitError, .error = EAGAIN, .nth = 3});
  TestBuffer data(kMiB);
  run_with_watchdog(seconds(30), "a request whose submission fails", [&] {
    Status st =
        engine_->run(request(IoKind::kWrite, dir_.file("refused"), data.data(), data.size()))
            .status();
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.sys_errno(), EAGAIN) << st.to_string();
    EXPECT_NE(st.message().find("submission failed"), std::string::npos) << st.to_string();
    // The worker no longer trusts its queue; what it gets next finishes, one way or the other.
    faults_->disarm();
    (void)engine_->run(request(IoKind::kWrite, dir_.file("next"), data.data(), data.size()));
  });
}

INSTANTIATE_TEST_SUITE_P(AllBackends, FaultInjectionTest, ::testing::ValuesIn(real_backends()),
                         [](const auto& p) { return std::string(backend_name(p.param)); });

}  // namespace
}  // namespace fastpersist::testing
