// SPDX-License-Identifier: Apache-2.0
// The cuFile side of GdsHandle: device-memory transfers and buffer registrations, run on a pool
// of the handle's own threads (started with the first of them), each of which selects the
// buffer's device before calling cuFile, so the caller's current device never changes.
//
// A transfer is opened (by path: O_DIRECT when the filesystem takes it) and its range checked
// on the caller's thread, so argument and open errors come back at once; it is then cut into
// one slice per thread, which share one cuFile file handle (registered by the first slice to
// run, deregistered by the last to finish) and move their bytes with cuFileRead/cuFileWrite in
// chunks, resuming short transfers. Errors carry path, offset and length.
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fastpersist/io_engine.h"
#include "fastpersist/memory_kind.h"
#include "fastpersist/status.h"

namespace fastpersist::handle {

struct GdsTransfer {
  IoKind kind = IoKind::kWrite;
  MemorySpan memory;  // kCudaDevice memory
  std::string path;   // by name, or ...
  int fd = -1;        // ... the caller's descriptor (never closed or truncated)
  uint64_t file_offset = 0;
  bool truncate = false;
};

class GdsRequests {
 public:
  struct Request;  // one transfer's shared state

  GdsRequests(unsigned threads, uint64_t chunk_bytes);
  ~GdsRequests();  // finishes every queued task, then joins
  GdsRequests(const GdsRequests&) = delete;
  GdsRequests& operator=(const GdsRequests&) = delete;

  // OK when transfers to and from `device` can run: the device selected on a pool thread and
  // cuFile's driver opened there; else kUnavailable saying why. Checked once per device, and
  // before a request opens its file, so a refused call changes nothing.
  Status ready(int device);

  // Opens and checks on this thread, then queues; the caller has checked ready(). Unless
  // `collected_by_wait`, only wait_for() collects it: wait() neither waits for nor counts it
  // (a sync call's own request).
  Result<std::shared_ptr<Request>> submit(GdsTransfer transfer, bool collected_by_wait = true);
  // Blocks until `request` finished; its status.
  static Status wait_for(const std::shared_ptr<Request>& request);
  // Every request submitted and not yet collected: how many, or the first error.
  Result<size_t> wait();

  Status pin(const MemorySpan& memory);
  Result<bool> unpin(const MemorySpan& memory);
  bool is_pinned(const MemorySpan& memory) const;
  // Deregisters everything still pinned (the handle is going away).
  void unpin_all();

 private:
  void post(std::function<void()> task);
  // Runs `fn` on a pool thread with `device` selected and waits for it.
  Status run_on_device(int device, const std::function<Status()>& fn);
  void run();

  unsigned threads_;
  uint64_t chunk_bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::shared_ptr<Request>> uncollected_;
  std::map<int, Status> readiness_;
  bool stop_ = false;
  std::vector<std::thread> pool_;

  mutable std::mutex pins_mu_;
  struct Pin {
    size_t bytes;
    int device;
  };
  std::map<const std::byte*, Pin> pins_;  // by start address
};

}  // namespace fastpersist::handle
