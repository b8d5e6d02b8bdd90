// SPDX-License-Identifier: Apache-2.0
// The protocol (steps 1 to 5) is described at the top of parallel_commit.h.
#include "stream/parallel_commit.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "fastpersist/layout.h"
#if defined(FASTPERSIST_XXH_DISPATCH)
#include <xxh_x86dispatch.h>  // XXH3 one-shot and update calls become the CPU-dispatched ones
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <optional>
#include <thread>
#include <vector>

#include "common/regular_file.h"
#include "stream/parallel_records.h"
#include "stream/writer_files.h"

namespace fastpersist::stream {

struct StreamDigest::State {
  XXH3_state_t* xxh = XXH3_createState();
};

StreamDigest::StreamDigest() : state_(std::make_unique<State>()) { XXH3_64bits_reset(state_->xxh); }
StreamDigest::~StreamDigest() { XXH3_freeState(state_->xxh); }
void StreamDigest::update(const void* data, size_t bytes) {
  XXH3_64bits_update(state_->xxh, data, bytes);
}
uint64_t StreamDigest::value() const { return XXH3_64bits_digest(state_->xxh); }

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPollInterval = std::chrono::milliseconds(10);
// Commit timeouts this long never expire (a century of nanoseconds is far from int64 overflow).
constexpr auto kLongestTimeout = std::chrono::hours(24 * 365 * 100);

std::string lock_path_of(const std::string& partial) {
  return partial + std::string(kParallelLockSuffix);
}
std::string done_path_of(const std::string& partial) {
  return partial + std::string(kParallelDoneSuffix);
}

bool same_file(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// True when `path` names the file `st` describes.
bool names(const std::string& path, const struct stat& st) {
  struct stat now {};
  return ::stat(path.c_str(), &now) == 0 && same_file(now, st);
}

Result<struct stat> stat_fd(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::from_errno(errno, "fstat failed").with_path(path);
  return st;
}

Status flock_retry(int fd, int operation, const std::string& path) {
  while (::flock(fd, operation) != 0) {
    if (errno != EINTR) return Status::from_errno(errno, "flock failed").with_path(path);
  }
  return Status::ok();
}

// The writers' mutex: an exclusive flock on P.lock. Its holder may remove the lock file, so
// acquire() locks whatever the path names and retries until the path still names the file it
// locked. Released (and the lock file removed when no record file is left, so nothing stays
// behind once every writer is done) when it goes out of scope.
class WritersLock {
 public:
  static Result<WritersLock> acquire(const std::string& partial_path) {
    std::string path = lock_path_of(partial_path);
    for (;;) {
      FP_ASSIGN_OR_RETURN(UniqueFd fd,
                          open_or_create_regular_file(path, O_RDWR, "the writers' lock"));
      FP_RETURN_IF_ERROR(flock_retry(fd.get(), LOCK_EX, path));
      FP_ASSIGN_OR_RETURN(struct stat held, stat_fd(fd.get(), path));
      if (names(path, held)) return WritersLock(partial_path, std::move(fd));
    }
  }
  // Like acquire(), but gives up (nullopt) when another process holds the mutex now.
  static Result<std::optional<WritersLock>> try_acquire(const std::string& partial_path) {
    std::string path = lock_path_of(partial_path);
    for (;;) {
      FP_ASSIGN_OR_RETURN(UniqueFd fd,
                          open_or_create_regular_file(path, O_RDWR, "the writers' lock"));
      if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK) return std::optional<WritersLock>();
        if (errno == EINTR) continue;
        return Status::from_errno(errno, "flock failed").with_path(path);
      }
      FP_ASSIGN_OR_RETURN(struct stat held, stat_fd(fd.get(), path));
      if (names(path, held))
        return std::optional<WritersLock>(WritersLock(partial_path, std::move(fd)));
    }
  }
  WritersLock(WritersLock&&) noexcept = default;
  WritersLock& operator=(WritersLock&&) = delete;
  ~WritersLock() {
    if (!fd_.valid()) return;
    if (::access(done_path_of(partial_).c_str(), F_OK) != 0 && errno == ENOENT) {
      ::unlink(lock_path_of(partial_).c_str());
    }
  }

 private:
  WritersLock(std::string partial, UniqueFd fd)
      : partial_(std::move(partial)), fd_(std::move(fd)) {}
  std::string partial_;
  UniqueFd fd_;
};

Status removed_error(const ParallelWriter& w) {
  return Status(StatusCode::kIoError,
                "another writer of this file aborted: the shared temporary " + w.partial_path +
                    " was removed; nothing was committed",
                ECANCELED)
      .with_path(w.target);
}

Status replaced_error(const ParallelWriter& w) {
  return Status(StatusCode::kIoError,
                "the shared temporary " + w.partial_path +
                    " is no longer this writer's file (another writer aborted and a new attempt "
                    "created it again); nothing was committed",
                ECANCELED)
      .with_path(w.target);
}

