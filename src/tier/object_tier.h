// SPDX-License-Identifier: Apache-2.0
// A tier in an object store (object_store.h; private to src/checkpoint): the same checkpoints
// as a directory tier, laid out as objects, committed by the manifest uploaded last.
//
//   TAG/<file>            every own file of checkpoint TAG, uploaded first (multipart, parts
//                         in parallel), each checked against the local manifest as it streams
//   TAG/manifest.json     the local manifest's bytes, uploaded once every file is there: the
//                         commit marker (a reader lists a checkpoint exactly when it exists)
//   latest                the newest checkpoint's tag, written after each commit (informative:
//                         readers list the manifests)
//
// Removing a checkpoint deletes its manifest first, so it stops being listed before any of its
// files goes. A drain that died leaves objects without a manifest, and perhaps an unfinished
// multipart upload: the next upload of that tag removes both first, and a scan never lists them.
// One drainer per tier: an object store has no lock (docs/tiers.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/root_scan.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/io_engine.h"
#include "fastpersist/object_store.h"
#include "fastpersist/tier.h"
#include "tier/tier_copy.h"

namespace fastpersist::checkpoint {

inline constexpr const char* kObjectLatestKey = "latest";

struct ObjectTransfer {
  uint64_t part_bytes = uint64_t{32} << 20;  // each part of an upload, each ranged read
  unsigned transfers = 8;                    // parts in flight at once
};

class ObjectTier {
 public:
  ObjectTier(std::shared_ptr<ObjectStore> store, ObjectTransfer transfer);

  const std::string& url() const { return url_; }
  ObjectStore& store() { return *store_; }
  const ObjectTransfer& transfer() const { return transfer_; }

  // The committed checkpoints (oldest to newest, as scan_root orders them) and the damaged ones:
  // a manifest that does not decode, or a file it names that is missing or of another size.
  // Objects without a manifest are not checkpoints (a drain in progress, or one that died).
  Result<RootScan> scan();
  Result<std::vector<CheckpointInfo>> list();

  // The manifest of TAG, checked (decode_manifest: untrusted input). kNotFound when TAG is not
  // committed there.
  Result<Manifest> read_manifest(const std::string& tag);
  // Its bytes, not decoded (kDataLoss when larger than any manifest fastpersist writes).
  Result<std::string> read_manifest_bytes(const std::string& tag);

  // Uploads <local_root>/<tag> (streamed once through `read_engine`, every checksum checked on
  // the way, as copy_checkpoint does), then its manifest, then `latest`. {copied = false} when
  // the tier has it already. Bases of an incremental checkpoint must be there first (kDataLoss
  // otherwise, before anything is uploaded). Errors as copy_checkpoint's; on failure the tier is
  // left without the checkpoint (its objects removed, its uploads aborted, best effort).
  Result<CopyResult> upload(const std::string& local_root, const std::string& tag,
                            IoEngine& read_engine, const CopyPacer& pacer = {});

  // Downloads TAG into `destination` (a manager's root: begin_commit, ranged reads in parallel,
  // every file checked like `verify` before the commit). {copied = false} when the destination
  // has it already. The destination must hold the checkpoint's bases.
  Result<CopyResult> download(const std::string& tag, CheckpointManager& destination,
                              IoEngine& check_engine);

  // Removes TAG: its manifest first, then its files. kBusy when a kept checkpoint references
  // it; kNotFound when it is not there.
  Status remove(const std::string& tag);

  // The tier's retention (decide_retention, with keep_last / keep_every): removes what the
  // policy removes, oldest first, and returns the tags removed.
  Result<std::vector<std::string>> apply_retention(std::optional<unsigned> keep_last,
                                                   std::optional<int64_t> keep_every);

  // Removes each of `tags` in order (what a retention decision chose), each manifest first, then
  // rewrites `latest`.
  Status remove_all(const std::vector<std::string>& tags);

  // Removes the objects of checkpoints that were never committed (no manifest) and every
  // unfinished multipart upload: what drains that died left. Returns the objects removed.
  Result<uint64_t> remove_debris();

 private:
  Result<std::string> fetch_manifest(const std::string& tag, uint64_t size);
  Status write_latest();
  Status clear_uncommitted(const std::string& tag);

  std::shared_ptr<ObjectStore> store_;
  ObjectTransfer transfer_;
  std::string url_;
};

// Checks TAG of `tier` as `fastpersist verify` checks a local checkpoint: its files and those it
// references are fetched into a private folder under `scratch` (removed afterwards; it needs
// room for them), then verify_checkpoint runs there. A manifest that does not decode is a
// problem of the report; kNotFound when TAG is not committed there.
Result<VerifyReport> verify_object_checkpoint(ObjectTier& tier, const std::string& tag,
                                              const std::string& scratch, IoEngine& engine);

// The object tier a TierOptions names (its store, or open_object_store(path)).
Result<std::unique_ptr<ObjectTier>> open_object_tier(const TierOptions& tier);

}  // namespace fastpersist::checkpoint
