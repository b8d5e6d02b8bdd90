// SPDX-License-Identifier: Apache-2.0
// Tiers: more places a committed checkpoint lives (docs/tiers.md). A CheckpointManager with
// tiers saves into its local root at full speed, as always; a background thread then copies
// ("drains") each committed checkpoint that a tier's policy selects into that tier:
//
//   - the tier is itself a checkpoint root (same layout, same commit protocol, its own lock and
//     retention), so every reader, `fastpersist list/verify/prune` included, works on it; the
//     drainer holds the tier's lock only while a pass copies (another holder: kBusy, retried);
//   - the copy reads the local files once, with direct reads, checking every checksum on the
//     way, and writes them into the tier's temporary directory; then the tier commits it with
//     the manifest last, exactly as a save: a tier never shows a partial checkpoint;
//   - a drain that dies (crash, SIGKILL) leaves only a temporary directory, which the next
//     drainer removes before it copies that checkpoint again; checkpoints already in the tier
//     are never copied again;
//   - a checkpoint selected for a tier is pinned locally until it is there (local retention
//     and remove() skip it), unless `pin_until_drained` is off;
//   - a failed drain never fails a local save: it is retried (after 1 s, doubling up to 60 s,
//     and after every new commit) and reported by the next save (PendingSave::tier_errors) and
//     by wait_drains() / close().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fastpersist/object_store.h"
#include "fastpersist/status.h"

namespace fastpersist {

// Object stores (object_store.h): a tier whose path is a URL ("s3://bucket/run1") is a bucket
// prefix, opened with open_object_store() unless `store` is given. Each file goes up in parts of
// `part_bytes`, `transfers` parts at once (multipart uploads); pulls read the same way, in
// ranged reads. The manifest uploaded last is the commit marker.
inline constexpr uint64_t kDefaultTierPartBytes = uint64_t{32} << 20;
inline constexpr uint64_t kMinTierPartBytes = uint64_t{5} << 20;  // S3's smallest part
inline constexpr uint64_t kMaxTierPartBytes = uint64_t{5} << 30;  // S3's largest part
inline constexpr unsigned kDefaultTierTransfers = 8;
inline constexpr unsigned kMaxTierTransfers = 64;

struct TierOptions {
  // A directory, usually on another filesystem (created), or an object store's URL.
  std::string path;
  std::optional<unsigned> keep_last;  // the tier's own retention (as CheckpointOptions')
  std::optional<int64_t> keep_every;
  // Which checkpoints go there: those whose step is a multiple of `every` (checkpoints without
  // a step then stay local); nullopt: every committed checkpoint.
  std::optional<int64_t> every;
  uint64_t bandwidth_bytes_per_second = 0;  // the drain's cap (0: none)
  // Object stores only (ignored for a directory).
  std::shared_ptr<ObjectStore> store;  // null: open_object_store(path)
  uint64_t part_bytes = kDefaultTierPartBytes;
  unsigned transfers = kDefaultTierTransfers;

  bool is_object_store() const { return store != nullptr || is_object_store_url(path); }

  // kInvalidArgument: an empty path, keep_last 0, keep_every or every below 1, part_bytes
  // outside [5 MiB, 5 GiB], transfers outside [1, 64].
  Status validate() const;
};

// Where one tier stands (CheckpointManager::tier_states()).
struct TierState {
  std::string path;
  std::string draining;              // the tag being copied now ("" when idle)
  std::vector<std::string> waiting;  // selected, not yet in the tier, oldest first
  std::string last_drained;          // the newest tag this manager copied there
  uint64_t checkpoints_drained = 0;  // since the manager opened
  uint64_t bytes_drained = 0;
  double seconds_draining = 0;  // time spent copying them
  Status last_error;            // of the latest attempt (OK when it succeeded)
};

}  // namespace fastpersist
