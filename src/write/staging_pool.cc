// SPDX-License-Identifier: Apache-2.0
#include "write/staging_pool.h"

#include <algorithm>
#include <cstdint>

namespace fastpersist::checkpoint {

StagingPool::StagingPool(size_t window_bytes, size_t budget_bytes, bool lock_memory)
    : window_bytes_(window_bytes),
      max_windows_(budget_bytes == 0 ? SIZE_MAX : std::max<size_t>(budget_bytes / window_bytes, 1)),
      lock_memory_(lock_memory) {}

Result<std::unique_ptr<PinnedBuffer>> StagingPool::take_locked(std::unique_lock<std::mutex>& lock) {
  if (!free_.empty()) {
    auto w = std::move(free_.back());
    free_.pop_back();
    return w;
  }
  if (allocated_ >= max_windows_) return std::unique_ptr<PinnedBuffer>();
  ++allocated_;
  lock.unlock();  // page faulting a window in takes a while; others may proceed
  // Not registered with CUDA here: this runs on a background thread with no device selected
  // (device_copy.h registers a window once a GPU tensor is copied into it).
  auto buffer = PinnedBuffer::allocate(window_bytes_, lock_memory_, /*cuda_register=*/false);
  lock.lock();
  if (!buffer.is_ok()) {
    --allocated_;
    released_.notify_all();
    return buffer.status();
  }
  return std::make_unique<PinnedBuffer>(std::move(buffer).value());
}

Result<std::unique_ptr<PinnedBuffer>> StagingPool::try_acquire() {
  std::unique_lock lock(mu_);
  return take_locked(lock);
}

Result<std::unique_ptr<PinnedBuffer>> StagingPool::acquire() {
  std::unique_lock lock(mu_);
  for (;;) {
    FP_ASSIGN_OR_RETURN(auto w, take_locked(lock));
    if (w) return w;
    released_.wait(lock);
  }
}

void StagingPool::release(std::unique_ptr<PinnedBuffer> window) {
  if (!window) return;
  std::lock_guard lock(mu_);
  free_.push_back(std::move(window));
  released_.notify_one();
}

size_t StagingPool::allocated_bytes() const {
  std::lock_guard lock(mu_);
  return allocated_ * window_bytes_;
}

void StagingPool::trim() {
  std::vector<std::unique_ptr<PinnedBuffer>> drop;
  std::lock_guard lock(mu_);
  allocated_ -= free_.size();
  drop.swap(free_);
}

}  // namespace fastpersist::checkpoint
