// SPDX-License-Identifier: Apache-2.0
#include "fastpersist/pinned_buffer.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace fastpersist {
namespace {

TEST(PinnedBuffer, IsPageAlignedZeroedAndWritable) {
  auto b = PinnedBuffer::allocate(10000);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(b->size(), 10000u);
  EXPECT_EQ(b->capacity() % static_cast<size_t>(sysconf(_SC_PAGESIZE)), 0u);
  EXPECT_GE(b->capacity(), 10000u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % static_cast<uintptr_t>(sysconf(_SC_PAGESIZE)),
            0u);
  for (size_t i = 0; i < b->capacity(); ++i) ASSERT_EQ(b->data()[i], std::byte{0});
  std::memset(b->data(), 0xAB, b->size());
  EXPECT_EQ(b->data()[9999], std::byte{0xAB});
}

TEST(PinnedBuffer, ZeroBytesStillGivesAValidPage) {
  auto b = PinnedBuffer::allocate(0);
  ASSERT_TRUE(b.is_ok());
  EXPECT_NE(b->data(), nullptr);
  EXPECT_EQ(b->size(), 0u);
}

TEST(PinnedBuffer, ContainsChecksWholeRange) {
  auto b = PinnedBuffer::allocate(8192);
  ASSERT_TRUE(b.is_ok());
  EXPECT_TRUE(b->contains(b->data(), 8192));
  EXPECT_TRUE(b->contains(b->data() + 100, 1000));
  EXPECT_FALSE(b->contains(b->data() + 100, b->capacity()));
  EXPECT_FALSE(b->contains(b->data() - 1, 1));
  int x = 0;
  EXPECT_FALSE(b->contains(&x, sizeof x));
}

TEST(PinnedBuffer, MoveTransfersOwnership) {
  auto b = PinnedBuffer::allocate(4096);
  ASSERT_TRUE(b.is_ok());
  std::byte* p = b->data();
  PinnedBuffer moved = std::move(*b);
  EXPECT_EQ(moved.data(), p);
  EXPECT_EQ(b->data(), nullptr);
  PinnedBuffer assigned;
  assigned = std::move(moved);
  EXPECT_EQ(assigned.data(), p);
}

// A tiny RLIMIT_MEMLOCK must not make allocation fail: the buffer comes back unlocked and the
// process warns once. Runs in a child so the lowered limit does not leak into other tests.
TEST(PinnedBuffer, FallsBackToUnlockedMemoryWhenMemlockIsTooSmall) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // Their mlock() interceptor is a no-op that returns 0, so no limit can make it fail.
  GTEST_SKIP() << "the sanitizers replace mlock() with a no-op that always succeeds";
#endif
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(pipefd[0]);
    dup2(pipefd[1], STDERR_FILENO);
    if (memlock_info().warned) _exit(20);  // an earlier test in this process already warned
    rlimit lim{65536, 65536};              // hard limit too, so the library cannot raise it
    if (setrlimit(RLIMIT_MEMLOCK, &lim) != 0) _exit(10);
    // Root may lock any amount (CAP_IPC_LOCK); become an unprivileged user to feel the limit.
    if (geteuid() == 0 && setuid(65534) != 0) _exit(14);
    auto a = PinnedBuffer::allocate(size_t{8} << 20);
    auto b = PinnedBuffer::allocate(size_t{8} << 20);
    if (!a.is_ok() || !b.is_ok()) _exit(11);
    if (a->locked() || b->locked()) _exit(12);
    std::memset(a->data(), 1, a->size());
    if (!memlock_info().warned) _exit(13);
    _exit(0);
  }
  close(pipefd[1]);
  std::string err;
  char chunk[512];
  ssize_t n;
  while ((n = read(pipefd[0], chunk, sizeof chunk)) > 0) err.append(chunk, static_cast<size_t>(n));
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 20) GTEST_SKIP() << "the once-per-process warning was already shown";
  ASSERT_EQ(WEXITSTATUS(status), 0) << err;
  // One warning for two allocations, naming the limit and the fix.
  size_t first = err.find("cannot lock");
  ASSERT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find("cannot lock", first + 1), std::string::npos) << err;
  EXPECT_NE(err.find("ulimit -l"), std::string::npos) << err;
}

