// SPDX-License-Identifier: Apache-2.0
// AioHandle: DeepNVMe's `aio_handle` API on top of IoEngine, for code ported from DeepSpeed.
//
// Same knobs, method names and return values as DeepNVMe: sync calls return how many requests
// completed (the new one plus any earlier async ones they drained), async calls return 0 and are
// collected by wait(). Unlike DeepNVMe, any size and offset works, every error is reported (as a
// Status carrying errno, path, offset, length), and writes by name at offset 0 replace the file.
//
// Buffers passed to async calls must stay valid until wait() returned.
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fastpersist/io_engine.h"
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
  Result<int> pwrite(const void* buffer, size_t bytes, const std::string& path, bool validate,
                     bool async_op, uint64_t file_offset = 0);
  Result<int> pread(void* buffer, size_t bytes, const std::string& path, bool validate,
                    bool async_op, uint64_t file_offset = 0);
  Result<int> sync_pwrite(const void* buffer, size_t bytes, const std::string& path, uint64_t file_offset = 0);
  Result<int> sync_pread(void* buffer, size_t bytes, const std::string& path, uint64_t file_offset = 0);
  Result<int> async_pwrite(const void* buffer, size_t bytes, const std::string& path, uint64_t file_offset = 0);
  Result<int> async_pread(void* buffer, size_t bytes, const std::string& path, uint64_t file_offset = 0);
  // Same on a caller's open descriptor (never closed or truncated by the handle).
  Result<int> async_pwrite_fd(const void* buffer, size_t bytes, int fd, uint64_t file_offset = 0);
  Result<int> async_pread_fd(void* buffer, size_t bytes, int fd, uint64_t file_offset = 0);

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

  IoEngine& engine() { return *engine_; }

 private:
  struct Validation {
    bool is_write;
    const std::byte* buffer;
    size_t bytes;
    std::string path;
    int fd;
    uint64_t offset;
    IoTicket ticket;
  };
  explicit AioHandle(std::unique_ptr<IoEngine> engine);
  Result<int> start(IoRequest request, bool validate, bool async_op);
  Status run_validations(std::vector<Validation> checks);

  std::unique_ptr<IoEngine> engine_;
  PinnedBufferPool pool_;
  mutable std::mutex mu_;
  std::vector<Validation> pending_validations_;
  std::vector<std::shared_ptr<PinnedBuffer>> locked_;
};

}  // namespace fastpersist
