// SPDX-License-Identifier: Apache-2.0
// Fault injection for the I/O engine: an IoBackend decorator around a real backend that makes
// chosen operations fail the way disks and kernels fail (leveldb's FaultInjectionTestEnv, one
// level down). Everything not chosen passes through to the real backend untouched, so a test
// sees the engine's real behaviour around exactly one injected fault.
//
// Operations are counted across every backend the factory made (one per engine worker), in the
// order they are submitted; only operations matching FaultSpec::ops are counted.
//
//   auto faults = FaultInjector::create({.kind = FaultKind::kError, .error = EIO, .nth = 3},
//                                       Backend::kIoUring);
//   auto engine = IoEngine::create(options, faults->factory(), "faulty io_uring");
//
// Thread-safety: FaultInjector may be armed and inspected from any thread.
#pragma once

#include <cerrno>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "fastpersist/io_backend.h"
#include "fastpersist/options.h"
#include "fastpersist/status.h"

namespace fastpersist::testing {

enum class FaultKind {
  kNone,         // pass everything through
  kError,        // the operation completes with -error (EIO, ENOSPC, ...); nothing transferred
  kShort,        // part of the bytes are really transferred; the completion says how many
  kNoProgress,   // the operation completes with 0 bytes ("stuck at zero")
  kSubmitError,  // submit() itself fails with `error` before starting the operation
};

enum class FaultOps { kAll, kWrites, kReads };

struct FaultSpec {
  FaultKind kind = FaultKind::kNone;
  int error = EIO;
  uint64_t nth = 1;  // 1-based, counting matching operations only
  FaultOps ops = FaultOps::kAll;
  bool repeat = false;  // every matching operation from the nth on, not only the nth
  // kShort: bytes transferred; 0 means half. Operations too small to shorten pass through
  // untouched and do not count as injected.
  uint64_t short_bytes = 0;
};

// One fault that was injected, for checking the error the engine reported.
struct InjectedFault {
  FaultKind kind = FaultKind::kNone;
  int fd = -1;
  uint64_t file_offset = 0;
  uint64_t length = 0;
  bool is_write = false;
  // The completion's result (bytes or -errno); for a short transfer handed to the real backend,
  // the bytes asked of it; 0 for kSubmitError.
  int64_t result = 0;
};

class FaultInjector : public std::enable_shared_from_this<FaultInjector> {
 public:
  // `inner` makes the real backends; create() fails the test process only through the Result.
  static Result<std::shared_ptr<FaultInjector>> create(FaultSpec spec, Backend inner);
  static std::shared_ptr<FaultInjector> create(FaultSpec spec, BackendFactory inner);

  // For IoEngine::create(options, factory, name). The factory keeps the injector alive.
  BackendFactory factory();

  // Replaces the spec, restarts the count and forgets what was injected so far.
  void arm(FaultSpec spec);
  void disarm() { arm(FaultSpec{}); }

  uint64_t matching_ops() const;
  std::vector<InjectedFault> injected() const;

  // Called by the backends: what to do with `op` (kNone to pass it through).
  FaultSpec decide(const IoOp& op);
  void record(const InjectedFault& fault);

 private:
  FaultInjector(FaultSpec spec, BackendFactory inner);

  BackendFactory inner_;
  mutable std::mutex mu_;
  FaultSpec spec_;
  uint64_t matching_ = 0;
  std::vector<InjectedFault> injected_;
};

}  // namespace fastpersist::testing