// Under the mutex, before recording or committing: P's inode must still be linked at P.
Status check_still_shared(const UniqueFd& fd, const ParallelWriter& w) {
  FP_ASSIGN_OR_RETURN(struct stat st, stat_fd(fd.get(), w.partial_path));
  if (st.st_nlink == 0) return removed_error(w);
  if (!names(w.partial_path, st)) return replaced_error(w);
  return Status::ok();
}

// Step 3's commit; the caller holds the mutex. `fd` stays open until the rename succeeded, so a
// failure leaves P to abort_parallel, which removes it.
Status commit(UniqueFd& fd, const ParallelWriter& w, uint64_t total_bytes) {
  if (::ftruncate(fd.get(), static_cast<off_t>(total_bytes)) != 0) {
    return Status::from_errno(errno, "ftruncate failed").with_path(w.partial_path);
  }
  if (w.durable && ::fdatasync(fd.get()) != 0) {
    return Status::from_errno(errno, "fdatasync failed").with_path(w.partial_path);
  }
  if (::rename(w.partial_path.c_str(), w.target.c_str()) != 0) {
    return Status::from_errno(errno, "cannot rename " + w.partial_path + " onto the target")
        .with_path(w.target);
  }
  fd.reset();
  Status removed = write_records(done_path_of(w.partial_path), {});
  if (w.durable) FP_RETURN_IF_ERROR(fsync_parent_dir(w.target));
  return removed;
}

enum class SharedFile { kPending, kCommitted, kRemoved };

// What became of this writer's file, seen without the mutex.
Result<SharedFile> observe(const UniqueFd& fd, const ParallelWriter& w) {
  FP_ASSIGN_OR_RETURN(struct stat st, stat_fd(fd.get(), w.partial_path));
  if (names(w.target, st)) return SharedFile::kCommitted;  // rename keeps the inode
  if (st.st_nlink == 0) return SharedFile::kRemoved;
  return SharedFile::kPending;
}

// True when no other writer holds its shared flock on P. Drops this writer's own one first
// (it is giving up); a failed non-blocking conversion leaves it holding no lock at all.
bool no_other_live_writer(const UniqueFd& fd) {
  if (::flock(fd.get(), LOCK_UN) != 0) return false;
  return ::flock(fd.get(), LOCK_EX | LOCK_NB) == 0;
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", seconds);
  return text;
}

// Step 4 after the timeout; the caller holds the mutex. Closes `fd`.
Status give_up(UniqueFd& fd, const ParallelWriter& w, const DoneRecord& mine) {
  const std::string done_path = done_path_of(w.partial_path);
  std::string why = describe_incomplete_set(records_of(read_records(done_path), mine.inode), mine);
  FP_ASSIGN_OR_RETURN(struct stat st, stat_fd(fd.get(), w.partial_path));
  std::string fate;
  if (names(w.partial_path, st) && no_other_live_writer(fd)) {
    ::unlink(w.partial_path.c_str());
    (void)write_records(done_path, {});
    fate = "no other writer has " + w.partial_path + " open, so it and the records were removed";
  } else {
    fate = "other writers still have " + w.partial_path +
           " open, so it and this writer's record stay (a set that every rank completes with the "
           "same stream is still committed)";
  }
  fd.reset();
  return Status(StatusCode::kIoError,
                "parallel writers did not commit the file within " +
                    seconds_text(w.commit_timeout_seconds) + ": " + why + "; " + fate,
                ETIMEDOUT)
      .with_path(w.target);
}

// Step 4.
Status wait_for_commit(UniqueFd& fd, const ParallelWriter& w, const DoneRecord& mine,
                       ParallelCloseResult* result) {
  // Not converted unchecked: a "wait forever" like 1e300 s would overflow the clock's ticks.
  const std::chrono::duration<double> timeout(w.commit_timeout_seconds);
  const auto deadline = timeout < kLongestTimeout
                            ? Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout)
                            : Clock::time_point::max();
  for (;;) {
    FP_ASSIGN_OR_RETURN(SharedFile seen, observe(fd, w));
    auto now = Clock::now();
    if (seen != SharedFile::kPending || now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(kPollInterval, deadline - now));
  }
  // The committer holds the mutex until its rename is durable; a decision under it is final.
  FP_ASSIGN_OR_RETURN(WritersLock lock, WritersLock::acquire(w.partial_path));
  FP_ASSIGN_OR_RETURN(SharedFile seen, observe(fd, w));
  switch (seen) {
    case SharedFile::kCommitted:
      fd.reset();
      result->file_committed = true;
      return Status::ok();
    case SharedFile::kRemoved:
      return removed_error(w);
    case SharedFile::kPending:
      break;
  }
  return give_up(fd, w, mine);
}

}  // namespace

