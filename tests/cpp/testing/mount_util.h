// SPDX-License-Identifier: Apache-2.0
// Real filesystems for tests that need one with particular properties: a tiny ext4 image that
// fills up (ENOSPC), tmpfs, ramfs (refuses O_DIRECT), a read-only mount (EROFS even for root).
// Mounting needs root (CAP_SYS_ADMIN); every helper says why it could not, so the test can skip
// with that reason instead of failing.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "fastpersist/status.h"

namespace fastpersist::testing {

// Moves the calling thread (and the threads it starts later) into a private mount namespace,
// so mounts made by this test process are invisible to other processes and disappear with it
// even if the test crashes. Only an optimisation: when refused, mounts stay in the shared
// namespace and are removed by ScopedMount as usual.
Status enter_private_mount_namespace();

// A mount that is lazily unmounted (MNT_DETACH) when the object goes out of scope.
class ScopedMount {
 public:
  // tmpfs or ramfs at `target` (an existing folder); size 0 means the filesystem's default.
  static Result<ScopedMount> memory_fs(const std::string& type, const std::string& target,
                                       uint64_t size_bytes = 0);
  // A fresh ext4 filesystem of `size_bytes` in `image` (created here; mkfs.ext4 must exist),
  // loop-mounted at `target`.
  static Result<ScopedMount> ext4_image(const std::string& image, const std::string& target,
                                        uint64_t size_bytes);
  // `source` (a folder) bind-mounted read-only at `target`.
  static Result<ScopedMount> read_only_bind(const std::string& source, const std::string& target);

  ScopedMount() = default;
  ~ScopedMount();
  ScopedMount(ScopedMount&& other) noexcept;
  ScopedMount& operator=(ScopedMount&& other) noexcept;
  ScopedMount(const ScopedMount&) = delete;
  ScopedMount& operator=(const ScopedMount&) = delete;

  const std::string& target() const { return target_; }
  // Unmounts now; an error if the kernel refused.
  Status unmount();

 private:
  explicit ScopedMount(std::string target) : target_(std::move(target)) {}
  std::string target_;  // empty when nothing is mounted
};

// Runs a command through /bin/sh; its exit status (or -1). Output goes to the test log.
int run_shell(const std::string& command);

}  // namespace fastpersist::testing
