// SPDX-License-Identifier: Apache-2.0
// FastFileWriter: a sequential byte stream onto one file at the speed of the storage. It is the
// sink that `torch.save` writes into (through the Python façade).
//
// Bytes are copied into the free half of a pinned double buffer while the other half is written
// by async O_DIRECT requests. A large write whose source address and current file offset are
// block-aligned skips the copy and goes straight to the engine. Pinned memory stays at
// `io_buffer_bytes` however large the file grows.
//
// Commit protocol (the target path never holds a partial file):
//   1. open() creates a temporary file next to the target (same directory, same filesystem);
//   2. write() fills and drains the staging halves at their true offsets; the temporary grows
//      by fallocate() in large steps ahead of the writes (see preallocate_max_bytes);
//   3. close() writes the last partial block, waits for every request, truncates the file to
//      the stream size and checks it, fdatasyncs, renames the temporary onto the target and
//      fsyncs the directory;
//   4. abort(), a failed close(), or destruction without close() delete the temporary.
// A background write error is sticky: it surfaces at the next write() or at close().
//
// Parallel writers: N writers (threads or processes) that each run the same deterministic
// serialization can split the persisting work. Writer r persists stripe k (bytes
// [k*S, (k+1)*S) of the stream, S = stripe_bytes) when k mod N == r, at its true offset in one
// shared temporary file; each writer's close() records that its stripes are durable, and the
// close() that completes the set commits the file. Together they produce ONE file, identical to
// what a single writer produces. A set completes only from writers that saw the same bytes.
// abort() of one writer (or its failed close) removes the shared temporary: the others' close()
// then fails (ECANCELED) and nothing is committed. With commit_timeout_seconds > 0, a close()
// that does not complete the set waits until another writer committed the file (OK,
// file_committed()), a writer aborted (ECANCELED) or the timeout passed (ETIMEDOUT, naming the
// ranks that have not closed and those that serialized different bytes). With the default 0 a
// set that never completes (a missing writer, different bytes) is silent: every close() returns
// OK with file_committed() false. See src/stream/parallel_commit.h for the protocol.
//
// Thread-safety: one writer object is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fastpersist/io_engine.h"
#include "fastpersist/status.h"

namespace fastpersist {

struct FastFileWriterOptions {
  size_t io_buffer_bytes = size_t{64} << 20;  // pinned staging, both halves together
  bool single_io_buffer = false;              // one half: fill, write, wait (no overlap)
  bool zero_copy = true;                      // write aligned source memory without copying
  size_t zero_copy_min_bytes = size_t{1} << 20;
  bool durable = true;  // fdatasync the file and fsync the directory
  // Parallel writers; the default is one writer owning the whole stream.
  unsigned num_writers = 1;
  unsigned writer_rank = 0;
  size_t stripe_bytes = size_t{32} << 20;  // multiple of 4096
  // How long a parallel writer's close() that does not complete the set waits for the others to
  // commit the file; 0: return as soon as its own stripes are durable and recorded. Finite, >= 0;
  // a century or more waits without a deadline.
  double commit_timeout_seconds = 0;
  // Grow the file with fallocate() ahead of the writes, in steps that double up to
  // `preallocate_max_bytes` (at least 256 MiB), and truncate it to the stream size at close.
  // Without it every drain extends the file, and on ext4/xfs the fallocate (or the
  // size-extending O_DIRECT write) first waits for all direct I/O in flight, so the two staging
  // halves never overlap on the device. 0 disables it.
  size_t preallocate_max_bytes = size_t{1} << 30;
};

struct FastFileWriterStats {
  uint64_t bytes = 0;  // bytes of the stream seen by write()
  uint64_t persisted_bytes =
      0;  // bytes this writer wrote to the file (all of them unless parallel)
  uint64_t write_calls = 0;
  double write_seconds = 0;  // time inside write() and close()
  uint64_t fill_bytes = 0;   // copied into the staging buffer
  double fill_seconds = 0;
  uint64_t zero_copy_bytes = 0;   // written straight from the caller's memory
  uint64_t slow_path_bytes = 0;   // the final unaligned tail, written through the page cache
  double io_wait_seconds = 0;     // blocked waiting for the device
  uint64_t drains = 0;            // staging halves submitted
  size_t pinned_bytes = 0;        // staging memory held
  std::string to_string() const;  // one line, DeepSpeed-like keys, GB/s in 1e9 bytes
};

class FastFileWriter {
 public:
  // `engine` may be shared with other users (the writer waits on its own tickets only); null
  // makes a private one with default options.
  static Result<std::unique_ptr<FastFileWriter>> open(const std::string& path,
                                                      const FastFileWriterOptions& options = {},
                                                      std::shared_ptr<IoEngine> engine = nullptr);
  ~FastFileWriter();  // abort() unless closed
  FastFileWriter(const FastFileWriter&) = delete;
  FastFileWriter& operator=(const FastFileWriter&) = delete;

  // Appends `bytes` bytes. The memory may be reused as soon as write() returns.
  Status write(const void* data, size_t bytes);
  // Commits the file (see the protocol above). With parallel writers, the file appears when the
  // last writer closed; `committed()` tells whether this close() was that one. Parallel errors:
  // kIoError with errno ECANCELED when another writer aborted, ETIMEDOUT when the set did not
  // complete within commit_timeout_seconds; in both cases this writer left no file at the target.
  Status close();
  // Discards everything; the target is left as it was. Safe to call at any time, repeatedly.
  void abort();

  bool closed() const;
  bool committed() const;
  // The file is committed at path(): by this close(), or by another parallel writer while this
  // one waited (commit_timeout_seconds). False after a close() that returned without knowing.
  bool file_committed() const;
  uint64_t bytes_written() const;
  const std::string& path() const;
  const std::string& temp_path() const;
  FastFileWriterStats stats() const;
  // The options in force (as given to open()).
  const FastFileWriterOptions& options() const;

 private:
  class Impl;  // all of the writer's state (fast_file_writer.cc)
  explicit FastFileWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fastpersist
