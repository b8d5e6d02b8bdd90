// SPDX-License-Identifier: Apache-2.0
// Shared state between the engine, its workers and its tickets (private to src/io).
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "fastpersist/io_engine.h"
#include "io/open_file.h"

namespace fastpersist::io {

// Engine-wide statistics, updated lock-free by the workers.
struct EngineCounters {
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> bytes_written{0};
  std::atomic<uint64_t> bytes_read{0};
  std::atomic<uint64_t> direct_bytes{0};
  std::atomic<uint64_t> buffered_bytes{0};
  std::atomic<uint64_t> bounce_bytes{0};
  std::atomic<uint64_t> short_transfers{0};
  std::atomic<uint64_t> direct_fallbacks{0};
  std::mutex mu;
  std::string last_fallback_reason;
};

}  // namespace fastpersist::io

namespace fastpersist {

struct IoTicket::State {
  IoKind kind = IoKind::kWrite;
  uint64_t length = 0;
  std::shared_ptr<io::EngineCounters> counters;

  std::mutex mu;
  std::condition_variable cv;
  unsigned slices_left = 0;
  bool finished = false;
  Status error;
  std::shared_ptr<io::OpenFile> file;  // closed as soon as the request finished

  // Called once per slice by the worker that ran it.
  void slice_done(const Status& status);
};

}  // namespace fastpersist
