// SPDX-License-Identifier: Apache-2.0
#include "testing/mount_util.h"

#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <utility>

namespace fastpersist::testing {
namespace {

Status mount_error(int err, const std::string& what, const std::string& target) {
  std::string hint =
      (err == EPERM || err == EACCES) && ::geteuid() != 0 ? " (mounting needs root)" : "";
  return Status::from_errno(err, "cannot mount " + what + hint).with_path(target);
}

}  // namespace

Status enter_private_mount_namespace() {
  if (::unshare(CLONE_NEWNS) != 0) return Status::from_errno(errno, "unshare(CLONE_NEWNS)");
  // Without this, mounts below a shared mount would still propagate to the parent namespace.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return Status::from_errno(errno, "making / a private mount");
  }
  return Status::ok();
}

int run_shell(const std::string& command) {
  int rc = std::system(command.c_str());
  if (rc == -1 || !WIFEXITED(rc)) return -1;
  return WEXITSTATUS(rc);
}

Result<ScopedMount> ScopedMount::memory_fs(const std::string& type, const std::string& target,
                                           uint64_t size_bytes) {
  std::string data = size_bytes != 0 ? "size=" + std::to_string(size_bytes) : "";
  if (::mount(type.c_str(), target.c_str(), type.c_str(), 0,
              data.empty() ? nullptr : data.c_str()) != 0) {
    return mount_error(errno, type, target);
  }
  return ScopedMount(target);
}

Result<ScopedMount> ScopedMount::ext4_image(const std::string& image, const std::string& target,
                                            uint64_t size_bytes) {
  if (::access("/sbin/mkfs.ext4", X_OK) != 0 && ::access("/usr/sbin/mkfs.ext4", X_OK) != 0) {
    return Status(StatusCode::kUnavailable, "mkfs.ext4 not found (apt-get install e2fsprogs)");
  }
  std::string cmd = "truncate -s " + std::to_string(size_bytes) + " '" + image +
                    "' && PATH=$PATH:/sbin:/usr/sbin mkfs.ext4 -q -F '" + image +
                    "' >/dev/null 2>&1";
  if (run_shell(cmd) != 0) {
    return Status(StatusCode::kUnavailable, "mkfs.ext4 failed on the image").with_path(image);
  }
  // mount(8) sets up the loop device (and frees it at unmount, autoclear).
  cmd = "PATH=$PATH:/sbin:/usr/sbin mount -o loop '" + image + "' '" + target + "' 2>&1";
  if (run_shell(cmd) != 0) {
    return Status(StatusCode::kUnavailable,
                  std::string("loop-mounting the ext4 image failed") +
                      (::geteuid() != 0 ? " (mounting needs root)" : " (no loop devices?)"))
        .with_path(target);
  }
  return ScopedMount(target);
}

Result<ScopedMount> ScopedMount::read_only_bind(const std::string& source,
                                                const std::string& target) {
  if (::mount(source.c_str(), target.c_str(), nullptr, MS_BIND, nullptr) != 0) {
    return mount_error(errno, "bind of " + source, target);
  }
  ScopedMount m(target);
  // A bind mount takes its flags from the source; read-only needs a remount of the bind.
  if (::mount(nullptr, target.c_str(), nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr) != 0) {
    return mount_error(errno, "read-only remount", target);
  }
  return m;
}

ScopedMount::~ScopedMount() {
  if (!target_.empty()) ::umount2(target_.c_str(), MNT_DETACH);
}

ScopedMount::ScopedMount(ScopedMount&& other) noexcept
    : target_(std::exchange(other.target_, "")) {}

ScopedMount& ScopedMount::operator=(ScopedMount&& other) noexcept {
  if (this != &other) {
    if (!target_.empty()) ::umount2(target_.c_str(), MNT_DETACH);
    target_ = std::exchange(other.target_, "");
  }
  return *this;
}

Status ScopedMount::unmount() {
  if (target_.empty()) return Status::ok();
  if (::umount2(target_.c_str(), 0) != 0) {
    Status st = Status::from_errno(errno, "umount").with_path(target_);
    return st;
  }
  target_.clear();
  return Status::ok();
}

}  // namespace fastpersist::testing
