// SPDX-License-Identifier: Apache-2.0
// LD_PRELOAD recorder for the power-loss simulation (tests/python/test_power_loss.py).
//
// A process started with LD_PRELOAD=fp_crashsim.so, FP_CRASHSIM_ROOT=<dir> and
// FP_CRASHSIM_OUT=<dir> records every call that changes what a power cut could leave under
// ROOT: fsync, fdatasync, rename(at/at2), unlink(at), mkdir(at), rmdir and creating opens (open*,
// the fortified __open*_2, mkstemp, mkostemp). After each such call returns, it writes one
// event line and a snapshot of the whole tree under ROOT
// (every entry's type, identity, size and a copy of its bytes, copied only when they changed).
// tests/python/_crashsim.py turns those records into the states a power cut at each event could
// leave: data not yet synced dropped or torn, and directory entries not yet synced undone.
//
// The program under test marks what it has acknowledged with fp_crashsim_mark("..."), called
// through ctypes; a mark is an event too.
//
// Several processes may record into one OUT at once (the ranks of a distributed save, each
// started with the recorder preloaded): the event counter, the copy counter and the table of
// copied files live in OUT/shared, mapped into every process, and each event is recorded under
// an exclusive flock of that file (besides the process's own mutex, since a flock does not
// exclude the threads of one process). So the events of all processes form one sequence, each
// with the snapshot of the tree at that point. The first process to record writes event 0,
// the tree before anything changed; each process writes an `init` event when it starts.
//
// The recorder does its own file work with raw system calls and a per-thread guard, so it never
// records itself. It removes LD_PRELOAD and its variables from the environment at load, so
// child processes run unrecorded. Identity of a file: inode and birth time (statx), so an inode
// number reused after an unlink is a different file.

#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_FILES 8192

typedef struct {
  uint64_t ino;
  int64_t birth_ns;
  int64_t size;
  int64_t mtime_ns;
  long copy;
  int used;
} Copied;

// Shared by every process recording into one OUT (mapped from OUT/shared).
typedef struct {
  long seq;
  long copies;
  Copied copied[MAX_FILES];
} Shared;

static int g_active;
static char g_root[PATH_MAX];
static size_t g_root_len;
static char g_out[PATH_MAX];
static int g_events_fd = -1;
static int g_shared_fd = -1;
static Shared* g_shared;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int t_inside;

static int raw_open(const char* path, int flags, mode_t mode) {
  return (int)syscall(SYS_openat, AT_FDCWD, path, flags | O_CLOEXEC, mode);
}

static void write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    data += w;
    n -= (size_t)w;
  }
}

static void writef(int fd, const char* fmt, ...) {
  char line[3 * PATH_MAX];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (n > 0) write_all(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

// Identity and times of an entry, without following a final symlink.
static int entry_stat(const char* path, struct statx* sx) {
  return (int)syscall(SYS_statx, AT_FDCWD, path, AT_SYMLINK_NOFOLLOW,
                      STATX_BASIC_STATS | STATX_BTIME, sx);
}

static int64_t birth_ns(const struct statx* sx) {
  if (!(sx->stx_mask & STATX_BTIME)) return 0;
  return (int64_t)sx->stx_btime.tv_sec * 1000000000 + sx->stx_btime.tv_nsec;
}

static Copied* copied_slot(uint64_t ino, int64_t birth) {
  size_t h = (size_t)((ino * 0x9E3779B97F4A7C15ull) ^ (uint64_t)birth) % MAX_FILES;
  for (size_t i = 0; i < MAX_FILES; ++i) {
    Copied* c = &g_shared->copied[(h + i) % MAX_FILES];
    if (!c->used || (c->ino == ino && c->birth_ns == birth)) return c;
  }
  return NULL;
}

// Copies the file's bytes (or a symlink's target) into OUT/data/<n>; returns n, or -1.
static long copy_content(const char* path, int is_link) {
  char dst[PATH_MAX];
  long n = ++g_shared->copies;
  snprintf(dst, sizeof dst, "%s/data/%ld", g_out, n);
  int out = raw_open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (out < 0) return -1;
  if (is_link) {
    char target[PATH_MAX];
    ssize_t len = readlink(path, target, sizeof target);
    if (len > 0) write_all(out, target, (size_t)len);
  } else {
    int in = raw_open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK, 0);
    if (in >= 0) {
      char buf[1 << 16];
      ssize_t r;
      while ((r = read(in, buf, sizeof buf)) > 0) write_all(out, buf, (size_t)r);
      close(in);
    }
  }
  close(out);
  return n;
}

// One line per entry: type, inode, birth, size, copy, path relative to ROOT.
static void snapshot_dir(int out, const char* abs, const char* rel, int depth) {
  if (depth > 64) return;
  DIR* d = opendir(abs);
  if (!d) return;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    char child_abs[PATH_MAX], child_rel[PATH_MAX];
    snprintf(child_abs, sizeof child_abs, "%s/%s", abs, e->d_name);
    snprintf(child_rel, sizeof child_rel, "%s%s%s", rel, rel[0] ? "/" : "", e->d_name);
    struct statx sx;
    if (entry_stat(child_abs, &sx) != 0) continue;  // removed while we walked
    char type = S_ISDIR(sx.stx_mode) ? 'd' : S_ISREG(sx.stx_mode) ? 'f' : S_ISLNK(sx.stx_mode) ? 'l' : 'o';
    int64_t birth = birth_ns(&sx);
    int64_t mtime = (int64_t)sx.stx_mtime.tv_sec * 1000000000 + sx.stx_mtime.tv_nsec;
    long copy = 0;
    if (type == 'f' || type == 'l') {
      Copied* c = copied_slot(sx.stx_ino, birth);
      if (c && c->used && c->size == (int64_t)sx.stx_size && c->mtime_ns == mtime) {
        copy = c->copy;
      } else {
        copy = copy_content(child_abs, type == 'l');
        if (c) *c = (Copied){sx.stx_ino, birth, (int64_t)sx.stx_size, mtime, copy, 1};
      }
    }
    writef(out, "%c\t%llu\t%lld\t%lld\t%ld\t%s\n", type, (unsigned long long)sx.stx_ino,
           (long long)birth, (long long)sx.stx_size, copy, child_rel);
    if (type == 'd') snapshot_dir(out, child_abs, child_rel, depth + 1);
  }
  closedir(d);
}

