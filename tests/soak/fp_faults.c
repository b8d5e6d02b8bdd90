// SPDX-License-Identifier: Apache-2.0
// LD_PRELOAD fault injector for the soak test (tests/soak/soak.py): fsync and fdatasync fail
// with EIO, without syncing, in FP_FAULT_FSYNC_PERMILLE of the calls on files under
// FP_FAULT_ROOT (a storage error as fsyncgate describes it: the data may never reach the disk).
// Decisions come from a per-process random sequence seeded by the pid, so forked children
// differ. The variables stay in the environment: children forked or started inherit the faults.

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static __thread uint64_t t_state;
static __thread pid_t t_pid;

static int under_root(int fd) {
  const char* root = getenv("FP_FAULT_ROOT");
  if (!root || !*root) return 0;
  char link[64], target[PATH_MAX];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0) return 0;
  target[n] = '\0';
  size_t len = strlen(root);
  return strncmp(target, root, len) == 0 && (target[len] == '/' || target[len] == '\0');
}

static int inject(int fd) {
  const char* rate = getenv("FP_FAULT_FSYNC_PERMILLE");
  if (!rate || !under_root(fd)) return 0;
  pid_t pid = (pid_t)syscall(SYS_getpid);
  if (t_pid != pid) {  // a new process (fork) or thread: a sequence of its own
    t_pid = pid;
    t_state = ((uint64_t)pid << 32) ^ (uint64_t)syscall(SYS_gettid) ^ 0x9E3779B97F4A7C15ull;
  }
  t_state ^= t_state << 13;
  t_state ^= t_state >> 7;
  t_state ^= t_state << 17;
  return (long)(t_state % 1000) < atol(rate);
}

int fsync(int fd) {
  if (!real_fsync) real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  if (inject(fd)) {
    errno = EIO;
    return -1;
  }
  return real_fsync(fd);
}

int fdatasync(int fd) {
  if (!real_fdatasync) real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
  if (inject(fd)) {
    errno = EIO;
    return -1;
  }
  return real_fdatasync(fd);
}
