// SPDX-License-Identifier: Apache-2.0
// Pinned staging windows for snapshots, shared by all saves of one manager and reused across
// saves (pinning memory is slow; a training run saves the same shapes again and again).
//
// Every window has the same size. With a budget, at most budget / window_bytes windows exist;
// acquire() then waits until one is released. Without a budget (0) windows are created on
// demand and kept, so a snapshot never waits for the device.
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "fastpersist/pinned_buffer.h"
#include "fastpersist/status.h"

namespace fastpersist::checkpoint {

class StagingPool {
 public:
  StagingPool(size_t window_bytes, size_t budget_bytes, bool lock_memory);

  size_t window_bytes() const { return window_bytes_; }
  // Windows the budget allows (SIZE_MAX without a budget).
  size_t max_windows() const { return max_windows_; }

  // A free window, or a new one if the budget allows; nullptr when the budget is used up.
  Result<std::unique_ptr<PinnedBuffer>> try_acquire();
  // Waits until a window is released (call only when the caller holds none in flight).
  Result<std::unique_ptr<PinnedBuffer>> acquire();
  void release(std::unique_ptr<PinnedBuffer> window);

  size_t allocated_bytes() const;
  // Frees the cached free windows (those in use are freed when released after this).
  void trim();

 private:
  Result<std::unique_ptr<PinnedBuffer>> take_locked(std::unique_lock<std::mutex>& lock);
  const size_t window_bytes_;
  const size_t max_windows_;
  const bool lock_memory_;
  mutable std::mutex mu_;
  std::condition_variable released_;
  std::vector<std::unique_ptr<PinnedBuffer>> free_;
  size_t allocated_ = 0;  // windows in existence
};

}  // namespace fastpersist::checkpoint
