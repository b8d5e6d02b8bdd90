// SPDX-License-Identifier: Apache-2.0
// The rendezvous of parallel writers (private to src/stream).
//
// Files, all next to the target "<dir>/<name>":
//   P       "<dir>/.<name>.fp-partial", the shared temporary every writer writes its stripes to;
//   P.done  one record "rank total digest inode writers stripe" per writer whose stripes are
//           durable (parallel_records.h);
//   P.lock  the writers' mutex (an flock). Whoever holds it may remove it when P.done does not
//           exist, so every locker re-checks after locking that the path still names its file.
//
// Protocol:
//   1. open: under the mutex, open (create) P and take a shared flock on it, held until the
//      writer's close() or abort() ends. It marks a live writer of P; a crashed process drops it.
//   2. write: each writer persists its own stripes of P.
//   3. close: fdatasync P. Under the mutex, check that P still has links and still names the
//      writer's file (else another writer aborted: fail, nothing is committed). Replace this
//      rank's record for this inode and drop records of other inodes (dead attempts). If the
//      records with this inode, size, digest, writer count and stripe size now cover every rank,
//      commit: truncate P to the stream size, fdatasync, rename P onto the target, fsync the
//      directory, remove P.done and P.lock. A record of a crashed earlier attempt on the same
//      inode counts only if it has the same digest, i.e. describes the very bytes now in place.
//   4. wait (commit_timeout > 0, when step 3 did not commit): poll every 10 ms without the mutex
//      until the target names P's inode (another writer committed: rename keeps the inode), P's
//      inode has no links (a writer aborted: fail at once) or the timeout passes. On a timeout,
//      under the mutex: the error lists which ranks recorded the same stream, which a different
//      one, which none. If no other writer holds its shared flock on P (a non-blocking exclusive
//      flock succeeds), nobody can complete the set: remove P and P.done. Otherwise leave both,
//      with this writer's record: a live writer may still close and complete the set (it then
//      commits the file), and must not find its temporary gone.
//   5. abort (or a failed close): under the mutex, if P still names the writer's inode, remove P
//      and P.done (the set can never complete without this writer's stripes); the other writers'
//      closes then fail in step 3 or 4. A P that names another file (a new attempt) is kept.
// Writers whose streams differ (a non-deterministic serialization) never complete a set
// together, so a mixed file is never committed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/unique_fd.h"
#include "fastpersist/status.h"

namespace fastpersist::stream {

// A 64-bit digest of the whole stream (every writer sees every byte), used to prove that all
// writers serialized the same content.
class StreamDigest {
 public:
  StreamDigest();
  ~StreamDigest();
  StreamDigest(const StreamDigest&) = delete;
  StreamDigest& operator=(const StreamDigest&) = delete;
  void update(const void* data, size_t bytes);
  uint64_t value() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// One writer of a parallel set.
struct ParallelWriter {
  std::string target;
  std::string partial_path;  // P, from open_shared_partial
  unsigned rank = 0;
  unsigned num_writers = 1;
  uint64_t stripe_bytes = 0;
  bool durable = true;
  double commit_timeout_seconds = 0;  // 0: close() returns once its own stripes are recorded
};

struct ParallelCloseResult {
  bool committed = false;       // this close renamed the file onto the target
  bool file_committed = false;  // the file is committed, by this close or by another writer's
};

// Step 1: opens (creates) P for `target` and marks this writer live on it.
Result<UniqueFd> open_shared_partial(const std::string& target, std::string* partial_path);

// Steps 3 and 4. Errors: kIoError with ECANCELED when another writer aborted (P was removed or
// replaced), kIoError with ETIMEDOUT when the set did not complete within the timeout (the
// message says why), or the errno of a failed system call. `fd` is closed when this returns OK
// and on a timeout (after the cleanup of step 4); after any other error it stays open for
// abort_parallel.
Status finish_parallel(UniqueFd& fd, const ParallelWriter& writer, uint64_t digest,
                       uint64_t total_bytes, ParallelCloseResult* result);

// Step 5, then closes `fd`. Does nothing when `fd` is already closed. Never removes P without
// the mutex: if the mutex cannot be taken, P is left for the next attempt to reuse.
void abort_parallel(UniqueFd& fd, const std::string& partial_path);

// A set nobody finished: no writer holds P (all closed without completing it, or died), so no
// close can commit it any more, unless a rank that has not started yet would still complete it;
// `min_age_seconds` (P's last write at least that long ago) stands for "no such rank will come".
// Under the mutex (not waited for: kInUse when busy), removes P and P.done; the lock's release
// removes P.lock. `bytes` receives the space P held.
enum class AbandonedSet { kRemoved, kInUse, kTooRecent, kGone };
Result<AbandonedSet> remove_abandoned_set(const std::string& partial_path, double min_age_seconds,
                                          bool dry_run, uint64_t* bytes);

}  // namespace fastpersist::stream
