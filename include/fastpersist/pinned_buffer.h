// SPDX-License-Identifier: Apache-2.0
// Pinned host memory: page-aligned, locked in RAM (mlock) so the kernel can DMA straight from it,
// and registered with CUDA when libcudart is present at run time (never needed to build).
//
// When RLIMIT_MEMLOCK is too small, allocation still succeeds with unlocked page-aligned memory
// and prints one warning per process saying how to raise the limit; `locked()` tells which.
//
// Thread-safety: a PinnedBuffer is a move-only value owned by one user; PinnedBufferPool is
// safe to use from any thread.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fastpersist/status.h"

namespace fastpersist {

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  // Page-aligned memory of at least `bytes` (rounded up to whole pages), zero-filled. With
  // `lock_memory` false the memory is only aligned (for large read buffers that need O_DIRECT
  // alignment but should not count against the memlock limit). Locked memory is also
  // registered with the CUDA runtime when one is loaded, unless `cuda_register` is false: the
  // registration acts on the calling thread's current device and creates its CUDA context if
  // there is none, so threads that have not selected a device (background workers) pass false
  // and call register_with_cuda() once they have.
  static Result<PinnedBuffer> allocate(size_t bytes, bool lock_memory = true,
                                       bool cuda_register = true);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }          // as requested
  size_t capacity() const { return capacity_; }  // whole pages actually reserved
  bool locked() const { return locked_; }
  bool cuda_registered() const { return cuda_registered_; }
  // Registers the memory with the CUDA runtime (page-locked for DMA) if it is not yet; OK when
  // registered, else why not. Failures leave no pending CUDA error behind.
  Status register_with_cuda();
  bool contains(const void* p, size_t n) const;

 private:
  friend class PinnedBufferPool;  // re-sizes a cached buffer when handing it out again
  void release();
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
  bool locked_ = false;
  bool cuda_registered_ = false;
};

// Reuses pinned buffers: mlock and CUDA registration are slow, so released buffers are kept
// (up to `max_cached_bytes`) and handed out again for requests that fit.
class PinnedBufferPool {
 public:
  explicit PinnedBufferPool(size_t max_cached_bytes = size_t{1} << 30);
  ~PinnedBufferPool();

  // A buffer of at least `bytes`; returned to the pool when the last shared_ptr goes away,
  // even if that happens after the pool was destroyed (then it is freed).
  Result<std::shared_ptr<PinnedBuffer>> acquire(size_t bytes);
  size_t cached_bytes() const;

  struct Shared;

 private:
  std::shared_ptr<Shared> shared_;
};

// The process-wide pool that writers and readers take their staging memory from.
PinnedBufferPool& default_pinned_pool();

// Memory-locking limits and what happened so far, for `fastpersist report`.
struct MemlockInfo {
  uint64_t soft_limit = 0;  // bytes; UINT64_MAX means unlimited
  uint64_t hard_limit = 0;
  bool warned = false;  // a fallback to unlocked memory already happened
};
MemlockInfo memlock_info();

// Whether libcudart was found at run time, and where ("" if not), for `fastpersist report`.
struct CudaRuntimeInfo {
  bool available = false;
  std::string library;
  std::string reason;
};
CudaRuntimeInfo cuda_runtime_info();

// OK when checkpoint snapshots can copy tensors from the memory of CUDA device `device`
// (TensorSource::device): the runtime is loaded, the device can be selected and a copy stream
// created on this thread. Otherwise the reason.
Status cuda_device_copy_ready(int device);

}  // namespace fastpersist
