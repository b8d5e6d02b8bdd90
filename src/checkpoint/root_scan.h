// SPDX-License-Identifier: Apache-2.0
// One pass over a checkpoint root: the committed checkpoints (what list_checkpoints returns) and
// the damaged ones, with what their manifests still tell (private to src/checkpoint).
//
// A damaged checkpoint is a directory with a valid tag name and a manifest.json whose checks
// fail: the manifest does not decode, or a file it names is missing or has the wrong size. When
// the manifest decodes, its commit sequence and step are known, which is what retention needs to
// tell whether it is older than every checkpoint it keeps, and what a manager needs so that it
// never hands out a sequence number a damaged checkpoint already carries.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fastpersist/checkpoint.h"
#include "fastpersist/manifest.h"
#include "fastpersist/status.h"

namespace fastpersist::checkpoint {

struct DamagedCheckpoint {
  std::string tag;
  std::string reason;
  std::optional<uint64_t> sequence;  // from its manifest, when the manifest decodes
  std::optional<int64_t> step;
  std::vector<std::string> references =
      {};  // from its manifest, when it decodes (CheckpointInfo's)
};

struct RootScan {
  std::vector<CheckpointInfo> committed;   // oldest to newest: sequence, then tag
  std::vector<DamagedCheckpoint> damaged;  // in name order
  // The highest commit sequence any manifest under the root records (0: none).
  uint64_t highest_sequence() const;
};

Result<RootScan> scan_root(const std::string& root);

// What list_checkpoints says of a committed checkpoint TAG with manifest `m`.
CheckpointInfo info_of(const std::string& tag, const Manifest& m);
// A damaged checkpoint TAG, with what its manifest still tells when it decodes.
DamagedCheckpoint damaged_of(const std::string& tag, std::string reason, const Result<Manifest>& m);

// The checkpoints whose files a manifest references (the tags of its "<tag>/<file>" names), in
// name order, each once.
std::vector<std::string> referenced_tags(const Manifest& manifest);

// The checkpoints of `scan` (committed or damaged) that reference `tag`, in scan order.
std::vector<std::string> referencing(const RootScan& scan, const std::string& tag);

}  // namespace fastpersist::checkpoint
