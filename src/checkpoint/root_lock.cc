// SPDX-License-Identifier: Apache-2.0
#include "checkpoint/root_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "checkpoint_dir/checkpoint_fs.h"
#include "common/regular_file.h"

namespace fastpersist::checkpoint {

Result<RootLock> RootLock::acquire(const std::string& root) {
  std::string path = join_path(root, kLockFileName);
  FP_ASSIGN_OR_RETURN(UniqueFd fd,
                      open_or_create_regular_file(path, O_RDWR, "the root's lock file"));
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    if (err != EWOULDBLOCK) return Status::from_errno(err, "cannot lock the root").with_path(path);
    std::string holder;
    char buf[32] = {};
    ssize_t n = ::pread(fd.get(), buf, sizeof(buf) - 1, 0);
    if (n > 0) {
      holder = std::string(buf, static_cast<size_t>(n));
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    }
    return Status(StatusCode::kBusy, "checkpoint root " + root +
                                         " is in use by another CheckpointManager" +
                                         (holder.empty() ? "" : " (pid " + holder + ")") +
                                         "; close that manager first, or use another root")
        .with_path(path);
  }
  std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd.get(), 0) == 0) {
    // The pid is only for the message above; failing to record it is harmless.
    (void)!::pwrite(fd.get(), pid.data(), pid.size(), 0);
  }
  return RootLock(std::move(fd));
}

}  // namespace fastpersist::checkpoint