static void record_locked(const char* kind, const char* a, const char* b) {
  long seq = g_shared->seq++;
  // A synced file's bytes are copied again whatever its size and mtime say: another thread's
  // event may have copied it while a write in flight (io_uring, libaio: unseen) had set its
  // final size but not all its bytes, with an mtime that did not change since.
  unsigned long long sync_ino = 0;
  long long sync_birth = 0;
  if (strcmp(kind, "sync") == 0 && a && sscanf(a, "f:%llu:%lld", &sync_ino, &sync_birth) == 2) {
    Copied* c = copied_slot((uint64_t)sync_ino, (int64_t)sync_birth);
    if (c) c->used = 0;
  }
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/tree/%ld", g_out, seq);
  int out = raw_open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (out >= 0) {
    struct statx sx;
    if (entry_stat(g_root, &sx) == 0) {
      writef(out, "d\t%llu\t%lld\t0\t0\t.\n", (unsigned long long)sx.stx_ino,
             (long long)birth_ns(&sx));
    }
    snapshot_dir(out, g_root, "", 0);
    close(out);
  }
  writef(g_events_fd, "%ld\t%s\t%ld\t%s\t%s\n", seq, kind, (long)syscall(SYS_gettid), a ? a : "",
         b ? b : "");
}

static void record(const char* kind, const char* a, const char* b) {
  if (!g_active || t_inside) return;
  int saved = errno;
  t_inside = 1;
  pthread_mutex_lock(&g_mu);
  while (flock(g_shared_fd, LOCK_EX) != 0 && errno == EINTR) {
  }
  record_locked(kind, a, b);
  flock(g_shared_fd, LOCK_UN);
  pthread_mutex_unlock(&g_mu);
  t_inside = 0;
  errno = saved;
}

// The absolute path of `path` taken relative to `dirfd`; "" if it cannot be told.
static void absolute(int dirfd, const char* path, char* out, size_t cap) {
  out[0] = '\0';
  if (!path) return;
  if (path[0] == '/') {
    snprintf(out, cap, "%s", path);
    return;
  }
  char base[PATH_MAX];
  if (dirfd == AT_FDCWD) {
    if (!getcwd(base, sizeof base)) return;
  } else {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
    ssize_t n = readlink(link, base, sizeof base - 1);
    if (n <= 0) return;
    base[n] = '\0';
  }
  snprintf(out, cap, "%s/%s", base, path);
}

static int under_root(const char* abs) {
  return g_active && abs[0] && strncmp(abs, g_root, g_root_len) == 0 &&
         (abs[g_root_len] == '/' || abs[g_root_len] == '\0');
}

