// SPDX-License-Identifier: Apache-2.0
// IoEngine: moves bytes between memory and files at the speed of the storage.
//
// A request (read or write, any length, any file offset, any buffer address) is split into
// `intra_op_parallelism` contiguous slices, one per worker thread; each worker cuts its slice into
// `block_size` requests and keeps up to `queue_depth` of them in flight on its own backend queue.
// The block-aligned body goes O_DIRECT; an unaligned head or tail, and bodies in files whose
// filesystem refuses O_DIRECT, go through the page cache. Every completion is checked: a failed
// transfer becomes an error with errno, path, offset and length; a short one is resumed, and a
// transfer that stops making progress is an error. A file is never silently short.
//
// Files named by path are opened when the request is submitted (on the caller's thread, in
// submission order) and closed when it completes. A write updates the file in place at any
// offset, so requests on disjoint ranges of one file (from any number of threads) never destroy
// each other's bytes; a rewrite shorter than the file leaves the old tail in place. Only a write
// that sets `truncate` empties the file first (O_TRUNC at submission), so it then ends at
// file_offset + length. Requests on a caller's fd never truncate and never close that fd.
//
// Thread-safety: submit/sync/wait may be called from any thread. The destructor waits for every
// request in flight; buffers must stay valid until their request completed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fastpersist/io_backend.h"
#include "fastpersist/memory_kind.h"
#include "fastpersist/options.h"
#include "fastpersist/status.h"

namespace fastpersist {

enum class IoKind { kRead, kWrite };

struct IoRequest {
  IoKind kind = IoKind::kWrite;
  std::byte* buffer = nullptr;  // source of a write, destination of a read
  uint64_t length = 0;
  std::string path;  // the file by name, or ...
  int fd = -1;       // ... an open file descriptor of the caller (path ignored when fd >= 0)
  uint64_t file_offset = 0;
  // Writes by path only: empty the file when the request is submitted (O_TRUNC), replacing
  // whatever it held, including bytes of earlier requests still in flight. Off by default:
  // truncation destroys data, so the caller has to ask for it.
  bool truncate = false;
  // Where `buffer` lives. The engine moves host memory only: its workers memcpy through bounce
  // blocks and hand the address to pread/pwrite and the kernel, none of which may see device
  // memory, so a request for device memory is refused (kInvalidArgument) before anything is
  // opened. Callers stage device memory through pinned host memory (AioHandle) or give it to
  // cuFile (GdsHandle).
  MemoryKind memory = MemoryKind::kHost;
  int device = -1;  // the CUDA device of kCudaDevice memory
};

// How the engine opened a file; returned by probe_file and kept in the statistics.
struct FileIoMode {
  bool direct = false;               // O_DIRECT used for the aligned body
  std::string fallback_reason;       // why not, when direct was wanted
  uint32_t offset_alignment = 4096;  // file offsets and lengths of O_DIRECT requests
  uint32_t memory_alignment = 4096;  // buffer addresses of O_DIRECT requests
};

struct IoStats {
  uint64_t requests = 0;  // IoRequests completed
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;
  uint64_t direct_bytes = 0;      // moved with O_DIRECT
  uint64_t buffered_bytes = 0;    // moved through the page cache (small, unaligned or fallback)
  uint64_t bounce_bytes = 0;      // copied through aligned bounce memory (misaligned buffers)
  uint64_t short_transfers = 0;   // completions shorter than asked, resumed
  uint64_t direct_fallbacks = 0;  // files whose filesystem refused O_DIRECT
  std::string last_fallback_reason;
};

class IoEngine;

// The completion of one request. Copyable; all copies share one state, which keeps the file
// open until the request finished, so a ticket may outlive the engine that issued it.
class IoTicket {
 public:
  struct State;
  IoTicket() = default;
  explicit IoTicket(std::shared_ptr<State> state) : state_(std::move(state)) {}
  bool valid() const { return state_ != nullptr; }
  bool done() const;
  // Blocks until the request finished; the bytes transferred or its first error.
  Result<uint64_t> wait() const;

 private:
  std::shared_ptr<State> state_;
};

class IoEngine {
 public:
  // Validates options, resolves Backend::kAuto, starts the workers.
  static Result<std::unique_ptr<IoEngine>> create(const EngineOptions& options);
  // Same, with a caller-supplied backend (fault injection, custom queues).
  static Result<std::unique_ptr<IoEngine>> create(const EngineOptions& options,
                                                  BackendFactory factory, std::string name);
  ~IoEngine();
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  // Options in force; options().backend is the resolved backend (never kAuto unless custom).
  const EngineOptions& options() const;
  const std::string& backend_name() const;
  // One sentence: why this backend was picked (AUTO's probe results).
  const std::string& backend_reason() const;

  // Starts a request. Argument and open errors are returned at once; I/O errors at wait().
  Result<IoTicket> submit(const IoRequest& request);
  // Like submit, but the ticket is the only way to collect the result: wait() ignores it. For
  // components that share an engine and must not wait on each other's requests.
  Result<IoTicket> start(const IoRequest& request);
  // start + wait.
  Result<uint64_t> run(const IoRequest& request);
  // Waits for every request submitted and not yet waited for by this call; returns how many
  // completed. If any failed, returns the first failure (after all of them finished).
  Result<size_t> wait();
  // Requests submitted and not yet collected by wait().
  size_t pending() const;

  IoStats stats() const;

  struct Impl;

 private:
  explicit IoEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// How the engine would open `path` for writing (creating nothing): O_DIRECT support and the
// alignment it requires. For a folder, probes a temporary file inside it.
Result<FileIoMode> probe_file_io(const std::string& path);

}  // namespace fastpersist