Result<UniqueFd> open_shared_partial(const std::string& target, std::string* partial_path) {
  std::string base = base_of(target);
  if (base.empty() || base == "." || base == "..") {
    return Status(StatusCode::kInvalidArgument, "not a file path").with_path(target);
  }
  *partial_path = dir_of(target) + "/." + base + std::string(kPartialSuffix);
  FP_ASSIGN_OR_RETURN(WritersLock lock, WritersLock::acquire(*partial_path));
  // No O_TRUNC: other writers may already have written their stripes.
  FP_ASSIGN_OR_RETURN(UniqueFd fd, open_or_create_regular_file(*partial_path, O_WRONLY,
                                                               "the shared temporary file"));
  FP_RETURN_IF_ERROR(flock_retry(fd.get(), LOCK_SH, *partial_path));
  return fd;
}

Status finish_parallel(UniqueFd& fd, const ParallelWriter& w, uint64_t digest, uint64_t total_bytes,
                       ParallelCloseResult* result) {
  *result = {};
  FP_ASSIGN_OR_RETURN(struct stat st, stat_fd(fd.get(), w.partial_path));
  if (w.durable && ::fdatasync(fd.get()) != 0) {
    return Status::from_errno(errno, "fdatasync failed").with_path(w.partial_path);
  }
  DoneRecord mine;
  mine.rank = w.rank;
  mine.total = total_bytes;
  mine.digest = digest;
  mine.inode = static_cast<uint64_t>(st.st_ino);
  mine.writers = w.num_writers;
  mine.stripe = w.stripe_bytes;
  {
    FP_ASSIGN_OR_RETURN(WritersLock lock, WritersLock::acquire(w.partial_path));
    FP_RETURN_IF_ERROR(check_still_shared(fd, w));
    const std::string done_path = done_path_of(w.partial_path);
    std::vector<DoneRecord> records = with_record(read_records(done_path), mine);
    if (matching_ranks(records, mine) == w.num_writers) {
      FP_RETURN_IF_ERROR(commit(fd, w, total_bytes));
      result->committed = result->file_committed = true;
      return Status::ok();
    }
    FP_RETURN_IF_ERROR(write_records(done_path, records));
  }
  if (w.commit_timeout_seconds > 0) return wait_for_commit(fd, w, mine, result);
  fd.reset();  // done: this writer no longer counts as live (step 4's cleanup test)
  return Status::ok();
}

void abort_parallel(UniqueFd& fd, const std::string& partial_path) {
  if (!fd.valid()) return;
  Result<WritersLock> lock = WritersLock::acquire(partial_path);
  Result<struct stat> st = stat_fd(fd.get(), partial_path);
  if (lock.is_ok() && st.is_ok()) {
    const std::string done_path = done_path_of(partial_path);
    if (st->st_nlink > 0 && names(partial_path, *st)) {
      ::unlink(partial_path.c_str());
      (void)write_records(done_path, {});  // every record describes a file that is gone now
    } else {
      struct stat current {};  // keep the records of a new attempt's P only
      std::vector<DoneRecord> keep;
      if (::stat(partial_path.c_str(), &current) == 0) {
        keep = records_of(read_records(done_path), static_cast<uint64_t>(current.st_ino));
      }
      (void)write_records(done_path, keep);
    }
  }
  fd.reset();
}

Result<AbandonedSet> remove_abandoned_set(const std::string& partial_path, double min_age_seconds,
                                          bool dry_run, uint64_t* bytes) {
  *bytes = 0;
  FP_ASSIGN_OR_RETURN(std::optional<WritersLock> lock, WritersLock::try_acquire(partial_path));
  if (!lock) return AbandonedSet::kInUse;  // a writer is in its critical section right now
  UniqueFd fd(::open(partial_path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno != ENOENT) return Status::from_errno(errno, "cannot open").with_path(partial_path);
    // Records without their file describe nothing; the lock's release then removes P.lock.
    if (!dry_run) FP_RETURN_IF_ERROR(write_records(done_path_of(partial_path), {}));
    return AbandonedSet::kGone;
  }
  FP_ASSIGN_OR_RETURN(struct stat st, stat_fd(fd.get(), partial_path));
  if (!S_ISREG(st.st_mode)) {
    return Status(StatusCode::kInvalidArgument, "not a regular file").with_path(partial_path);
  }
  // Every live writer holds a shared flock on P from open to close (step 1).
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return AbandonedSet::kInUse;
    return Status::from_errno(errno, "cannot lock").with_path(partial_path);
  }
  if (!names(partial_path, st)) return AbandonedSet::kGone;
  double age = std::difftime(std::time(nullptr), st.st_mtime);
  if (age < min_age_seconds) return AbandonedSet::kTooRecent;
  *bytes = static_cast<uint64_t>(st.st_blocks) * 512;
  if (dry_run) return AbandonedSet::kRemoved;
  if (::unlink(partial_path.c_str()) != 0)
    return Status::from_errno(errno, "cannot remove").with_path(partial_path);
  FP_RETURN_IF_ERROR(write_records(done_path_of(partial_path), {}));
  return AbandonedSet::kRemoved;
}

}  // namespace fastpersist::stream
