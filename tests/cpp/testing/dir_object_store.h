// SPDX-License-Identifier: Apache-2.0
// An ObjectStore (object_store.h) kept in a local directory, for the C++ tests of object tiers:
// keys are files under the directory, a multipart upload is a folder of parts joined on
// completion. The real store (SeaweedFS's S3, through boto3) is tested from Python; this one
// adds fault injection (a store that goes away, a key that fails) and counts what was asked of
// it (parts in flight at once).
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "fastpersist/object_store.h"

namespace fastpersist::testing {

class DirObjectStore final : public ObjectStore {
 public:
  DirObjectStore(std::string dir, std::string url);

  std::string url() const override { return url_; }
  Result<std::vector<ObjectEntry>> list(const std::string& prefix) override;
  Status get(const std::string& key, uint64_t offset, std::span<std::byte> into) override;
  Status put(const std::string& key, std::span<const std::byte> data) override;
  Result<std::string> begin_upload(const std::string& key) override;
  Result<std::string> upload_part(const std::string& key, const std::string& upload_id,
                                  int part_number, std::span<const std::byte> data) override;
  Status complete_upload(const std::string& key, const std::string& upload_id,
                         const std::vector<std::string>& etags) override;
  Status abort_upload(const std::string& key, const std::string& upload_id) override;
  Result<uint64_t> abort_uploads(const std::string& prefix) override;
  Status remove(const std::vector<std::string>& keys) override;

  // Faults: every call fails (kIoError, "connection refused") while `unreachable` is set; a put,
  // part or get of a key containing `fail_key` fails.
  std::atomic<bool> unreachable{false};
  // Memory runs out inside the store's client: list() throws std::bad_alloc while set.
  std::atomic<bool> out_of_memory{false};
  std::string fail_key;                     // set before use
  std::chrono::milliseconds part_delay{0};  // each upload_part sleeps this long
  // A lying listing: list() reports each manifest.json this many bytes larger than it is.
  std::atomic<uint64_t> manifest_size_lie{0};

  // What was asked.
  std::atomic<int> parts_in_flight{0};
  std::atomic<int> most_parts_in_flight{0};
  std::atomic<uint64_t> parts_uploaded{0};
  std::atomic<uint64_t> puts{0};
  std::atomic<uint64_t> largest_get{0};     // the most bytes one get() asked for
  std::vector<std::string> open_uploads();  // "key upload-id" of unfinished uploads

  // The object's bytes ("" when absent); writes an object directly (damage, debris).
  std::string read(const std::string& key) const;
  void write(const std::string& key, const std::string& bytes);

 private:
  Status check(const std::string& key) const;
  std::string path_of(const std::string& key) const;

  const std::string dir_;
  const std::string url_;
  std::mutex mu_;
  std::map<std::string, std::string> uploads_;  // upload id -> key
  uint64_t next_upload_ = 1;
};

}  // namespace fastpersist::testing
