// SPDX-License-Identifier: Apache-2.0
// AioHandle keeps DeepNVMe's contract: sync calls return the completed count, async calls 0,
// wait() collects; and improves on it: errors are returned, any size works, files end exact.
#include "fastpersist/aio_handle.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

namespace fastpersist {
namespace {

namespace fs = std::filesystem;

class AioHandleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fastpersist-aio-handle-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<AioHandle> make(EngineOptions o = {}) {
    auto h = AioHandle::create(o);
    EXPECT_TRUE(h.is_ok()) << h.status().to_string();
    return std::move(h).value();
  }
  static std::vector<std::byte> random_bytes(size_t n, unsigned seed) {
    std::vector<std::byte> v(n);
    std::mt19937 rng(seed);
    for (auto& b : v) b = static_cast<std::byte>(rng());
    return v;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(AioHandleTest, GettersReportDeepNvmeDefaultsAndOptions) {
  auto h = make();
  EXPECT_EQ(h->get_block_size(), size_t{1} << 20);
  EXPECT_EQ(h->get_queue_depth(), 128u);
  EXPECT_FALSE(h->get_single_submit());
  EXPECT_FALSE(h->get_overlap_events());
  EXPECT_EQ(h->get_intra_op_parallelism(), 1u);
  EXPECT_EQ(h->get_alignment(), 4096u);
  EngineOptions o;
  o.block_size = 8 << 20;
  o.queue_depth = 8;
  o.single_submit = true;
  o.overlap_events = true;
  o.intra_op_parallelism = 2;
  auto h2 = make(o);
  EXPECT_EQ(h2->get_block_size(), size_t{8} << 20);
  EXPECT_EQ(h2->get_queue_depth(), 8u);
  EXPECT_TRUE(h2->get_single_submit());
  EXPECT_TRUE(h2->get_overlap_events());
  EXPECT_EQ(h2->get_intra_op_parallelism(), 2u);
  EXPECT_EQ(h2->get_alignment(), 8192u);
}

TEST_F(AioHandleTest, SyncCallsReturnCompletedCount) {
  auto h = make();
  auto data = random_bytes((1 << 20) + 7, 1);
  auto w = h->sync_pwrite(data.data(), data.size(), path("a"));
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_EQ(*w, 1);
  EXPECT_EQ(fs::file_size(path("a")), data.size());
  std::vector<std::byte> back(data.size());
  auto r = h->sync_pread(back.data(), back.size(), path("a"));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(*r, 1);
  EXPECT_EQ(back, data);
}

TEST_F(AioHandleTest, AsyncCallsReturnZeroAndWaitCountsThem) {
  auto h = make();
  std::vector<std::vector<std::byte>> bufs;
  for (int i = 0; i < 10; ++i)
    bufs.push_back(random_bytes(100000 + static_cast<size_t>(i), static_cast<unsigned>(i)));
  for (int i = 0; i < 10; ++i) {
    auto rc = h->async_pwrite(bufs[i].data(), bufs[i].size(), path("f" + std::to_string(i)));
    ASSERT_TRUE(rc.is_ok()) << rc.status().to_string();
    EXPECT_EQ(*rc, 0);
  }
  auto n = h->wait();
  ASSERT_TRUE(n.is_ok()) << n.status().to_string();
  EXPECT_EQ(*n, 10);
  auto again = h->wait();
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(*again, 0);
  // A sync call drains earlier async requests too and counts them, as DeepNVMe does.
  std::vector<std::byte> back(bufs[3].size());
  ASSERT_EQ(*h->async_pread(back.data(), back.size(), path("f3")), 0);
  auto s = h->sync_pwrite(bufs[0].data(), bufs[0].size(), path("g"));
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(*s, 2);
  EXPECT_EQ(back, bufs[3]);
}

TEST_F(AioHandleTest, FileOffsetsBuildOneFile) {
  auto h = make();
  auto data = random_bytes(3 * 4096 + 100, 7);
  ASSERT_TRUE(h->sync_pwrite(data.data(), 4096, path("p"), 0).is_ok());
  ASSERT_TRUE(h->async_pwrite(data.data() + 4096, data.size() - 4096, path("p"), 4096).is_ok());
  ASSERT_EQ(*h->wait(), 1);
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE(h->sync_pread(back.data(), back.size(), path("p")).is_ok());
  EXPECT_EQ(back, data);
}

TEST_F(AioHandleTest, TruncateReplacesALongerFile) {
  auto h = make();
  auto big = random_bytes(1 << 20, 2);
  auto small = random_bytes(5000, 3);
  ASSERT_TRUE(h->sync_pwrite(big.data(), big.size(), path("x")).is_ok());
  ASSERT_TRUE(h->sync_pwrite(small.data(), small.size(), path("x"), 0, /*truncate=*/true).is_ok());
  EXPECT_EQ(fs::file_size(path("x")), small.size());
  ASSERT_EQ(*h->async_pwrite(big.data(), big.size(), path("x")), 0);
  ASSERT_EQ(*h->wait(), 1);
  ASSERT_EQ(*h->async_pwrite(small.data(), small.size(), path("x"), 100, /*truncate=*/true), 0);
  ASSERT_EQ(*h->wait(), 1);
  EXPECT_EQ(fs::file_size(path("x")), 100 + small.size());
  ASSERT_TRUE(
      h->pwrite(big.data(), big.size(), path("x"), true, false, 0, /*truncate=*/true).is_ok());
  EXPECT_EQ(fs::file_size(path("x")), big.size());
}

TEST_F(AioHandleTest, ShorterRewriteLeavesTheOldTail) {
  auto h = make();
  auto big = random_bytes(1 << 20, 2);
  auto small = random_bytes(5000, 3);
  ASSERT_TRUE(h->sync_pwrite(big.data(), big.size(), path("x")).is_ok());
  ASSERT_TRUE(h->sync_pwrite(small.data(), small.size(), path("x")).is_ok());
  std::vector<std::byte> expected = big;
  std::copy(small.begin(), small.end(), expected.begin());
  std::vector<std::byte> back(big.size());
  ASSERT_TRUE(h->sync_pread(back.data(), back.size(), path("x")).is_ok());
  EXPECT_EQ(back, expected);
}

// Regression (issue 10): 8 MiB at file offsets 8, 16 and 24 MiB, then 8 MiB at offset 0, shrank
// the file from 32 MiB to 8 MiB, because the write at offset 0 opened it with O_TRUNC.
TEST_F(AioHandleTest, WriteAtOffsetZeroKeepsDisjointRangesWrittenBefore) {
  constexpr size_t kPart = size_t{8} << 20;
  auto h = make();
  auto data = random_bytes(4 * kPart, 21);
  for (size_t i : {1, 2, 3, 0}) {
    ASSERT_EQ(*h->sync_pwrite(data.data() + i * kPart, kPart, path("f"), i * kPart), 1);
  }
  EXPECT_EQ(fs::file_size(path("f")), 4 * kPart);
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE(h->sync_pread(back.data(), back.size(), path("f")).is_ok());
  EXPECT_EQ(back, data);
}

TEST_F(AioHandleTest, AsyncBatchOfDisjointRangesKeepsEveryRange) {
  constexpr size_t kPart = size_t{1} << 20;
  auto h = make();
  auto data = random_bytes(8 * kPart, 22);
  for (size_t i : {3, 0, 7, 5, 1, 2, 6, 4}) {
    ASSERT_EQ(*h->async_pwrite(data.data() + i * kPart, kPart, path("f"), i * kPart), 0);
  }
  ASSERT_EQ(*h->wait(), 8);
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE(h->sync_pread(back.data(), back.size(), path("f")).is_ok());
  EXPECT_EQ(back, data);
}

TEST_F(AioHandleTest, ThreadsWritingDisjointRangesKeepEveryRange) {
  constexpr size_t kPart = size_t{1} << 20;
  constexpr size_t kThreads = 8;
  auto h = make();
  auto data = random_bytes(kThreads * kPart, 23);
  std::vector<std::thread> threads;
  std::vector<int> results(kThreads, -1);
  // The thread writing offset 0 starts last, after the others have had time to write.
  for (size_t t = kThreads; t-- > 0;) {
    threads.emplace_back([&, t] {
      if (t == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      auto r = h->sync_pwrite(data.data() + t * kPart, kPart, path("f"), t * kPart);
      results[t] = r.is_ok() ? 1 : 0;
    });
  }
  for (auto& th : threads) th.join();
  for (size_t t = 0; t < kThreads; ++t) EXPECT_EQ(results[t], 1) << "thread " << t;
  EXPECT_EQ(fs::file_size(path("f")), data.size());
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE(h->sync_pread(back.data(), back.size(), path("f")).is_ok());
  EXPECT_EQ(back, data);
}

// Many handles at once, each used by several threads mixing async and sync calls and wait():
// every byte lands where it was asked, each handle's wait() counts its own requests only, and
// reads through other handles racing with the writes of other files see their own files whole.
// (Run under ThreadSanitizer by `make sanitize-tsan`.)
TEST_F(AioHandleTest, ManyHandlesAndThreadsAtOnceKeepEveryByteAndCount) {
  constexpr size_t kHandles = 4;
  constexpr size_t kThreadsPerHandle = 3;
  constexpr size_t kPieces = 6;  // per thread, each in its own range of the shared file
  constexpr size_t kPiece = 256 * 1024 + 512;  // not a multiple of 4096: the unaligned path too
  std::vector<std::unique_ptr<AioHandle>> handles;
  for (size_t h = 0; h < kHandles; ++h) {
    EngineOptions o;
    o.queue_depth = 8;
    o.intra_op_parallelism = 1 + static_cast<unsigned>(h % 2);
    handles.push_back(make(o));
  }
  const size_t writers = kHandles * kThreadsPerHandle;
  auto data = random_bytes(writers * kPieces * kPiece, 99);
  // A file per handle, written before the race and read back during it by another handle.
  std::vector<std::vector<std::byte>> own(kHandles);
  for (size_t h = 0; h < kHandles; ++h) {
    own[h] = random_bytes(3 * kPiece, 200 + static_cast<unsigned>(h));
    ASSERT_TRUE(
        handles[h]
            ->sync_pwrite(own[h].data(), own[h].size(), path("own" + std::to_string(h)), 0, true)
            .is_ok());
  }
  std::vector<std::thread> threads;
  std::vector<std::string> failures(writers);
  std::vector<std::atomic<int>> counted(kHandles);  // what the handle's calls said completed
  for (size_t w = 0; w < writers; ++w) {
    threads.emplace_back([&, w] {
      AioHandle& h = *handles[w / kThreadsPerHandle];
      const size_t reader_of = (w / kThreadsPerHandle + 1) % kHandles;
      std::vector<std::byte> back(own[reader_of].size());
      for (size_t k = 0; k < kPieces; ++k) {
        const size_t at = (w * kPieces + k) * kPiece;
        Result<int> r = k % 2 == 0 ? h.async_pwrite(data.data() + at, kPiece, path("shared"), at)
                                   : h.sync_pwrite(data.data() + at, kPiece, path("shared"), at);
        if (!r.is_ok())
          failures[w] = r.status().to_string();
        else
          counted[w / kThreadsPerHandle] += *r;
        Result<int> read =
            h.sync_pread(back.data(), back.size(), path("own" + std::to_string(reader_of)));
        if (!read.is_ok())
          failures[w] = read.status().to_string();
        else
          counted[w / kThreadsPerHandle] += *read;
        if (back != own[reader_of])
          failures[w] = "a read of own" + std::to_string(reader_of) + " differs";
      }
    });
  }
  for (auto& t : threads) t.join();
  for (size_t w = 0; w < writers; ++w) EXPECT_EQ(failures[w], "") << "thread " << w;
  for (size_t h = 0; h < kHandles; ++h) {
    Result<int> drained = handles[h]->wait();  // the async writes no sync call collected
    ASSERT_TRUE(drained.is_ok()) << drained.status().to_string();
    counted[h] += *drained;
    // Every request of this handle counted once, by exactly one call: the writes and reads of
    // its threads, none of another handle's.
    EXPECT_EQ(counted[h].load(), static_cast<int>(kThreadsPerHandle * kPieces * 2))
        << "handle " << h;
    Result<int> again = handles[h]->wait();
    ASSERT_TRUE(again.is_ok());
    EXPECT_EQ(*again, 0) << "nothing left";
  }
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE(handles[0]->sync_pread(back.data(), back.size(), path("shared")).is_ok());
  EXPECT_EQ(back, data);
}

TEST_F(AioHandleTest, ValidateDetectsGoodAndBadData) {
  auto h = make();
  auto data = random_bytes(200000, 4);
  auto ok = h->pwrite(data.data(), data.size(), path("v"), /*validate=*/true, /*async_op=*/false);
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(*ok, 1);
  std::vector<std::byte> back(data.size());
  ASSERT_EQ(*h->pread(back.data(), back.size(), path("v"), true, true), 0);
  ASSERT_TRUE(h->wait().is_ok());
  EXPECT_EQ(back, data);

  // Validation runs at wait(): change the buffer after the write landed but before wait(), and
  // the comparison must report the first differing byte.
  auto copy = data;
  ASSERT_EQ(*h->pwrite(copy.data(), copy.size(), path("w"), true, true), 0);
  for (int spin = 0; spin < 5000; ++spin) {
    std::ifstream in(path("w"), std::ios::binary);
    std::vector<char> got((std::istreambuf_iterator<char>(in)), {});
    if (got.size() == data.size() && std::memcmp(got.data(), data.data(), data.size()) == 0) break;
    usleep(1000);
  }
  copy[123] = ~copy[123];
  auto bad = h->wait();
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("differs"), std::string::npos) << bad.status().to_string();
  EXPECT_EQ(bad.status().offset(), 123u);
}

TEST_F(AioHandleTest, ErrorsCarryErrnoAndPath) {
  auto h = make();
  std::vector<std::byte> buf(4096);
  auto missing = h->sync_pwrite(buf.data(), buf.size(), path("no/such/dir/f"));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().sys_errno(), ENOENT);
  EXPECT_EQ(missing.status().path(), path("no/such/dir/f"));
  ASSERT_TRUE(h->sync_pwrite(buf.data(), 100, path("short")).is_ok());
  auto past = h->sync_pread(buf.data(), buf.size(), path("short"));
  ASSERT_FALSE(past.is_ok());
  EXPECT_EQ(past.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(past.status().to_string().find("past the end"), std::string::npos);
  // An async failure surfaces at wait(), and the handle keeps working afterwards.
  auto a = h->async_pread(buf.data(), buf.size(), path("does-not-exist"));
  EXPECT_FALSE(a.is_ok());  // open errors are immediate
  EXPECT_TRUE(h->sync_pwrite(buf.data(), buf.size(), path("after")).is_ok());
  auto badfd = h->async_pwrite_fd(buf.data(), buf.size(), -1);
  EXPECT_EQ(badfd.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(AioHandleTest, CallerFdIsNeitherClosedNorTruncated) {
  auto h = make();
  auto data = random_bytes(70000, 5);
  int fd = ::open(path("fd").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  std::vector<std::byte> longer(100000, std::byte{9});
  ASSERT_EQ(::pwrite(fd, longer.data(), longer.size(), 0), static_cast<ssize_t>(longer.size()));
  ASSERT_EQ(*h->async_pwrite_fd(data.data(), data.size(), fd, 0), 0);
  ASSERT_EQ(*h->wait(), 1);
  EXPECT_EQ(fs::file_size(path("fd")), longer.size());  // fd writes never truncate
  std::vector<std::byte> back(data.size());
  ASSERT_EQ(*h->async_pread_fd(back.data(), back.size(), fd, 0), 0);
  ASSERT_EQ(*h->wait(), 1);
  EXPECT_EQ(back, data);
  EXPECT_GE(::fcntl(fd, F_GETFD), 0);  // still open
  ::close(fd);
}

TEST_F(AioHandleTest, LockedBuffersAreTrackedAndFreed) {
  auto h = make();
  auto b = h->new_cpu_locked_buffer(1 << 20);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  std::byte* p = (*b)->data();
  EXPECT_TRUE(h->is_pinned(p, 1 << 20));
  EXPECT_TRUE(h->is_pinned(p + 4096, 100));
  EXPECT_FALSE(h->is_pinned(p, (2 << 20)));
  std::vector<std::byte> plain(100);
  EXPECT_FALSE(h->is_pinned(plain.data(), plain.size()));
  std::memset(p, 0x5A, 1 << 20);
  ASSERT_TRUE(h->sync_pwrite(p, 1 << 20, path("pinned")).is_ok());
  EXPECT_TRUE(h->free_cpu_locked_buffer(p));
  EXPECT_FALSE(h->free_cpu_locked_buffer(p));
  EXPECT_FALSE(h->is_pinned(p, 1));
  // The caller's shared_ptr still keeps the memory valid after free.
  EXPECT_EQ((*b)->data()[10], std::byte{0x5A});
}

TEST_F(AioHandleTest, DestroyingWithRequestsInFlightWaitsForThem) {
  auto data = random_bytes(32 << 20, 6);
  {
    auto h = make();
    for (int i = 0; i < 4; ++i) {
      ASSERT_EQ(*h->async_pwrite(data.data(), data.size(), path("inflight" + std::to_string(i))),
                0);
    }
  }  // destructor waits
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(fs::file_size(path("inflight" + std::to_string(i))), data.size());
}

}  // namespace
}  // namespace fastpersist
