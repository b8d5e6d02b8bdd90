// SPDX-License-Identifier: Apache-2.0
// The shared state behind a PendingSave: set by the manager's save thread, read by callers.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "fastpersist/checkpoint.h"

namespace fastpersist {

struct PendingSave::State {
  using Clock = std::chrono::steady_clock;

  explicit State(std::string t) : tag(std::move(t)), queued(Clock::now()) {}

  void mark_started();
  void mark_snapshot_done();
  // Sets the outcome; implies the snapshot is over (done or abandoned). `retention`: why
  // removing older checkpoints after this commit failed (OK when it did not fail or not run).
  void finish(Status outcome, uint64_t bytes_written, Status retention_outcome = Status::ok());
  // The failure, once, if nobody reported it yet (for the manager's next call).
  Status take_unreported_failure();

  const std::string tag;
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  bool snapshot_done = false;
  bool done = false;
  mutable bool reported = false;
  Status status;
  Status retention;
  uint64_t bytes = 0;
  double checksum_seconds = 0;
  std::string base_tag;             // incremental: the base this checkpoint references
  uint64_t referenced_bytes = 0;    // ... and the tensor bytes it takes from there
  std::vector<Status> tier_errors;  // drain failures since the previous save (set at creation)
  // Counts the saves whose snapshot is not over (the manager's; decremented once, when it ends).
  std::atomic<int>* snapshots_running = nullptr;
  Clock::time_point queued, started, snapshot_end, end;
};

}  // namespace fastpersist
