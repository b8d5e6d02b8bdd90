// SPDX-License-Identifier: Apache-2.0
// IoWorker: one thread with its own backend queue. It runs the slices assigned to it, cutting
// them into block_size operations and keeping up to queue_depth of them in flight.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "fastpersist/io_backend.h"
#include "fastpersist/io_engine.h"
#include "io/engine_internal.h"
#include "io/transfer_plan.h"

namespace fastpersist::io {

struct SliceTask {
  std::shared_ptr<IoTicket::State> ticket;
  std::shared_ptr<OpenFile> file;
  std::byte* buffer = nullptr;  // start of the request's buffer
  bool is_write = false;
  std::vector<Segment> segments;
};

class IoWorker {
 public:
  IoWorker(std::unique_ptr<IoBackend> backend, const EngineOptions& options,
           std::shared_ptr<EngineCounters> counters);
  ~IoWorker();  // finishes every queued slice, then joins
  IoWorker(const IoWorker&) = delete;
  IoWorker& operator=(const IoWorker&) = delete;

  void enqueue(SliceTask task);

 private:
  struct Active;
  struct Inflight;
  class Loop;

  void run();

  std::unique_ptr<IoBackend> backend_;
  EngineOptions options_;
  std::shared_ptr<EngineCounters> counters_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<SliceTask> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace fastpersist::io
