// SPDX-License-Identifier: Apache-2.0
// AioHandle: DeepNVMe's `aio_handle` API on top of IoEngine, for code ported from DeepSpeed.
//
// Same knobs, method names and return values as DeepNVMe: sync calls return how many requests
// completed (the new one plus any earlier async ones they drained), async calls return 0 and are
// collected by wait(). Unlike DeepNVMe, any size and offset works and every error is reported (as
// a Status carrying errno, path, offset, length).
//
// Writes update the file in place, like DeepNVMe's: requests on disjoint ranges of one file, from
// any number of threads, never destroy each other's bytes, and a rewrite shorter than the file
// leaves its old tail in place. A write by path empties the file first only when the caller
// passes `truncate` (then the file ends at file_offset + bytes).
//
// Buffers are (pointer, byte count): the caller guarantees that [buffer, buffer + bytes) is its
// memory (the Python bindings check this against the object they were given). Buffers passed to
// async calls must stay valid until wait() returned.
//
// CUDA device memory (the MemorySpan overloads, as DeepNVMe's aio_handle takes device tensors)
// is staged through pinned host memory, chunk by chunk, on a thread of the handle's own:
// device-to-host copies on its own non-blocking stream overlap the file writes of the chunks
// before, and reads overlap the host-to-device copies of the chunks before
// (src/handle/device_staging.h). Stream semantics: those copies do not wait for work the caller
// queued on its streams, so the caller must have finished writing the memory it hands over
// (the Python façade synchronizes the tensor's current stream before the call) and must leave
// it alone until the request completed; a read's bytes are on the device when wait() (or the
// sync call) returned. `validate` needs host memory (kInvalidArgument for device memory).
// Without a usable CUDA runtime a device call fails with kUnavailable before anything changes.
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fastpersist/io_engine.h"
#include "fastpersist/memory_kind.h"
#include "fastpersist/options.h"
#include "fastpersist/pinned_buffer.h"
#include "fastpersist/status.h"

namespace fastpersist {

class AioHandle {
 public:
  static Result<std::unique_ptr<AioHandle>> create(const EngineOptions& options);
  ~AioHandle();  // waits for requests in flight

  size_t get_block_size() const;
  unsigned get_queue_depth() const;
  bool get_single_submit() const;
  bool get_overlap_events() const;
  unsigned get_intra_op_parallelism() const;
  // Buffer sizes that are multiples of this split into equal, block-aligned worker slices
  // (DeepNVMe: intra_op_parallelism * 512; here 4096, the page and common O_DIRECT unit).
  size_t get_alignment() const;

  // `validate` re-reads the file range after the transfer and compares it with the buffer;
  // a mismatch is an error. `async_op` returns 0 at once; wait() collects the result.
  // `truncate` (writes by path): empty the file when the request is submitted.
  Result<int> pwrite(const void* buffer, size_t bytes, const std::string& path, bool validate,
                     bool async_op, uint64_t file_offset = 0, bool truncate = false);
  Result<int> pread(void* buffer, size_t bytes, const std::string& path, bool validate,
                    bool async_op, uint64_t file_offset = 0);
  Result<int> sync_pwrite(const void* buffer, size_t bytes, const std::string& path,
                          uint64_t file_offset = 0, bool truncate = false);
  Result<int> sync_pread(void* buffer, size_t bytes, const std::string& path,
                         uint64_t file_offset = 0);
  Result<int> async_pwrite(const void* buffer, size_t bytes, const std::string& path,
                           uint64_t file_offset = 0, bool truncate = false);
  Result<int> async_pread(void* buffer, size_t bytes, const std::string& path,
                          uint64_t file_offset = 0);
  // Same on a caller's open descriptor (never closed or truncated by the handle).
  Result<int> async_pwrite_fd(const void* buffer, size_t bytes, int fd, uint64_t file_offset = 0);
  Result<int> async_pread_fd(void* buffer, size_t bytes, int fd, uint64_t file_offset = 0);

  // The same calls for memory of either kind (see the top of this file for device memory).
  Result<int> pwrite(const MemorySpan& buffer, const std::string& path, bool validate,
                     bool async_op, uint64_t file_offset = 0, bool truncate = false);
  Result<int> pread(const MemorySpan& buffer, const std::string& path, bool validate, bool async_op,
                    uint64_t file_offset = 0);
  Result<int> async_pwrite_fd(const MemorySpan& buffer, int fd, uint64_t file_offset = 0);
  Result<int> async_pread_fd(const MemorySpan& buffer, int fd, uint64_t file_offset = 0);

  // Blocks until every request submitted so far finished; returns how many. If any failed,
  // returns the first error (all of them finished first). With nothing pending returns 0.
  Result<int> wait();

  // Pinned host memory owned by the handle until freed (or the handle dies).
  Result<std::shared_ptr<PinnedBuffer>> new_cpu_locked_buffer(size_t bytes);
  // Forgets a buffer from new_cpu_locked_buffer (memory is freed when no one holds it).
  // False if `data` is not the start of such a buffer.
  bool free_cpu_locked_buffer(const void* data);
  // True when [data, data + bytes) lies inside one buffer from new_cpu_locked_buffer.
  bool is_pinned(const void* data, size_t bytes) const;

  IoEngine& engine();

 private:
  struct Impl;  // the engine, the pinned-buffer pool and the pending validations
  explicit AioHandle(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fastpersist
