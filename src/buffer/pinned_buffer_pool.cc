// SPDX-License-Identifier: Apache-2.0
#include <map>

#include "fastpersist/pinned_buffer.h"

namespace fastpersist {

struct PinnedBufferPool::Shared {
  std::mutex mu;
  std::multimap<size_t, PinnedBuffer> free;  // by capacity
  size_t cached = 0;
  size_t max_cached = 0;
  bool open = true;
};

PinnedBufferPool::PinnedBufferPool(size_t max_cached_bytes) : shared_(std::make_shared<Shared>()) {
  shared_->max_cached = max_cached_bytes;
}

PinnedBufferPool::~PinnedBufferPool() {
  std::lock_guard lock(shared_->mu);
  shared_->open = false;
  shared_->free.clear();
  shared_->cached = 0;
}

Result<std::shared_ptr<PinnedBuffer>> PinnedBufferPool::acquire(size_t bytes) {
  PinnedBuffer buffer;
  {
    std::lock_guard lock(shared_->mu);
    // Reuse a cached buffer that fits without wasting more than half of it.
    auto it = shared_->free.lower_bound(bytes);
    if (it != shared_->free.end() && it->first <= 2 * std::max<size_t>(bytes, 4096)) {
      shared_->cached -= it->first;
      buffer = std::move(it->second);
      shared_->free.erase(it);
    }
  }
  if (buffer.data() == nullptr) {
    FP_ASSIGN_OR_RETURN(buffer, PinnedBuffer::allocate(bytes));
  }
  buffer.size_ = bytes;
  std::weak_ptr<Shared> home = shared_;
  auto* raw = new PinnedBuffer(std::move(buffer));
  return std::shared_ptr<PinnedBuffer>(raw, [home](PinnedBuffer* b) {
    if (auto pool = home.lock()) {
      std::lock_guard lock(pool->mu);
      if (pool->open && pool->cached + b->capacity() <= pool->max_cached) {
        pool->cached += b->capacity();
        size_t cap = b->capacity();
        pool->free.emplace(cap, std::move(*b));
      }
    }
    delete b;
  });
}

PinnedBufferPool& default_pinned_pool() {
  // Never destroyed: buffers released during static destruction still find their pool.
  static auto* pool = new PinnedBufferPool();
  return *pool;
}

size_t PinnedBufferPool::cached_bytes() const {
  std::lock_guard lock(shared_->mu);
  return shared_->cached;
}

}  // namespace fastpersist
