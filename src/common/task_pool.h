// SPDX-License-Identifier: Apache-2.0
// TaskPool: a fixed set of worker threads running CPU work (compressing and decompressing tensor
// chunks) off the caller's thread. Owned by the operation that needs it (one save, one load)
// and joined when it ends, so no thread outlives its work and a fork() never finds a pool whose
// threads the child does not have.
//
// TaskGroup counts the tasks of one batch: wait() returns when all of them have run. A task
// never throws (tasks report their errors through the state they write).
//
// Thread-safety: submit and TaskGroup::run/wait from any thread. The destructor runs every task
// still queued, then joins.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fastpersist {

class TaskPool {
 public:
  // `threads` workers; 0 runs every task on the thread that submits it.
  explicit TaskPool(size_t threads);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  void submit(std::function<void()> task);
  size_t threads() const { return workers_.size(); }

  // Worker threads for CPU work when the caller asks for `requested` (0: one per online core),
  // never more than `useful` (the number of independent pieces of work).
  static size_t choose_threads(size_t requested, size_t useful);

 private:
  void work();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

class TaskGroup {
 public:
  explicit TaskGroup(TaskPool& pool) : pool_(pool) {}
  ~TaskGroup() { wait(); }
  TaskGroup(const TaskGroup&) = delete;
  TaskGroup& operator=(const TaskGroup&) = delete;

  void run(std::function<void()> task);
  void wait();

 private:
  TaskPool& pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t pending_ = 0;
};

}  // namespace fastpersist
