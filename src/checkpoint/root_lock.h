// SPDX-License-Identifier: Apache-2.0
// The lock that makes one CheckpointManager the only writer of a root: flock() on <root>/.lock,
// held while the manager is open. flock locks belong to the open file, so a second manager in
// the same process is refused just like one in another process; the kernel drops the lock when
// the holder dies, so a crash never leaves a root locked.
#pragma once

#include <string>

#include "common/unique_fd.h"
#include "fastpersist/layout.h"
#include "fastpersist/status.h"

namespace fastpersist::checkpoint {

class RootLock {
 public:
  // kBusy (with the holder's pid when known) if another manager holds it.
  static Result<RootLock> acquire(const std::string& root);
  RootLock() = default;
  RootLock(RootLock&&) = default;
  RootLock& operator=(RootLock&&) = default;
  void release() { fd_.reset(); }
  bool held() const { return fd_.valid(); }

 private:
  explicit RootLock(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

}  // namespace fastpersist::checkpoint
