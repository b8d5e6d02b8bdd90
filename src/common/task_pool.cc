// SPDX-License-Identifier: Apache-2.0
#include "common/task_pool.h"

#include <algorithm>

namespace fastpersist {

TaskPool::TaskPool(size_t threads) {
  workers_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
}

TaskPool::~TaskPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void TaskPool::submit(std::function<void()> task) {
  if (workers_.empty()) {
    task();
    return;
  }
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void TaskPool::work() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

size_t TaskPool::choose_threads(size_t requested, size_t useful) {
  size_t n = requested != 0 ? requested : std::max<size_t>(std::thread::hardware_concurrency(), 1);
  return std::min(n, std::max<size_t>(useful, 1));
}

void TaskGroup::run(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    ++pending_;
  }
  pool_.submit([this, task = std::move(task)] {
    task();
    std::lock_guard lock(mu_);
    if (--pending_ == 0) cv_.notify_all();
  });
}

void TaskGroup::wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return pending_ == 0; });
}

}  // namespace fastpersist
