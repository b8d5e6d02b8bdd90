// SPDX-License-Identifier: Apache-2.0
// Object stores (S3 and its kin) as tiers (tier.h, docs/tiers.md). fastpersist speaks no object-
// store protocol itself: a client library does (the Python package plugs boto3 in,
// python/fastpersist/object_store.py). The core asks a store for a handful of primitive
// operations and does everything else itself: which checkpoints a tier gets, splitting files
// into parts, how many transfers run at once, checking every checksum on the way, the commit
// order, retention and pulls.
//
// A store is one bucket and key prefix ("s3://bucket/run1"). Keys handed to it are relative to
// that prefix: '/'-separated, never empty, never starting with '/', never with a "." or ".."
// segment (ObjectStore::check_key). A checkpoint TAG of the tier lives under "TAG/", its
// manifest last at "TAG/manifest.json", which is the commit marker: an object store has no
// atomic rename, so a checkpoint exists for every reader exactly when its manifest object does.
//
// Thread-safety: every method may be called from several threads at once (parallel parts).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fastpersist/status.h"

namespace fastpersist {

struct ObjectEntry {
  std::string key;  // relative to the store's prefix
  uint64_t size = 0;
};

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;

  // "s3://bucket/prefix": names the store in messages and listings, and is the tier's path.
  virtual std::string url() const = 0;

  // Every object whose key starts with `prefix` ("" for all), in any order.
  virtual Result<std::vector<ObjectEntry>> list(const std::string& prefix) = 0;
  // Fills `into` with the object's bytes [offset, offset + into.size()). kNotFound when the key
  // does not exist; kDataLoss when the object ends first.
  virtual Status get(const std::string& key, uint64_t offset, std::span<std::byte> into) = 0;
  // Stores `data` as the whole object `key` (replacing it).
  virtual Status put(const std::string& key, std::span<const std::byte> data) = 0;

  // Multipart uploads, for objects larger than a part: begin, parts 1..N (every part but the
  // last at least 5 MiB on S3), then complete with the parts' ETags in order, or abort.
  virtual Result<std::string> begin_upload(const std::string& key) = 0;
  virtual Result<std::string> upload_part(const std::string& key, const std::string& upload_id,
                                          int part_number, std::span<const std::byte> data) = 0;
  virtual Status complete_upload(const std::string& key, const std::string& upload_id,
                                 const std::vector<std::string>& etags) = 0;
  virtual Status abort_upload(const std::string& key, const std::string& upload_id) = 0;
  // Aborts every unfinished multipart upload under `prefix` (those of a drain that died), so
  // the store stops keeping their parts. Returns how many.
  virtual Result<uint64_t> abort_uploads(const std::string& prefix) = 0;

  // Deletes the objects; keys that do not exist are no error.
  virtual Status remove(const std::vector<std::string>& keys) = 0;

  // kInvalidArgument unless `key` is a well-formed relative key (see the file comment).
  static Status check_key(std::string_view key);
};

// Whether `path` names an object store ("scheme://..."), not a directory.
bool is_object_store_url(std::string_view path);

// Opens the store a URL names, through the opener the process installed (the Python package
// installs one for "s3://" URLs, built on boto3). kUnavailable when no opener is installed (a
// plain C++ program, or the `fastpersist` tool, which then hands the command to Python), or
// the opener's error.
using ObjectStoreOpener =
    std::function<Result<std::shared_ptr<ObjectStore>>(const std::string& url)>;
void set_object_store_opener(ObjectStoreOpener opener);
Result<std::shared_ptr<ObjectStore>> open_object_store(const std::string& url);
bool object_store_opener_installed();

}  // namespace fastpersist
