// SPDX-License-Identifier: Apache-2.0
// The device-memory requests of one AioHandle: each is a staged transfer
// (handle/device_staging.h) run, in submission order, on one thread of the handle's own, so
// the caller's thread never has its current CUDA device changed and async calls return at once.
// The thread starts with the first device request: handles that only see host memory never
// create it (nor touch CUDA).
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "fastpersist/io_engine.h"
#include "fastpersist/pinned_buffer.h"
#include "fastpersist/status.h"
#include "handle/device_staging.h"

namespace fastpersist::handle {

class DeviceRequests {
 public:
  // The outcome of one request; shared by the queue and whoever waits for it.
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool finished = false;
    Status status;
    Status wait();
  };

  DeviceRequests(IoEngine& engine, PinnedBufferPool& pool) : engine_(engine), pool_(pool) {}
  ~DeviceRequests();  // finishes every queued request, then joins
  DeviceRequests(const DeviceRequests&) = delete;
  DeviceRequests& operator=(const DeviceRequests&) = delete;

  // OK when copies from and to `device` can run here (the CUDA runtime loaded, the device
  // usable), else kUnavailable saying what is missing. Probed once per device, on a thread of
  // its own; checked before a request is queued, so a refused call changes nothing.
  Status ready(int device);

  // Queues the transfer; the returned state tells when it finished and how. Unless
  // `collected_by_wait`, that state is the only way to collect it: wait() neither waits for
  // nor counts it (a sync call's own request).
  std::shared_ptr<Done> submit(StagedTransfer transfer, bool collected_by_wait = true);

  // Waits for every request submitted and not yet collected; returns how many, or the first
  // error once all of them finished.
  Result<size_t> wait();

 private:
  struct Job {
    StagedTransfer transfer;
    std::shared_ptr<Done> done;
  };
  void run();

  IoEngine& engine_;
  PinnedBufferPool& pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::vector<std::shared_ptr<Done>> uncollected_;
  std::map<int, Status> readiness_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace fastpersist::handle