// The identity of an open file, "" if it is not under ROOT.
static void fd_identity(int fd, char* out, size_t cap, char* path_out, size_t path_cap) {
  out[0] = '\0';
  char link[64], target[PATH_MAX];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0) return;
  target[n] = '\0';
  if (!under_root(target)) return;
  struct statx sx;
  if (syscall(SYS_statx, fd, "", AT_EMPTY_PATH, STATX_BASIC_STATS | STATX_BTIME, &sx) != 0) return;
  snprintf(out, cap, "%c:%llu:%lld", S_ISDIR(sx.stx_mode) ? 'd' : 'f',
           (unsigned long long)sx.stx_ino, (long long)birth_ns(&sx));
  snprintf(path_out, path_cap, "%s", target + g_root_len);
}

#define REAL(ret, name, ...)                                         \
  static ret (*real_##name)(__VA_ARGS__);                            \
  static void load_##name(void) {                                    \
    if (!real_##name) real_##name = (ret(*)(__VA_ARGS__))dlsym(RTLD_NEXT, #name); \
  }

REAL(int, fsync, int)
REAL(int, fdatasync, int)
REAL(int, rename, const char*, const char*)
REAL(int, renameat, int, const char*, int, const char*)
REAL(int, renameat2, int, const char*, int, const char*, unsigned int)
REAL(int, unlink, const char*)
REAL(int, unlinkat, int, const char*, int)
REAL(int, mkdir, const char*, mode_t)
REAL(int, mkdirat, int, const char*, mode_t)
REAL(int, rmdir, const char*)
REAL(int, open, const char*, int, ...)
REAL(int, open64, const char*, int, ...)
REAL(int, openat, int, const char*, int, ...)
REAL(int, openat64, int, const char*, int, ...)
REAL(int, __open_2, const char*, int)
REAL(int, mkstemp, char*)
REAL(int, mkostemp, char*, int)
REAL(int, __open64_2, const char*, int)
REAL(int, __openat_2, int, const char*, int)
REAL(int, __openat64_2, int, const char*, int)

static void record_sync(const char* kind, int fd, int rc) {
  if (rc != 0 || !g_active || t_inside) return;
  char id[128], path[PATH_MAX];
  fd_identity(fd, id, sizeof id, path, sizeof path);
  if (id[0]) record(kind, id, path);
}

static void record_paths(const char* kind, int rc, int dfd1, const char* p1, int dfd2, const char* p2) {
  if (rc != 0 || !g_active || t_inside) return;
  char a[PATH_MAX], b[PATH_MAX];
  absolute(dfd1, p1, a, sizeof a);
  absolute(dfd2, p2, b, sizeof b);
  if (under_root(a) || under_root(b)) record(kind, a, b);
}

int fsync(int fd) {
  load_fsync();
  int rc = real_fsync(fd);
  record_sync("sync", fd, rc);
  return rc;
}

int fdatasync(int fd) {
  load_fdatasync();
  int rc = real_fdatasync(fd);
  record_sync("sync", fd, rc);
  return rc;
}

int rename(const char* from, const char* to) {
  load_rename();
  int rc = real_rename(from, to);
  record_paths("rename", rc, AT_FDCWD, from, AT_FDCWD, to);
  return rc;
}

int renameat(int fd1, const char* from, int fd2, const char* to) {
  load_renameat();
  int rc = real_renameat(fd1, from, fd2, to);
  record_paths("rename", rc, fd1, from, fd2, to);
  return rc;
}

int renameat2(int fd1, const char* from, int fd2, const char* to, unsigned int flags) {
  load_renameat2();
  int rc = real_renameat2(fd1, from, fd2, to, flags);
  record_paths("rename", rc, fd1, from, fd2, to);
  return rc;
}

int unlink(const char* path) {
  load_unlink();
  int rc = real_unlink(path);
  record_paths("unlink", rc, AT_FDCWD, path, AT_FDCWD, NULL);
  return rc;
}

int unlinkat(int dfd, const char* path, int flags) {
  load_unlinkat();
  int rc = real_unlinkat(dfd, path, flags);
  record_paths("unlink", rc, dfd, path, AT_FDCWD, NULL);
  return rc;
}

int mkdir(const char* path, mode_t mode) {
  load_mkdir();
  int rc = real_mkdir(path, mode);
  record_paths("mkdir", rc, AT_FDCWD, path, AT_FDCWD, NULL);
  return rc;
}

int mkdirat(int dfd, const char* path, mode_t mode) {
  load_mkdirat();
  int rc = real_mkdirat(dfd, path, mode);
  record_paths("mkdir", rc, dfd, path, AT_FDCWD, NULL);
  return rc;
}

int rmdir(const char* path) {
  load_rmdir();
  int rc = real_rmdir(path);
  record_paths("rmdir", rc, AT_FDCWD, path, AT_FDCWD, NULL);
  return rc;
}

static mode_t mode_arg(int flags, va_list ap) {
  return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

static void record_open(int fd, int flags, int dfd, const char* path) {
  if (fd >= 0 && (flags & O_CREAT)) record_paths("create", 0, dfd, path, AT_FDCWD, NULL);
}

int open(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  load_open();
  int fd = real_open(path, flags, mode);
  record_open(fd, flags, AT_FDCWD, path);
  return fd;
}

int open64(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  load_open64();
  int fd = real_open64(path, flags, mode);
  record_open(fd, flags, AT_FDCWD, path);
  return fd;
}

int openat(int dfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  load_openat();
  int fd = real_openat(dfd, path, flags, mode);
  record_open(fd, flags, dfd, path);
  return fd;
}

int openat64(int dfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  load_openat64();
  int fd = real_openat64(dfd, path, flags, mode);
  record_open(fd, flags, dfd, path);
  return fd;
}

// _FORTIFY_SOURCE builds call these for opens without a mode argument.
int __open_2(const char* path, int flags) {
  load___open_2();
  int fd = real___open_2(path, flags);
  record_open(fd, flags, AT_FDCWD, path);
  return fd;
}

int __open64_2(const char* path, int flags) {
  load___open64_2();
  int fd = real___open64_2(path, flags);
  record_open(fd, flags, AT_FDCWD, path);
  return fd;
}

int __openat_2(int dfd, const char* path, int flags) {
  load___openat_2();
  int fd = real___openat_2(dfd, path, flags);
  record_open(fd, flags, dfd, path);
  return fd;
}

int __openat64_2(int dfd, const char* path, int flags) {
  load___openat64_2();
  int fd = real___openat64_2(dfd, path, flags);
  record_open(fd, flags, dfd, path);
  return fd;
}

int mkstemp(char* templ) {
  load_mkstemp();
  int fd = real_mkstemp(templ);
  record_open(fd, O_CREAT, AT_FDCWD, templ);
  return fd;
}

int mkostemp(char* templ, int flags) {
  load_mkostemp();
  int fd = real_mkostemp(templ, flags);
  record_open(fd, O_CREAT, AT_FDCWD, templ);
  return fd;
}

// Called by the program under test (through ctypes) when it has acknowledged something.
__attribute__((visibility("default"))) void fp_crashsim_mark(const char* text) {
  record("mark", text, NULL);
}

// A forked child would share its parent's flock (one open file description): it runs unrecorded.
static void stop_in_child(void) {
  g_active = 0;
  pthread_mutex_init(&g_mu, NULL);
}

__attribute__((constructor)) static void crashsim_init(void) {
  const char* root = getenv("FP_CRASHSIM_ROOT");
  const char* out = getenv("FP_CRASHSIM_OUT");
  if (root && out && realpath(root, g_root) && realpath(out, g_out)) {
    g_root_len = strlen(g_root);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/tree", g_out);
    syscall(SYS_mkdirat, AT_FDCWD, path, 0700);
    snprintf(path, sizeof path, "%s/data", g_out);
    syscall(SYS_mkdirat, AT_FDCWD, path, 0700);
    snprintf(path, sizeof path, "%s/shared", g_out);
    g_shared_fd = raw_open(path, O_RDWR | O_CREAT, 0600);
    // Extending to the same size again keeps what another process already wrote.
    if (g_shared_fd >= 0 && ftruncate(g_shared_fd, sizeof(Shared)) == 0) {
      void* m = mmap(NULL, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED, g_shared_fd, 0);
      if (m != MAP_FAILED) g_shared = (Shared*)m;
    }
    snprintf(path, sizeof path, "%s/events", g_out);
    g_events_fd = raw_open(path, O_WRONLY | O_CREAT | O_APPEND, 0600);
    g_active = g_events_fd >= 0 && g_shared != NULL;
    record("init", NULL, NULL);
    pthread_atfork(NULL, NULL, stop_in_child);
  }
  // Children of the recorded process run unrecorded.
  unsetenv("LD_PRELOAD");
  unsetenv("FP_CRASHSIM_ROOT");
  unsetenv("FP_CRASHSIM_OUT");
}

// What the process wrote after its last event is still a state a cut can meet.
__attribute__((destructor)) static void crashsim_exit(void) {
  record("exit", NULL, NULL);
}
