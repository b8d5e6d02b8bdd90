// SPDX-License-Identifier: Apache-2.0
#include "fastpersist/pinned_buffer.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "buffer/cuda_runtime.h"
#include "common/align.h"

namespace fastpersist {
namespace {

std::atomic<bool> g_memlock_warned{false};

size_t page_size() {
  static const size_t size = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

// A process may lock up to its soft RLIMIT_MEMLOCK; raising the soft limit to the hard one needs
// no privilege, and on most servers the hard limit is far larger (often unlimited).
void raise_memlock_soft_limit_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    rlimit lim{};
    if (::getrlimit(RLIMIT_MEMLOCK, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
      lim.rlim_cur = lim.rlim_max;
      (void)::setrlimit(RLIMIT_MEMLOCK, &lim);
    }
  });
}

void warn_unlocked_once(size_t bytes, int err) {
  if (g_memlock_warned.exchange(true)) return;
  rlimit lim{};
  ::getrlimit(RLIMIT_MEMLOCK, &lim);
  std::string limit = lim.rlim_cur == RLIM_INFINITY ? std::string("unlimited")
                                                    : std::to_string(lim.rlim_cur >> 10) + " KiB";
  std::fprintf(
      stderr,
      "fastpersist: warning: cannot lock %zu bytes of buffer memory (%s; RLIMIT_MEMLOCK is "
      "%s); using unlocked page-aligned memory, which works but may be paged out. Raise the "
      "limit with `ulimit -l unlimited` or LimitMEMLOCK=infinity. This warning is shown "
      "once.\n",
      bytes, std::strerror(err), limit.c_str());
}

constexpr size_t kHugePageBytes = size_t{2} << 20;
constexpr size_t kMaxHugeBytes = size_t{256} << 20;

// An anonymous mapping of `bytes` (a multiple of the page size) that starts on a 2 MiB boundary,
// so that transparent huge pages can back all of it: a larger mapping, trimmed at both ends.
void* map_huge_aligned(size_t bytes) {
  size_t len = bytes + kHugePageBytes;
  void* raw = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return raw;
  auto begin = reinterpret_cast<uintptr_t>(raw);
  uintptr_t start = align_up(begin, kHugePageBytes);
  size_t head = start - begin;
  size_t tail = len - head - bytes;
  if (head > 0) ::munmap(raw, head);
  if (tail > 0) ::munmap(reinterpret_cast<void*>(start + bytes), tail);
  return reinterpret_cast<void*>(start);
}

}  // namespace

Result<PinnedBuffer> PinnedBuffer::allocate(size_t bytes, bool lock_memory, bool cuda_register) {
  PinnedBuffer b;
  b.size_ = bytes;
  b.capacity_ = align_up(std::max<size_t>(bytes, 1), page_size());
  // Anonymous mappings are page-aligned and already zero: no memset pass over gigabytes.
  //
  // Locked (staging) buffers from 2 to 256 MiB also ask for transparent huge pages. The device
  // sees the buffer's physical pages: an I/O request carries a bounded number of memory
  // segments (254 on a virtio disk), so over scattered 4 KiB pages a 1 MiB write is cut into
  // two requests (1016 KiB + 8 KiB) and nothing merges, while over 2 MiB pages the block layer
  // merges consecutive writes into requests of max_sectors_kb (4 MiB). Measured on the
  // benchmark VM: a gpt2-large save went from 1.2-1.4 to 1.7-2.3 GB/s, requests from 511 KiB
  // to 4 MiB (docs/performance.md). Staging buffers are allocated once and pooled, so the
  // one-time cost of finding huge pages (12 ms for 64 MiB) does not recur. Larger buffers and
  // one-shot ones (whole-file reads) stay on ordinary pages: compacting gigabytes into huge
  // pages took 4x longer than the 4 KiB allocation and, for reads, more than it saved.
  const bool huge = lock_memory && b.capacity_ >= kHugePageBytes && b.capacity_ <= kMaxHugeBytes;
  void* p = huge ? map_huge_aligned(b.capacity_)
                 : ::mmap(nullptr, b.capacity_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                          -1, 0);
  if (p == MAP_FAILED) {
    return Status::from_errno(errno,
                              "cannot map " + std::to_string(b.capacity_) + " bytes of memory");
  }
  b.data_ = static_cast<std::byte*>(p);
  if (huge) (void)::madvise(p, b.capacity_, MADV_HUGEPAGE);  // advice only: fine if refused
  if (!lock_memory) return b;
  raise_memlock_soft_limit_once();
  if (::mlock(p, b.capacity_) == 0) {
    b.locked_ = true;
  } else {
    warn_unlocked_once(b.capacity_, errno);
  }
  if (cuda_register && buffer::cuda_runtime().available) (void)b.register_with_cuda();  // optional
  return b;
}

Status PinnedBuffer::register_with_cuda() {
  if (cuda_registered_) return Status::ok();
  if (data_ == nullptr) return Status(StatusCode::kInvalidArgument, "no memory to register");
  const buffer::CudaRuntime& cuda = buffer::cuda_runtime();
  if (!cuda.available) return Status(StatusCode::kUnavailable, "no CUDA runtime: " + cuda.reason);
  int rc = cuda.host_register(data_, capacity_, 0);
  if (rc != buffer::kCudaSuccess) {
    // Clear the thread's last CUDA error, or torch's next launch check on this thread would
    // report it as its own.
    (void)cuda.get_last_error();
    return Status(StatusCode::kUnavailable,
                  std::string("cudaHostRegister failed: ") +
                      (cuda.get_error_string(rc) ? cuda.get_error_string(rc) : "?"));
  }
  cuda_registered_ = true;
  return Status::ok();
}

PinnedBuffer::~PinnedBuffer() { release(); }

PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      capacity_(std::exchange(o.capacity_, 0)),
      locked_(std::exchange(o.locked_, false)),
      cuda_registered_(std::exchange(o.cuda_registered_, false)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    capacity_ = std::exchange(o.capacity_, 0);
    locked_ = std::exchange(o.locked_, false);
    cuda_registered_ = std::exchange(o.cuda_registered_, false);
  }
  return *this;
}

bool PinnedBuffer::contains(const void* p, size_t n) const {
  auto begin = reinterpret_cast<uintptr_t>(data_);
  auto q = reinterpret_cast<uintptr_t>(p);
  return data_ != nullptr && q >= begin && n <= capacity_ && q - begin <= capacity_ - n;
}

void PinnedBuffer::release() {
  if (data_ == nullptr) return;
  if (cuda_registered_) buffer::cuda_runtime().host_unregister(data_);
  if (locked_) ::munlock(data_, capacity_);
  ::munmap(data_, capacity_);
  data_ = nullptr;
  size_ = capacity_ = 0;
  locked_ = cuda_registered_ = false;
}

MemlockInfo memlock_info() {
  MemlockInfo info;
  rlimit lim{};
  if (::getrlimit(RLIMIT_MEMLOCK, &lim) == 0) {
    info.soft_limit = lim.rlim_cur == RLIM_INFINITY ? UINT64_MAX : lim.rlim_cur;
    info.hard_limit = lim.rlim_max == RLIM_INFINITY ? UINT64_MAX : lim.rlim_max;
  }
  info.warned = g_memlock_warned.load();
  return info;
}

CudaRuntimeInfo cuda_runtime_info() {
  const buffer::CudaRuntime& rt = buffer::cuda_runtime();
  return {rt.available, rt.library, rt.reason};
}

}  // namespace fastpersist
