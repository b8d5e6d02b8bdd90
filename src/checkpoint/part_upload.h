// SPDX-License-Identifier: Apache-2.0
// One object written in parts (private to src/checkpoint): bytes fed in order are cut into parts
// that go up `transfers` at a time on threads of their own, while the caller reads the next
// bytes. An object no larger than one part is one put. The part buffers are reused from object
// to object (fresh memory is slow to fault in).
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

// S3 takes at most 10,000 parts per object: a larger file gets larger parts.
inline constexpr uint64_t kMaxPartsPerObject = 10000;

class PartUploader {
 public:
  PartUploader(ObjectStore& store, uint64_t part_bytes, unsigned transfers);
  ~PartUploader();  // aborts an object still open
  PartUploader(const PartUploader&) = delete;
  PartUploader& operator=(const PartUploader&) = delete;

  // Starts object `key`, of `size` bytes in all (sets the part size). kInvalidArgument while
  // another object is open.
  Status begin(const std::string& key, uint64_t size);
  // The next bytes of the object. Returns the first error of any part so far.
  Status feed(const std::byte* data, size_t bytes);
  // Sends the rest, waits for every part and completes the object (or puts it whole). On an
  // error the upload is aborted and the error returned.
  Status finish();
  // Abandons the object: waits for the parts in flight and aborts the upload. Idempotent.
  void abort();

  uint64_t parts_sent() const { return parts_sent_; }

 private:
  struct Buffer {
    std::vector<std::byte> bytes;
    size_t used = 0;
  };
  Status send_full_buffer();
  std::unique_ptr<Buffer> take_free_buffer();
  void wait_in_flight();

  ObjectStore& store_;
  const uint64_t default_part_bytes_;
  TaskPool pool_;
  std::string key_;
  uint64_t size_ = 0, fed_ = 0, part_bytes_ = 0;
  bool open_ = false;
  std::string upload_id_;  // empty until the first full part
  int next_part_ = 1;
  uint64_t parts_sent_ = 0;
  std::unique_ptr<Buffer> filling_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Buffer>> free_;
  std::vector<std::string> etags_;  // by part number - 1
  size_t in_flight_ = 0;
  Status error_;
};

}  // namespace fastpersist::checkpoint
