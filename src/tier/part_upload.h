// SPDX-License-Identifier: Apache-2.0
// The objects of one checkpoint written in parts (private to src/checkpoint): bytes fed in
// order, object after object, are cut into parts that go up `transfers` at a time on threads of
// their own while the caller reads the next bytes, across object boundaries (the next file is
// read while the last parts of the previous one are still in flight). An object completes in the
// background once its last part is up; one no larger than a part is a single put. The part
// buffers are reused (fresh memory is slow to fault in): at most transfers + 1 of them.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/task_pool.h"
#include "fastpersist/object_store.h"
#include "fastpersist/status.h"

namespace fastpersist::checkpoint {

// S3 takes at most 10,000 parts per object: a larger object gets larger parts, the smallest
// multiple of 1 MiB that fits (never smaller than `part_bytes`).
inline constexpr uint64_t kMaxPartsPerObject = 10000;
uint64_t part_size_for(uint64_t object_bytes, uint64_t part_bytes);

class PartUploader {
 public:
  PartUploader(ObjectStore& store, uint64_t part_bytes, unsigned transfers);
  ~PartUploader();  // abort_all()
  PartUploader(const PartUploader&) = delete;
  PartUploader& operator=(const PartUploader&) = delete;

  // Starts object `key` of `size` bytes. kInvalidArgument while the previous one is not ended.
  Status begin(const std::string& key, uint64_t size);
  // The object's next bytes. Returns the first error of any part or object so far.
  Status feed(const std::byte* data, size_t bytes);
  // All of the object's bytes were fed: its last part goes, and it completes once its parts are
  // up (without waiting here).
  Status end();
  // Waits until every object begun is complete; the first error otherwise (every unfinished
  // upload is then aborted).
  Status finish_all();
  // Waits for the transfers in flight and aborts every unfinished upload. Idempotent.
  void abort_all();

  uint64_t parts_sent() const;

 private:
  struct Buffer {
    std::vector<std::byte> bytes;
    size_t used = 0;
  };
  struct Object {
    std::string key;
    std::string upload_id;           // empty: not a multipart upload (yet)
    std::vector<std::string> etags;  // by part number - 1
    size_t parts_pending = 0;
    bool ended = false;
    bool done = false;  // completed (or put)
  };
  Status send(std::shared_ptr<Buffer> buffer, bool last);
  std::shared_ptr<Buffer> take_free_buffer();
  void complete(const std::shared_ptr<Object>& object);
  void record(Status st);

  ObjectStore& store_;
  const uint64_t default_part_bytes_;
  const size_t transfers_;
  uint64_t size_ = 0, fed_ = 0, part_bytes_ = 0;
  int next_part_ = 1;
  std::shared_ptr<Object> current_;  // being fed (null between objects)
  std::shared_ptr<Buffer> filling_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Buffer>> free_;
  std::vector<std::shared_ptr<Object>> objects_;  // every object begun
  size_t in_flight_ = 0;  // transfers (parts, puts, completions) queued or running
  uint64_t parts_sent_ = 0;
  Status error_;
  TaskPool pool_;  // last: its threads are joined before the state above goes
};

}  // namespace fastpersist::checkpoint