TEST(PinnedBufferPool, ReusesReleasedBuffers) {
  PinnedBufferPool pool(size_t{64} << 20);
  std::byte* first = nullptr;
  {
    auto b = pool.acquire(1 << 20);
    ASSERT_TRUE(b.is_ok());
    first = (*b)->data();
  }
  EXPECT_EQ(pool.cached_bytes(), size_t{1} << 20);
  auto again = pool.acquire(1 << 20);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ((*again)->data(), first);
  EXPECT_EQ((*again)->size(), size_t{1} << 20);
  EXPECT_EQ(pool.cached_bytes(), 0u);
}

TEST(PinnedBufferPool, DoesNotHandOutFarLargerBuffersOrExceedTheCache) {
  PinnedBufferPool pool(size_t{3} << 20);
  {
    auto big = pool.acquire(size_t{2} << 20);
    ASSERT_TRUE(big.is_ok());
  }
  EXPECT_EQ(pool.cached_bytes(), size_t{2} << 20);
  auto small = pool.acquire(4096);
  ASSERT_TRUE(small.is_ok());
  EXPECT_LE((*small)->capacity(), size_t{8192});
  {
    auto another = pool.acquire(size_t{2} << 20);
    ASSERT_TRUE(another.is_ok());
  }  // the cached one
  {
    auto a = pool.acquire(size_t{2} << 20);
    auto b = pool.acquire(size_t{2} << 20);
    ASSERT_TRUE(a.is_ok() && b.is_ok());
  }
  EXPECT_LE(pool.cached_bytes(), size_t{3} << 20);
}

TEST(PinnedBufferPool, BufferOutlivingThePoolIsFreedSafely) {
  std::shared_ptr<PinnedBuffer> keep;
  {
    PinnedBufferPool pool;
    auto b = pool.acquire(4096);
    ASSERT_TRUE(b.is_ok());
    keep = *b;
  }
  std::memset(keep->data(), 3, keep->size());
  keep.reset();  // must not touch the destroyed pool
}

TEST(PinnedBufferPool, ConcurrentAcquireRelease) {
  PinnedBufferPool pool(size_t{16} << 20);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, t] {
      for (int i = 0; i < 200; ++i) {
        auto b = pool.acquire(static_cast<size_t>(4096 * (1 + (i + t) % 4)));
        ASSERT_TRUE(b.is_ok());
        std::memset((*b)->data(), t, (*b)->size());
      }
    });
  }
  for (auto& th : threads) th.join();
}

TEST(CudaRuntime, ReportsWhyWhenAbsent) {
  CudaRuntimeInfo info = cuda_runtime_info();
  if (info.available) {
    EXPECT_FALSE(info.library.empty());
  } else {
    EXPECT_FALSE(info.reason.empty());
  }
}

// Registration is explicit for memory allocated without it: OK and idempotent where a GPU is
// usable; otherwise a clear reason (no runtime, or CUDA's own words where the runtime is there
// but no device or driver is, as in CI) and the buffer stays usable, unregistered.
TEST(CudaRuntime, RegisterWithCudaRegistersOnceOrSaysWhyNot) {
  auto b = PinnedBuffer::allocate(1 << 20, /*lock_memory=*/true, /*cuda_register=*/false);
  ASSERT_TRUE(b.is_ok());
  EXPECT_FALSE(b->cuda_registered());
  Status st = b->register_with_cuda();
  if (st.is_ok()) {
    EXPECT_TRUE(b->cuda_registered());
    EXPECT_TRUE(b->register_with_cuda().is_ok());
  } else {
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
    EXPECT_FALSE(b->cuda_registered());
    const char* want =
        cuda_runtime_info().available ? "cudaHostRegister failed" : "no CUDA runtime";
    EXPECT_NE(st.message().find(want), std::string::npos) << st.to_string();
    b->data()[0] = std::byte{1};
  }
}

}  // namespace
}  // namespace fastpersist
