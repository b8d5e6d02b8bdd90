// SPDX-License-Identifier: Apache-2.0
#include "checkpoint/pending_save.h"

namespace fastpersist {

void PendingSave::State::mark_started() {
  std::lock_guard lock(mu);
  started = Clock::now();
}

void PendingSave::State::mark_snapshot_done() {
  std::lock_guard lock(mu);
  if (snapshot_done) return;
  snapshot_done = true;
  snapshot_end = Clock::now();
  if (snapshots_running != nullptr) snapshots_running->fetch_sub(1);
  cv.notify_all();
}

void PendingSave::State::finish(Status outcome, uint64_t bytes_written, Status retention_outcome) {
  std::lock_guard lock(mu);
  if (!snapshot_done) {
    snapshot_done = true;
    snapshot_end = Clock::now();
    if (snapshots_running != nullptr) snapshots_running->fetch_sub(1);
  }
  if (started == Clock::time_point{}) started = snapshot_end;
  done = true;
  end = Clock::now();
  status = std::move(outcome);
  retention = std::move(retention_outcome);
  bytes = bytes_written;
  cv.notify_all();
}

Status PendingSave::State::take_unreported_failure() {
  std::lock_guard lock(mu);
  if (!done || reported || status.is_ok()) return Status::ok();
  reported = true;
  return status;
}

const std::string& PendingSave::tag() const { return state_->tag; }

bool PendingSave::snapshot_done() const {
  std::lock_guard lock(state_->mu);
  return state_->snapshot_done;
}

bool PendingSave::done() const {
  std::lock_guard lock(state_->mu);
  return state_->done;
}

Status PendingSave::wait_snapshot() const {
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->snapshot_done; });
  // A save that failed before its snapshot finished reports the failure here.
  if (state_->done && !state_->status.is_ok()) {
    state_->reported = true;
    return state_->status;
  }
  return Status::ok();
}

Status PendingSave::wait() const {
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  state_->reported = true;
  return state_->status;
}

bool PendingSave::wait_done() const {
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  return state_->status.is_ok();
}

double PendingSave::snapshot_seconds() const {
  std::lock_guard lock(state_->mu);
  if (!state_->snapshot_done || state_->started == State::Clock::time_point{}) return 0;
  return std::chrono::duration<double>(state_->snapshot_end - state_->started).count();
}

double PendingSave::total_seconds() const {
  std::lock_guard lock(state_->mu);
  if (!state_->done) return 0;
  return std::chrono::duration<double>(state_->end - state_->queued).count();
}

double PendingSave::checksum_seconds() const {
  std::lock_guard lock(state_->mu);
  return state_->checksum_seconds;
}

Status PendingSave::retention_status() const {
  std::lock_guard lock(state_->mu);
  return state_->retention;
}

std::string PendingSave::base_tag() const {
  std::lock_guard lock(state_->mu);
  return state_->base_tag;
}

uint64_t PendingSave::referenced_bytes() const {
  std::lock_guard lock(state_->mu);
  return state_->referenced_bytes;
}

std::vector<Status> PendingSave::tier_errors() const {
  std::lock_guard lock(state_->mu);
  return state_->tier_errors;
}

uint64_t PendingSave::bytes() const {
  std::lock_guard lock(state_->mu);
  return state_->bytes;
}

}  // namespace fastpersist
