// SPDX-License-Identifier: Apache-2.0
// IoBackend: the one seam between fastpersist and the kernel's I/O interfaces.
//
// A backend is a submission/completion queue for block-sized reads and writes on file
// descriptors, nothing more: splitting, alignment, O_DIRECT fallback, retries of short transfers
// and error context all live in the engine above it, so every backend behaves the same and one
// conformance suite checks them all. Backends: io_uring (uring_backend.cc), libaio
// (aio_backend.cc), a pool of pread/pwrite threads (thread_pool_backend.cc); tests add a
// fault-injecting one.
//
// Thread-safety: a backend is used by exactly one engine worker thread at a time.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "fastpersist/options.h"
#include "fastpersist/status.h"

namespace fastpersist {

struct IoOp {
  int fd = -1;
  std::byte* buffer = nullptr;
  uint64_t length = 0;
  uint64_t file_offset = 0;
  bool is_write = false;
  uint64_t tag = 0;  // returned unchanged in the completion
};

struct IoCompletion {
  uint64_t tag = 0;
  int64_t result = 0;  // bytes transferred (may be short), or -errno
};

class IoBackend {
 public:
  virtual ~IoBackend() = default;
  virtual std::string_view name() const = 0;
  // The most ops that may be in flight at once (submitted, not yet reaped).
  virtual unsigned capacity() const = 0;
  // Starts `ops`; the caller never exceeds capacity(). Sets *accepted to how many were started
  // (those must be reaped). A non-OK status means the rest were not started and the queue
  // cannot be trusted with more work.
  virtual Status submit(std::span<const IoOp> ops, size_t* accepted) = 0;
  // Blocks until at least `min_complete` ops have finished (0: do not block) and stores up to
  // out.size() completions. Returns how many were stored.
  virtual Result<size_t> reap(std::span<IoCompletion> out, size_t min_complete) = 0;
};

// Makes one backend for one worker, with room for `queue_depth` ops in flight.
using BackendFactory = std::function<Result<std::unique_ptr<IoBackend>>(unsigned queue_depth)>;

// Whether a backend can run here, and if not, why and how to fix it.
struct BackendProbe {
  Backend backend = Backend::kThreads;
  bool built_in = false;   // compiled into this build
  bool available = false;  // built in and accepted by this kernel/process
  std::string reason;      // why not (or a short note when available)
  std::string fix;         // what a user can do about it, empty if nothing
};

BackendProbe probe_backend(Backend backend);
// Probes io_uring, libaio, threads in that order of preference.
std::array<BackendProbe, 3> probe_all_backends();

// The factory for a concrete backend (not kAuto), or kUnavailable with the probe's reason.
Result<BackendFactory> backend_factory(Backend backend);

// Resolves kAuto to the best available backend; `why` receives a sentence explaining the choice.
Result<Backend> resolve_backend(Backend requested, std::string* why = nullptr);

}  // namespace fastpersist
